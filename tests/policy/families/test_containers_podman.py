"""The containers family against real podman containers: images built here from a tar (busybox, no registry) with
NVIDIA's and AMD's markers, running while the host's /proc is read as the apt hook reads it.

podman runs with runc, cgroupfs, vfs storage and a private root under the test's directory (this machine's cgroups
are hybrid, which crun refuses), so nothing of the machine's own container storage is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from agent.hostfacts.context import CONTAINERS, read_host_context
from agent.policy.compiled import CompiledPolicy
from agent.policy.evaluate import evaluate
from agent.policy.families import HostState
from tests import needs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BUSYBOX = "/bin/busybox"
POLICY = CompiledPolicy({"name": "t", "action": "block", "kernel_packages": [], "guarded": [],
                         "containers": {"action": None}})
ON_575 = {"nvidia-driver-575": "575.57.08-0ubuntu1", "libnvidia-compute-575": "575.57.08-0ubuntu1"}
TO_570 = {"nvidia-driver-570": "570.195.03-0ubuntu1", "libnvidia-compute-570": "570.195.03-0ubuntu1"}


def in_a_mount_point_root() -> List[str]:
    """What podman runs under: nothing on a machine; inside a chroot (fresh-debian12), whose root is a plain
    directory that podman's layer unpacking cannot make private ("remount /: invalid argument"), a mount namespace
    of its own where that root is bound (with its submounts) under /mnt and entered there, so that it is a mount
    point. The containers keep that namespace; their processes are seen in this /proc as any container's are."""
    if subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=30,
                      check=False).returncode == 0:
        return []
    return ["unshare", "--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c",
            'mkdir -p /mnt/gpuguard-podman-root && mount --rbind / /mnt/gpuguard-podman-root && '
            'cd /mnt/gpuguard-podman-root && exec chroot . "$@"', "sh"]


class Podman:
    """podman with its own root and runroot under a test directory."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.argv = ["podman", "--root", str(base / "storage"), "--runroot", str(base / "run"), "--storage-driver",
                     "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file", "--runtime", "runc"]

    def __call__(self, *args: str) -> str:
        done = subprocess.run([*in_a_mount_point_root(), *self.argv, *args], capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr[-2000:]}"
        return done.stdout.strip()

    def image(self, name: str, env: Dict[str, str], files: Dict[str, str]) -> None:
        """An image of busybox (``sleep``) plus ``files``, with ``env`` as its ENV."""
        root = self.base / f"root-{name}"
        (root / "bin").mkdir(parents=True)
        shutil.copy2(BUSYBOX, root / "bin" / "busybox")
        (root / "bin" / "sleep").symlink_to("busybox")
        for path, text in files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        tar = self.base / f"{name}.tar"
        with tarfile.open(tar, "w") as archive:
            archive.add(root, arcname=".")
        changes: List[str] = []
        for key, value in env.items():
            changes += ["--change", f"ENV {key}={value}"]
        self("import", *changes, "--change", 'CMD ["/bin/sleep", "600"]', str(tar), f"localhost/{name}:1")

    def run(self, name: str) -> str:
        """A detached container of the image; its full id."""
        return self("run", "-d", "--name", f"gg-{name}", "--network", "none", "--ulimit", "nofile=1024:1024",
                    "--ulimit", "nproc=1024:1024", f"localhost/{name}:1")


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    if os.geteuid() != 0:
        needs.unavailable("podman container tests", "they must run as root")
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    if missing or not Path(BUSYBOX).exists():
        needs.unavailable("podman container tests", f"missing {missing or BUSYBOX} (apt-get install podman runc "
                                                    "busybox-static)")
    pm = Podman(tmp_path_factory.mktemp("podman"))
    try:
        yield pm
    finally:
        subprocess.run([*in_a_mount_point_root(), *pm.argv, "rm", "-f", "-t", "0", "--all"], capture_output=True,
                       timeout=120, check=False)


def running_ids() -> Dict[str, object]:
    return {s.container_id: s for s in read_host_context("/", [CONTAINERS]).containers}


def test_a_driver_move_that_a_running_cuda_image_cannot_use_is_refused_naming_it(podman: Podman) -> None:
    """A running image that needs CUDA 12.9 is read from /proc and named when the driver would move to 570."""
    podman.image("cuda129", {"CUDA_VERSION": "12.9.1",
                             "NVIDIA_REQUIRE_CUDA": "cuda>=12.9 brand=tesla,driver>=535,driver<536"}, {})
    full = podman.run("cuda129")
    stack = running_ids().get(full[:12])
    assert stack is not None, f"container {full[:12]} not seen in /proc"
    assert (stack.runtime, stack.require_cuda, stack.cuda_version) == ("podman", "12.9", "12.9")
    found = [v.message for v in evaluate(HostState(ON_575, TO_570, "dpkg", read_host_context("/", [CONTAINERS])),
                                         POLICY)]
    assert any(f"podman container {full[:12]}" in m and "needs CUDA 12.9" in m for m in found), found
    podman("rm", "-f", "-t", "0", "gg-cuda129")
    assert full[:12] not in running_ids()


def test_an_unrelated_image_and_a_rocm_image_without_the_matrix_do_not_block(podman: Podman) -> None:
    """A container without GPU user space is not listed; a ROCm image is listed with its release, and without
    AMD's matrix in the policy a driver move is not refused for it."""
    podman.image("plain", {"LANG": "C.UTF-8"}, {})
    podman.image("rocm643", {}, {"/opt/rocm-6.4.3/.info/version": "6.4.3-120\n"})
    plain, rocm = podman.run("plain"), podman.run("rocm643")
    seen = running_ids()
    assert plain[:12] not in seen
    assert getattr(seen.get(rocm[:12]), "rocm_release", None) == "6.4.3"
    state = HostState(ON_575, TO_570, "dpkg", read_host_context("/", [CONTAINERS]))
    assert [v.message for v in evaluate(state, POLICY) if f"container {plain[:12]}" in v.message] == []
    assert [v for v in evaluate(state, POLICY) if v.rule == "containers.rocm"] == []
