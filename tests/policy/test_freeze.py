"""``policy freeze`` as a pure renderer: host facts in, commented policy TOML out; the result loads, compiles and
accepts the host it was frozen from, and refuses every driver, ROCm, CUDA and kernel move."""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest

from agent.hostfacts.context import HostContext
from agent.policy.compiled import CompiledPolicy
from agent.policy.evaluate import HostState, evaluate
from agent.policy.freeze import FreezeFacts, FreezeOptions, FreezeRefused, kernel_series, render_freeze
from agent.policy.load import load_and_compile

D62 = "1:6.8.5.60202-2041575.22.04"
ROCM_622 = "6.2.2.60202-116~22.04"
AMD: Dict[str, str] = {"amdgpu-dkms": D62, "amdgpu-dkms-firmware": D62, "rocm-core": ROCM_622,
                       "hip-runtime-amd": "6.2.41134.60202-116~22.04", "linux-image-6.8.0-45-generic": "6.8.0-45.45",
                       "linux-image-6.8.0-40-generic": "6.8.0-40.40", "dkms": "3.0.11-1ubuntu13"}


def _loaded(**modules: str) -> HostContext:
    """A host context with only these loaded modules (name=version)."""
    return HostContext(loaded_drivers=modules)


AMD_FACTS = FreezeFacts(installed=AMD, running_kernel="6.8.0-45-generic",
                        context=HostContext("ubuntu", "22.04", loaded_drivers={"amdgpu": "6.8.5"}),
                        hostname="mi300x-a", date="2026-12-03")
# The real H200 (docs/hardware.md): the driver comes with no package, CUDA 13.0 from NVIDIA's cuda-* packages.
H200: Dict[str, str] = {"cuda-cudart-13-0": "13.0.96-1", "cuda-toolkit-13-0": "13.0.2-1",
                        "linux-image-6.8.0-87-generic": "6.8.0-87.88"}
H200_FACTS = FreezeFacts(installed=H200, running_kernel="6.8.0-87-generic",
                         context=HostContext("ubuntu", "24.04", loaded_drivers={"nvidia": "580.159.04"}),
                         hostname="h200", date="2026-12-03")
NVIDIA_PARTS = {"nvidia-driver-580-open": "580.159.04-0ubuntu0.24.04.1", "nvidia-dkms-580-open":
                "580.159.04-0ubuntu0.24.04.1", "libnvidia-compute-580": "580.159.04-0ubuntu0.24.04.1"}
HEADER_TAIL = """\
# Save it as /etc/gpuguard/policy.d/50-freeze.toml, check it with `gpuguard policy check FILE`, then run
# `gpuguard policy compile` and `gpuguard pin apply`. Files in policy.d merge: pairings of other files
# are alternatives to the ones here, so keep this the only file that has pairings.

[policy]  # the whole policy
"""
POLICY_KEYS = """\
action = "block"  # a violating apt or dnf transaction is refused before anything changes (rollback would also \
undo what bypasses them, e.g. dpkg -i)
failsafe = "block-guarded"  # without a readable compiled policy, changes to guarded packages are refused
"""

AMD_EXPECTED = f"""\
# gpuguard policy 'freeze-mi300x-a': host mi300x-a (ubuntu 22.04) frozen as it was on 2026-12-03 by \
`gpuguard policy freeze`.
# It pins the amdgpu driver and ROCm at their installed builds, and the kernels; any other build is refused.
{HEADER_TAIL}name = "freeze-mi300x-a"  # shown in every refusal and by policy explain
{POLICY_KEYS}guarded = [  # installed now and named by no rule below: the fail-safe protects them, the known-good \
set holds them
  "dkms",  # installed 3.0.11-1ubuntu13
]

[amd]  # the amdgpu driver and ROCm
driver_package = "amdgpu-dkms"  # its version carries the driver release (1:6.8.5.60202-... is 6.2.2)
rocm_package = "rocm-core"  # its version carries the ROCm release (TheRock's amdrocm-base<release> is judged beside it)

[[amd.pairing]]  # the one allowed pairing: the installed one
name = "frozen"  # named in refusals
amdgpu = "6.2.2"  # driver release 6.2.2 (amdgpu-dkms 1:6.8.5.60202-2041575.22.04, loaded module 6.8.5)
rocm = "6.2.2"  # ROCm release (rocm-core 6.2.2.60202-116~22.04)
amdgpu_package = "1:6.8.5.60202-2041575.22.04"  # this exact build: any other driver build is refused \
(amdgpu-dkms-firmware must stay at the same build)
rocm_package = "6.2.2.60202-116~22.04"  # this exact build of rocm-core: any other ROCm build is refused
kernels = ["6.8.0-40-generic", "6.8.0-45-generic"]  # the kernels DKMS builds this driver for (as [kernel] allow \
below)

[kernel]  # kernels: new ones must be on this list (those installed stay allowed)
allow = [  # any other kernel is refused
  "6.8.0-40-generic",  # installed (linux-image-6.8.0-40-generic 6.8.0-40.40)
  "6.8.0-45-generic",  # running, installed (linux-image-6.8.0-45-generic 6.8.0-45.45)
]

[frozen]  # must not move at all: no upgrade, downgrade, reinstall at another build or removal
packages = [  # the rest of the GPU stack, at the builds installed now
  "hip-runtime-amd",  # installed 6.2.41134.60202-116~22.04
]

[containers]  # a driver change must leave running containers' CUDA/ROCm user space usable
# 0 running container(s) with GPU user space now
"""

