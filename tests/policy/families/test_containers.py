"""The containers family: a driver change judged against the running containers' CUDA and ROCm user space, and
the /proc reader that finds them (real podman containers in tests/policy/families/test_containers_podman.py)."""

from __future__ import annotations

from typing import Dict, List, Sequence

import pytest

from agent.hostfacts.containers import ContainerStack, container_of, parse_environ, require_cuda_of
from agent.hostfacts.context import HostContext
from agent.policy.compiled import CompiledPolicy
from agent.policy.evaluate import evaluate
from agent.policy.families import HostState
from agent.policy.families.containers import cuda_supported

ID = "879fcadeed05ef2ae58191eb902ef80c3bf919cc23d90a7fd4042eda9b834cee"


@pytest.mark.parametrize("cgroup, found", [
    (f"0::/system.slice/docker-{ID}.scope\n", ("docker", ID[:12])),
    (f"12:pids:/docker/{ID}\n", ("docker", ID[:12])),
    (f"9:name=systemd:/libpod_parent/libpod-{ID}\n", ("podman", ID[:12])),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b.slice/cri-containerd-{ID}.scope\n",
     ("containerd", ID[:12])),
    (f"0::/kubepods/besteffort/pod0c3e4f5a-1111-2222-3333-444455556666/{ID}\n", ("kubernetes", ID[:12])),
    (f"0::/machine.slice/crio-{ID}.scope\n", ("cri-o", ID[:12])),
    ("0::/user.slice/user-0.slice/session-3.scope\n", None),
    ("0::/system.slice/docker-notanid.scope\n", None),
])
def test_the_container_of_a_process_comes_from_its_cgroup(cgroup: str, found: object) -> None:
    """docker, podman, containerd/CRI, kubepods and CRI-O cgroup paths give the runtime and the short id."""
    assert container_of(cgroup) == found


def test_the_image_environment_gives_the_cuda_it_needs() -> None:
    """NVIDIA_REQUIRE_CUDA's lowest cuda>= alternative; brand/driver exceptions are not what a move up needs."""
    env = parse_environ("PATH=/usr/bin\0CUDA_VERSION=12.8.1\0NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=tesla,"
                        "driver>=535,driver<536\0HOME=/root\0")
    assert env == {"CUDA_VERSION": "12.8.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8 brand=tesla,driver>=535,driver<536"}
    assert require_cuda_of(env["NVIDIA_REQUIRE_CUDA"]) == "12.8"
    assert require_cuda_of("cuda>=13.0 cuda>=12.9") == "12.9"
    assert require_cuda_of("brand=tesla") is None


@pytest.mark.parametrize("driver, cuda", [("580.159.04", "13.0"), ("570.195.03", "12.8"), ("565.57.01", "12.7"),
                                          ("535.261.03", "12.2"), ("620.10", "13.1"), ("440.1", None),
                                          ("junk", None)])
def test_each_driver_branch_supports_the_cuda_of_nvidias_table(driver: str, cuda: object) -> None:
    """A branch gives its CUDA release; one newer than the table gives the last row; older or unreadable: None."""
    assert cuda_supported(driver) == cuda


POLICY = CompiledPolicy({"name": "t", "action": "block", "kernel_packages": [], "guarded": [],
                         "containers": {"action": None}})
NEEDS_129 = ContainerStack("podman", "aaaaaaaaaaaa", 4242, "12.9", "12.9", None)
NO_GPU = ContainerStack("docker", "bbbbbbbbbbbb", 4343, None, None, None)


def judged(before: Dict[str, str], after: Dict[str, str], stacks: Sequence[ContainerStack],
           policy: CompiledPolicy = POLICY) -> List[str]:
    state = HostState(before, after, "dpkg", HostContext(containers=stacks))
    return [f"{v.rule}: {v.message}" for v in evaluate(state, policy)]


def test_a_driver_downgrade_below_a_running_images_cuda_is_refused_naming_it() -> None:
    """570 supports CUDA 12.8: a container that needs 12.9 is named; the move to 580 (CUDA 13.0) is allowed."""
    on_575 = {"nvidia-driver-575": "575.57.08-0ubuntu1"}
    found = judged(on_575, {"nvidia-driver-570": "570.195.03-0ubuntu1"}, [NEEDS_129])
    assert found == ["containers.cuda: NVIDIA driver 570.195.03 supports CUDA 12.8, which running containers cannot "
                     "use: podman container aaaaaaaaaaaa (pid 4242) needs CUDA 12.9"]
    assert judged(on_575, {"nvidia-driver-580": "580.159.04-0ubuntu1"}, [NEEDS_129]) == []


def test_forward_compatibility_and_unrelated_containers_do_not_block() -> None:
    """A host cuda-compat-12-9 package lets 570 run a 12.9 image; a container without GPU user space never counts."""
    before = {"nvidia-driver-575": "575.57.08-0ubuntu1", "cuda-compat-12-9": "575.57.08-1"}
    after = {"nvidia-driver-570": "570.195.03-0ubuntu1", "cuda-compat-12-9": "575.57.08-1"}
    assert judged(before, after, [NEEDS_129]) == []
    assert judged({"nvidia-driver-575": "575.57.08-1"}, {"nvidia-driver-570": "570.195.03-1"}, [NO_GPU]) == []


def test_removing_the_driver_under_a_cuda_container_is_refused_and_no_move_is_not_judged() -> None:
    """Removing the driver leaves no CUDA at all; a transaction that leaves the driver alone is never judged."""
    found = judged({"nvidia-driver-580": "580.159.04-1"}, {}, [NEEDS_129])
    assert found and "removes the NVIDIA driver" in found[0]
    same = {"nvidia-driver-570": "570.195.03-1"}
    assert judged(same, {**same, "vim": "2:9.1-1"}, [NEEDS_129]) == []


def test_a_rocm_image_is_judged_by_amds_matrix_on_the_new_amdgpu_driver() -> None:
    """With the matrix compiled in, an amdgpu move whose driver does not support the image's ROCm is refused."""
    policy = CompiledPolicy({**POLICY.data, "matrix": {"driver_rocm": {"6.4": ["6.3", "6.4"], "7.1": ["7.0", "7.1"]},
                                                       "rocm": {}}})
    image = ContainerStack("docker", "cccccccccccc", 77, None, None, "6.4.3")
    found = judged({"amdgpu-dkms": "1:6.12.12.60403-2187215.24.04"}, {"amdgpu-dkms": "1:6.14.14.70100-1.24.04"},
                   [image], policy=CompiledPolicy({k: v for k, v in policy.data.items()}))
    assert any(f.startswith("containers.rocm:") and "needs ROCm 6.4.3" in f for f in found), found
    assert not any(f.startswith("containers.rocm:") for f in judged(
        {"amdgpu-dkms": "1:6.12.12.60403-2187215.24.04"}, {"amdgpu-dkms": "1:6.12.12.60403-2187215.24.04"}, [image],
        policy=policy))