H200_EXPECTED = f"""\
# gpuguard policy 'freeze-h200': host h200 (ubuntu 24.04) frozen as it was on 2026-12-03 by \
`gpuguard policy freeze`.
# It pins the NVIDIA driver and CUDA at their installed builds, and the kernels; any other build is refused.
{HEADER_TAIL}name = "freeze-h200"  # shown in every refusal and by policy explain
{POLICY_KEYS}
[nvidia]  # the NVIDIA driver and CUDA

[[nvidia.pairing]]  # the one allowed pairing: the installed one
name = "frozen"  # named in refusals
driver = "580.159.04"  # driver release 580.159.04 (no package carries it: the loaded nvidia module is judged)
cuda = ["13.0.2", "13.0.96"]  # every CUDA release installed (cuda-cudart-13-0 13.0.96-1, cuda-toolkit-13-0 \
13.0.2-1)

[kernel]  # kernels: new ones must be on this list (those installed stay allowed)
allow = [  # any other kernel is refused
  "6.8.0-87-generic",  # running, installed (linux-image-6.8.0-87-generic 6.8.0-87.88)
]

[frozen]  # must not move at all: no upgrade, downgrade, reinstall at another build or removal
packages = [  # the rest of the GPU stack, at the builds installed now
  "cuda-cudart-13-0",  # installed 13.0.96-1
  "cuda-toolkit-13-0",  # installed 13.0.2-1
]

[containers]  # a driver change must leave running containers' CUDA/ROCm user space usable
# 0 running container(s) with GPU user space now
"""

H200_WIDE_EXPECTED = f"""\
# gpuguard policy 'h200-cuda13': host h200 (ubuntu 24.04) frozen as it was on 2026-12-03 by \
`gpuguard policy freeze`.
# It pins the NVIDIA driver and CUDA at their installed release series, and the kernels; widened to point releases \
and a kernel series.
{HEADER_TAIL}name = "h200-cuda13"  # shown in every refusal and by policy explain
{POLICY_KEYS}
[nvidia]  # the NVIDIA driver and CUDA

[[nvidia.pairing]]  # the one allowed pairing: the installed one
name = "frozen"  # named in refusals
driver = "580.*"  # driver branch 580 updates (now 580.159.04; no package carries it: the loaded nvidia module is \
judged)
cuda = "13.0.*"  # CUDA point releases (installed: cuda-cudart-13-0 13.0.96-1, cuda-toolkit-13-0 13.0.2-1)

[kernel]  # kernels: new ones must be on this list (those installed stay allowed)
allow = [  # kernels of these series only
  "6.8.0-*-generic",  # the series of 6.8.0-87-generic
]

[containers]  # a driver change must leave running containers' CUDA/ROCm user space usable
# 0 running container(s) with GPU user space now
"""

GPULESS_EXPECTED = f"""\
# gpuguard policy 'freeze-runner': host runner (debian 12) frozen as it was on 2026-12-03 by \
`gpuguard policy freeze`.
# No GPU driver was found (no amdgpu-dkms or ROCm package, no NVIDIA driver or CUDA package, no loaded nvidia \
module): it freezes the kernels only.
{HEADER_TAIL}name = "freeze-runner"  # shown in every refusal and by policy explain
{POLICY_KEYS}guarded = [  # installed now and named by no rule below: the fail-safe protects them, the known-good \
set holds them
  "linux-image-amd64",  # installed 6.1.115-1
]

[kernel]  # kernels: new ones must be on this list (those installed stay allowed)
allow = [  # any other kernel is refused
  "6.1.0-26-amd64",  # running, installed (linux-image-6.1.0-26-amd64 6.1.112-1)
  "6.1.0-27-amd64",  # installed (linux-image-6.1.0-27-amd64 6.1.115-1)
]
"""
GPULESS_FACTS = FreezeFacts(installed={"linux-image-6.1.0-26-amd64": "6.1.112-1",
                                       "linux-image-6.1.0-27-amd64": "6.1.115-1", "linux-image-amd64": "6.1.115-1"},
                            running_kernel="6.1.0-26-amd64", context=HostContext("debian", "12"), hostname="runner",
                            date="2026-12-03")


def _compiled(tmp_path: Path, text: str) -> CompiledPolicy:
    path = tmp_path / "50-freeze.toml"
    path.write_text(text)
    return load_and_compile(str(path))[1]


def _rules(policy: CompiledPolicy, facts: FreezeFacts, **moves: str) -> list:
    """The rules the installed set after ``moves`` (name=version, '' removes; '_' in names stands for '-') breaks."""
    after = dict(facts.installed)
    for name, version in moves.items():
        key = name.replace("_", "-")
        if version:
            after[key] = version
        else:
            after.pop(key, None)
    state = HostState(before=dict(facts.installed), after=after, manager=facts.manager, context=facts.context)
    return sorted({v.rule for v in evaluate(state, policy)})


@pytest.mark.parametrize(("facts", "options", "expected"), [
    (AMD_FACTS, FreezeOptions(), AMD_EXPECTED),
    (H200_FACTS, FreezeOptions(), H200_EXPECTED),
    (H200_FACTS, FreezeOptions(name="h200-cuda13", point_releases=True, kernel_series=True), H200_WIDE_EXPECTED),
    (GPULESS_FACTS, FreezeOptions(), GPULESS_EXPECTED),
], ids=["amd-exact", "h200-module-exact", "h200-module-widened", "gpuless"])
def test_the_rendered_policy_is_exactly_this_text(facts: FreezeFacts, options: FreezeOptions, expected: str) -> None:
    """Every line is commented; the pairing, kernels, frozen and guarded packages come from the facts."""
    assert render_freeze(facts, options) == expected


@pytest.mark.parametrize(("facts", "options"), [
    (AMD_FACTS, FreezeOptions()), (AMD_FACTS, FreezeOptions(point_releases=True, kernel_series=True)),
    (H200_FACTS, FreezeOptions()), (H200_FACTS, FreezeOptions(point_releases=True)),
    (FreezeFacts(installed={**H200, **NVIDIA_PARTS, "nvidia-container-toolkit": "1.17.8-1",
                            "cuda-compat-13-0": "580.95.05-0ubuntu1"}, context=_loaded(nvidia="580.159.04"),
                 running_kernel="6.8.0-87-generic"), FreezeOptions(point_releases=True)),
    (GPULESS_FACTS, FreezeOptions(kernel_series=True)),
])
def test_the_host_it_was_frozen_from_is_compliant(tmp_path: Path, facts: FreezeFacts, options: FreezeOptions) -> None:
    """The policy loads, compiles and has no violation for the installed set (loaded modules included)."""
    assert _rules(_compiled(tmp_path, render_freeze(facts, options)), facts) == []


def test_every_amd_driver_rocm_and_kernel_move_is_refused_and_unrelated_packages_pass(tmp_path: Path) -> None:
    """Another driver build of the same release, another ROCm build, a new kernel, a stack package: refused."""
    policy = _compiled(tmp_path, render_freeze(AMD_FACTS))
    d622_other = "1:6.8.5.60202-2041576.22.04"
    assert _rules(policy, AMD_FACTS, amdgpu_dkms=d622_other, amdgpu_dkms_firmware=d622_other) == ["amd.pairing"]
    assert _rules(policy, AMD_FACTS, amdgpu_dkms="1:6.10.5.60300-2084815.22.04",
                  amdgpu_dkms_firmware="1:6.10.5.60300-2084815.22.04") == ["amd.pairing"]
    assert _rules(policy, AMD_FACTS, rocm_core="6.2.2.60202-117~22.04") == ["amd.pairing"]
    assert _rules(policy, AMD_FACTS, rocm_core="6.2.4.60204-139~22.04") == ["amd.pairing"]
    assert _rules(policy, AMD_FACTS, amdgpu_dkms="") == ["amd.pairing"]
    assert _rules(policy, AMD_FACTS, hip_runtime_amd="6.2.41134.60202-117~22.04") == ["frozen"]
    assert _rules(policy, AMD_FACTS, **{"linux-image-6.8.0-49-generic": "6.8.0-49.49"}) == \
        ["amd.pairing.kernels", "kernel.allow"]
    assert _rules(policy, AMD_FACTS, vim="2:9.0.1378-2") == []


def test_point_releases_and_a_kernel_series_widen_the_amd_freeze(tmp_path: Path) -> None:
    """ROCm 6.2.4 with driver 6.2.4 and a 6.8.0 kernel pass; ROCm 6.3 and a 6.11 kernel are still refused."""
    text = render_freeze(AMD_FACTS, FreezeOptions(point_releases=True, kernel_series=True))
    assert 'amdgpu = "6.2.*"  # driver 6.2 point releases (installed: 6.2.2, amdgpu-dkms ' in text
    assert "amdgpu_package" not in text and 'rocm_package = "6.' not in text and "[frozen]" not in text
    assert "# With point releases, hip-runtime-amd are not pinned on their own: AMD's packages depend on rocm-core " \
           "(TheRock's on amdrocm-base<release>) at exact versions and move with it." in text
    policy = _compiled(tmp_path, text)
    d624 = "1:6.8.5.60204-2055000.22.04"
    assert _rules(policy, AMD_FACTS, amdgpu_dkms=d624, amdgpu_dkms_firmware=d624,
                  rocm_core="6.2.4.60204-139~22.04") == []
    assert _rules(policy, AMD_FACTS, rocm_core="6.3.0.60300-39~22.04") == ["amd.pairing"]
    assert _rules(policy, AMD_FACTS, **{"linux-image-6.8.0-49-generic": "6.8.0-49.49"}) == []
    assert _rules(policy, AMD_FACTS, **{"linux-image-6.11.0-19-generic": "6.11.0-19.19"}) == \
        ["amd.pairing.kernels", "kernel.allow"]


def test_every_nvidia_driver_and_cuda_move_is_refused(tmp_path: Path) -> None:
    """A driver package of another release (or build), another CUDA release, a second CUDA: refused."""
    facts = FreezeFacts(installed={**H200, **NVIDIA_PARTS}, context=_loaded(nvidia="580.159.04"),
                        running_kernel="6.8.0-87-generic")
    policy = _compiled(tmp_path, render_freeze(facts))
    newer = {k.replace("-", "_"): "580.159.04-0ubuntu0.24.04.2" for k in NVIDIA_PARTS}
    assert _rules(policy, facts, **newer) == ["frozen"]
    other = {k.replace("-", "_"): "580.105.08-0ubuntu0.24.04.1" for k in NVIDIA_PARTS}
    assert _rules(policy, facts, **other) == ["frozen", "nvidia.pairing"]
    assert _rules(policy, facts, cuda_toolkit_13_1="13.1.0-1") == ["nvidia.pairing"]
    assert _rules(policy, facts, cuda_cudart_13_0="13.0.97-1") == ["frozen", "nvidia.pairing"]
    module_only = _compiled(tmp_path, render_freeze(H200_FACTS))
    assert _rules(module_only, H200_FACTS, nvidia_driver_590_open="590.48.01-0ubuntu1") == ["nvidia.pairing"]


def test_a_driver_installed_but_not_loaded_is_refused_in_one_line() -> None:
    """AMD (DKMS base vs loaded amdgpu) and NVIDIA (packages vs loaded module): what differs and how to proceed."""
    amd = FreezeFacts(installed=AMD, context=_loaded(amdgpu="6.10.5"))
    with pytest.raises(FreezeRefused) as refused:
        render_freeze(amd)
    assert str(refused.value) == (
        "the installed driver is not the loaded one: the loaded amdgpu module is 6.10.5, the installed amdgpu-dkms "
        "1:6.8.5.60202-2041575.22.04 builds 6.8.5; reboot into the installed driver and freeze again, or pass "
        "--accept-inconsistent to freeze the installed packages (what the next boot loads)")
    nvidia = FreezeFacts(installed={**H200, **NVIDIA_PARTS}, context=_loaded(nvidia="580.95.05"))
    with pytest.raises(FreezeRefused, match=r"the loaded nvidia module is 580\.95\.05, the installed NVIDIA "
                                            r"driver is 580\.159\.04 \(libnvidia-compute-580 580\.159\.04-0ubuntu0"):
        render_freeze(nvidia)


def test_accept_inconsistent_freezes_the_installed_packages_and_says_so(tmp_path: Path) -> None:
    """The header names the difference; the pairing pins the installed driver, which the next boot loads."""
    amd = FreezeFacts(installed=AMD, context=_loaded(amdgpu="6.10.5"), hostname="h")
    text = render_freeze(amd, FreezeOptions(accept_inconsistent=True))
    assert "# INCONSISTENT when frozen (--accept-inconsistent): the loaded amdgpu module is 6.10.5, the installed " \
           "amdgpu-dkms 1:6.8.5.60202-2041575.22.04 builds 6.8.5; this policy pins the installed packages, which " \
           "the next boot loads.\n" in text
    assert 'amdgpu = "6.2.2"  # driver release 6.2.2 (amdgpu-dkms 1:6.8.5.60202-2041575.22.04)\n' in text
    assert _rules(_compiled(tmp_path, text), amd) == []


@pytest.mark.parametrize(("installed", "message"), [
    ({"amdgpu-dkms": D62, "amdgpu-dkms-firmware": "1:6.10.5.60300-2084815.22.04"},
     "amdgpu-dkms 1:6.8.5.60202-2041575.22.04 and amdgpu-dkms-firmware 1:6.10.5.60300-2084815.22.04 are not one "
     "build: finish or undo the driver change (install both at one version), then freeze"),
    ({"nvidia-dkms-580-open": "580.159.04-0ubuntu0.24.04.1", "libnvidia-compute-580": "580.95.05-0ubuntu1"},
     "the NVIDIA driver's packages are not one build (580.159.04: nvidia-dkms-580-open; 580.95.05: "
     "libnvidia-compute-580): finish or undo the driver change (every part at one release), then freeze"),
])
def test_a_driver_half_moved_is_refused_even_when_inconsistency_is_accepted(installed: Dict[str, str],
                                                                             message: str) -> None:
    """Driver parts at different builds match no frozen pairing: no option freezes that."""
    with pytest.raises(FreezeRefused) as refused:
        render_freeze(FreezeFacts(installed=installed), FreezeOptions(accept_inconsistent=True))
    assert str(refused.value) == message


def test_side_by_side_releases_and_absent_sides_are_frozen_as_found(tmp_path: Path) -> None:
    """Two ROCm releases (the versioned rocm-core6.4.1) set side_by_side; ROCm on the inbox driver pins 'none'."""
    facts = FreezeFacts(installed={"rocm-core": ROCM_622, "rocm-core6.4.1": "6.4.1.60401-83~24.04"},
                        running_kernel="6.8.0-45-generic")
    text = render_freeze(facts)
    assert 'side_by_side = true  # several ROCm releases are installed side by side now\n' in text
    assert 'amdgpu = "none"  # no amdgpu-dkms is installed (ROCm runs on the kernel\'s own amdgpu driver): ' \
           'installing one is refused\n' in text
    assert 'rocm = ["6.2.2", "6.4.1"]' in text and "kernels = " not in text
    policy = _compiled(tmp_path, text)
    assert _rules(policy, facts) == []
    assert _rules(policy, facts, amdgpu_dkms=D62, amdgpu_dkms_firmware=D62) == ["amd.pairing"]


def test_an_rpm_host_freezes_kernel_releases_as_the_evaluator_reads_them(tmp_path: Path) -> None:
    """rpm kernels are judged as version-release (no .x86_64); a series is the upstream version."""
    facts = FreezeFacts(installed={"kernel-core@5.14.0-570.12.1.el9_6": "5.14.0-570.12.1.el9_6"}, manager="rpm",
                        running_kernel="5.14.0-570.12.1.el9_6.x86_64")
    text = render_freeze(facts)
    assert '  "5.14.0-570.12.1.el9_6",  # running, installed (kernel-core 5.14.0-570.12.1.el9_6)\n' in text
    policy = _compiled(tmp_path, text)
    assert _rules(policy, facts, **{"kernel-core@5.14.0-570.22.1.el9_6": "5.14.0-570.22.1.el9_6"}) == \
        ["kernel.allow"]
    wide = _compiled(tmp_path, render_freeze(facts, FreezeOptions(kernel_series=True)))
    assert _rules(wide, facts, **{"kernel-core@5.14.0-570.22.1.el9_6": "5.14.0-570.22.1.el9_6"}) == []


@pytest.mark.parametrize(("release", "manager", "series"), [
    ("6.8.0-45-generic", "dpkg", "6.8.0-*-generic"),
    ("6.1.0-26-amd64", "dpkg", "6.1.0-*-amd64"),
    ("6.1.0-26-rt-amd64", "dpkg", "6.1.0-*-rt-amd64"),
    ("6.12.9+bpo-amd64", "dpkg", "6.12.9+bpo-*"),
    ("6.6.64-custom", "dpkg", "6.6.64-*"),
    ("5.14.0-570.12.1.el9_6", "rpm", "5.14.0-*"),
])
def test_kernel_series(release: str, manager: str, series: str) -> None:
    """The series keeps the upstream version and the flavour; the ABI number varies."""
    assert kernel_series(release, manager) == series


# Debian 13's own ROCm and CUDA (docs/guard.md, "GPU packages as the distributions ship them"): no rocm-core, no
# amdgpu-dkms, no driver loaded; the versions of the archive on 2026-12-06.
DEBIAN13: Dict[str, str] = {
    "libamdhip64-5": "5.7.1-6+deb13u1", "libhsa-runtime64-1": "6.1.2-3", "librocblas0": "5.5.1+dfsg-7",
    "libhsakmt1": "6.2.4+ds-1", "libamd-comgr2": "6.0+git20231212.4510c28+dfsg-3+b2", "hipcc": "5.7.1-6+deb13u1",
    "rocminfo": "6.1.2-2", "libcudart12": "12.4.127~12.4.1-2", "nvidia-cuda-toolkit": "12.4.131~12.4.1-2",
    "libcublas12": "12.4.5.8~12.4.1-2", "libcufft11": "11.2.1.3~12.4.1-2", "libnvrtc12": "12.4.127~12.4.1-2",
    "libegl-nvidia0": "550.163.01-2", "libgl1-nvidia-glvnd-glx": "550.163.01-2",
    "linux-image-6.12.57+deb13-amd64": "6.12.57-1"}
DEBIAN13_FACTS = FreezeFacts(installed=DEBIAN13, running_kernel="6.12.57+deb13-amd64",
                             context=HostContext("debian", "13"), hostname="trixie", date="2026-12-06")


def test_debian_rocm_and_cuda_are_frozen_and_every_move_is_refused(tmp_path: Path) -> None:
    """Every library frozen at its build, CUDA read after Debian's tilde; sid's ROCr (which Breaks HIP, so apt
    removes HIP and rocBLAS with it) and a removal of rocBLAS are refused by the frozen rule, CUDA 12.6 by the
    pairing."""
    text = render_freeze(DEBIAN13_FACTS)
    assert "ROCm as the distribution packages it" in text and "No GPU driver was found" not in text
    assert 'cuda = "12.4.1"  # every CUDA release installed' in text
    for name, version in DEBIAN13.items():
        if not name.startswith("linux-image"):
            assert f'  "{name}",  # installed {version}' in text, name
    policy = _compiled(tmp_path, text)
    assert _rules(policy, DEBIAN13_FACTS) == []
    assert _rules(policy, DEBIAN13_FACTS, libhsa_runtime64_1="6.4.3+dfsg-5", libamdhip64_5="",
                  librocblas0="") == ["frozen"]
    assert _rules(policy, DEBIAN13_FACTS, librocblas0="") == ["frozen"]
    assert _rules(policy, DEBIAN13_FACTS, libcudart12="12.6.77~12.6.3-1") == ["frozen", "nvidia.pairing"]


def test_debian_rocm_with_point_releases_keeps_each_librarys_series(tmp_path: Path) -> None:
    """With point releases each library keeps its own series (a comgr snapshot version gets a range): a Debian
    point update passes, sid's releases do not."""
    text = render_freeze(DEBIAN13_FACTS, FreezeOptions(point_releases=True))
    assert "not pinned on their own" not in text  # no rocm-core for Debian's packages to move with
    assert 'allow = ">= 6.0, << 6.1"' in text and 'allow = "6.1.*"' in text
    policy = _compiled(tmp_path, text)
    assert _rules(policy, DEBIAN13_FACTS) == []
    assert _rules(policy, DEBIAN13_FACTS, libamdhip64_5="5.7.1-6+deb13u2", libhsakmt1="6.2.4+ds-2") == []
    assert _rules(policy, DEBIAN13_FACTS, libhsa_runtime64_1="6.4.3+dfsg-5") == ["versions.libhsa-runtime64-1"]
    assert _rules(policy, DEBIAN13_FACTS, libamd_comgr2="6.1+git20240101-1") == ["versions.libamd-comgr2"]
