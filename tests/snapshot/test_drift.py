"""Drift findings derived from one snapshot."""

from __future__ import annotations

from agent.collectors.amdgpu import AmdgpuInfo
from agent.collectors.base import Section, Status
from agent.collectors.dkms import DkmsInfo, DkmsModule
from agent.collectors.kernel import KernelInfo
from agent.collectors.nvidia import NvidiaInfo
from agent.collectors.packages import PackageInfo, PackageSet
from agent.collectors.rocm import RocmInfo, RocmInstall
from agent.frozen import replace
from agent.snapshot.drift import analyze
from agent.snapshot.take import take_snapshot
from tests.conftest import make_fixture_host


def _base():
    return take_snapshot(make_fixture_host("gpuless-debian12"))


def _ok(data):
    return Section(status=Status.OK, data=data)


def _packages(**versions: str) -> Section:
    return _ok(PackageSet(manager="dpkg", installed_count=len(versions),
                          packages={k.replace("_", "-"): PackageInfo(version=v, arch="amd64")
                                    for k, v in versions.items()}))


def _kinds(snap):
    return [(f.kind, f.component, f.severity) for f in analyze(snap)]


def test_amdgpu_installed_newer_than_loaded() -> None:
    """amdgpu-dkms 6.10.5 installed while 6.8.5 is loaded is a warning naming both versions."""
    snap = replace(
        _base(), dpkg=_packages(amdgpu_dkms="1:6.10.5.60300-2084815.24.04"),
        amdgpu=_ok(AmdgpuInfo(module_loaded=True, driver_version="6.8.5", driver_kind="dkms", source="sysfs")),
        kernel=_ok(KernelInfo(running_release="6.8.0-45-generic")))
    findings = analyze(snap)
    assert [(f.kind, f.severity) for f in findings] == [("driver_installed_not_loaded", "warning")]
    assert findings[0].details == {"installed": "1:6.10.5.60300-2084815.24.04", "loaded": "6.8.5"}


def test_amdgpu_matching_versions_raise_nothing() -> None:
    """The loaded module from the installed package is no drift."""
    snap = replace(
        _base(), dpkg=_packages(amdgpu_dkms="1:6.8.5.60202-2041575.22.04"),
        amdgpu=_ok(AmdgpuInfo(module_loaded=True, driver_version="6.8.5", driver_kind="dkms", source="amdsmi")),
        kernel=_ok(KernelInfo(running_release="6.5.0-41-generic")))
    assert analyze(snap) == []


def test_inbox_driver_loaded_despite_dkms_package_is_critical() -> None:
    """amdgpu-dkms installed but the inbox module loaded means the DKMS build did not load."""
    snap = replace(
        _base(), dpkg=_packages(amdgpu_dkms="1:6.8.5.60202-2041575.22.04"),
        amdgpu=_ok(AmdgpuInfo(module_loaded=True, driver_kind="inbox", source="sysfs")),
        kernel=_ok(KernelInfo(running_release="6.5.0-41-generic")))
    assert _kinds(snap) == [("driver_installed_not_loaded", "amdgpu", "critical")]


def test_next_boot_kernel_without_gpu_module_is_critical() -> None:
    """A pending kernel with no DKMS build of the loaded GPU module is flagged before the reboot."""
    snap = replace(
        _base(), dpkg=_packages(),
        kernel=_ok(KernelInfo(running_release="5.14.0-570.12.1.el9_6.x86_64",
                              next_boot="5.14.0-570.22.1.el9_6.x86_64", reboot_pending=True)),
        dkms=_ok(DkmsInfo(modules=[DkmsModule(module="amdgpu", version="6.14.14-2204008.el9",
                                              kernel="5.14.0-570.12.1.el9_6.x86_64", arch="x86_64",
                                              state="installed")])))
    assert _kinds(snap) == [("reboot_pending", "kernel", "info"), ("dkms_missing_for_next_boot", "amdgpu", "critical")]


def test_nvidia_userspace_newer_than_loaded_module() -> None:
    """Unattended-upgraded NVIDIA libraries under an older loaded module are flagged per package."""
    snap = replace(
        _base(), dpkg=_packages(libnvidia_compute_580="580.105.08-0ubuntu1", nvidia_container_toolkit="1.17.8-1",
                                cuda_compat_13_0="580.95.05-0ubuntu1"),
        nvidia=_ok(NvidiaInfo(module_loaded=True, driver_version="580.95.05", source="nvml")),
        kernel=_ok(KernelInfo(running_release="6.8.0-87-generic")))
    findings = analyze(snap)
    assert [(f.kind, f.details["package"]) for f in findings] == [("driver_installed_not_loaded",
                                                                    "libnvidia-compute-580")]


def test_rocm_tree_and_package_disagree() -> None:
    """/opt/rocm saying 6.2.2 while rocm-core is 6.3.0 is a warning."""
    snap = replace(_base(), dpkg=_packages(rocm_core="6.3.0.60300-39~22.04"),
                   rocm=_ok(RocmInfo(active_path="/opt/rocm-6.2.2", version="6.2.2-116")),
                   kernel=_ok(KernelInfo(running_release="6.5.0-41-generic")))
    assert _kinds(snap) == [("rocm_version_mismatch", "rocm", "warning")]


def test_half_configured_package_is_flagged() -> None:
    """A watched package left half-configured by an interrupted dpkg run is a warning."""
    section = _ok(PackageSet(manager="dpkg", installed_count=1, packages={
        "amdgpu-dkms": PackageInfo(version="1:6.8.5.60202-2041575.22.04", arch="all", state="half-configured")}))
    snap = replace(_base(), dpkg=section, kernel=_ok(KernelInfo(running_release="6.5.0")))
    assert _kinds(snap) == [("package_not_fully_installed", "packages", "warning")]


def test_companions_that_already_disagree_are_findings() -> None:
    """A host whose NSCQ is not the driver's build, whose DCGM is split across releases and whose exporter was
    built for another DCGM series: one companion_mismatch finding per disagreement, fabric manager critical."""
    nv = "580.95.05-0ubuntu0.24.04.2"
    snap = replace(_base(), dpkg=_packages(
        nvidia_driver_580_open=nv, libnvidia_compute_580=nv, nvidia_fabricmanager_580="580.95.05-1",
        libnvidia_nscq_580="580.82.07-1", datacenter_gpu_manager_4_core="1:4.7.1-1",
        datacenter_gpu_manager_4_cuda13="1:4.7.0-1", dcgm_exporter="4.8.4-1"))
    findings = [f for f in analyze(snap) if f.kind == "companion_mismatch"]
    assert [(f.details["rule"], f.severity, f.component) for f in findings] == [
        ("companion.fabricmanager", "critical", "nvidia"), ("companion.dcgm", "warning", "dcgm"),
        ("companion.dcgm_exporter", "warning", "dcgm")]
    assert findings[0].message == ("libnvidia-nscq-580 580.82.07 needs driver 580.82.07; the host has driver "
                                   "580.95.05 (libnvidia-compute-580, nvidia-driver-580-open)")
    assert findings[0].details["packages"].startswith("libnvidia-nscq-580=580.82.07-1 ")


def test_an_exporter_newer_than_the_table_is_an_info_finding_naming_the_tables_date() -> None:
    """dcgm-exporter 4.11.0 beside DCGM 4.8.0: no companion_mismatch, one info unknown_to_table finding naming the
    table's date; 4.10.0 (the newest row) raises neither."""
    snap = replace(_base(), dpkg=_packages(datacenter_gpu_manager_4_core="1:4.8.0-1", dcgm_exporter="4.11.0-1"))
    assert [f for f in analyze(snap) if f.kind == "companion_mismatch"] == []
    [found] = [f for f in analyze(snap) if f.kind == "unknown_to_table"]
    assert (found.severity, found.component, found.details["table_dated"]) == ("info", "dcgm-exporter", "2026-12-06")
    assert found.message.startswith("dcgm-exporter 4.11.0-1 is unknown to gpuguard's dcgm-exporter table dated "
                                    "2026-12-06")
    known = replace(_base(), dpkg=_packages(datacenter_gpu_manager_4_core="1:4.8.0-1", dcgm_exporter="4.10.0-1"))
    assert [f.kind for f in analyze(known) if f.kind in ("unknown_to_table", "companion_mismatch")] == []


def test_fabric_manager_judged_against_the_loaded_driver_without_a_package() -> None:
    """Fabric manager beside a driver no package carries is judged by the loaded module; at its build, nothing."""
    base = replace(_base(), dpkg=_packages(nvidia_fabricmanager_580="580.95.05-1"))
    loaded = replace(base, nvidia=_ok(NvidiaInfo(module_loaded=True, driver_version="580.95.05", source="procfs")))
    assert [f for f in analyze(loaded) if f.kind == "companion_mismatch"] == []
    other = replace(base, nvidia=_ok(NvidiaInfo(module_loaded=True, driver_version="580.105.08", source="procfs")))
    assert [f.message for f in analyze(other) if f.kind == "companion_mismatch"] == [
        "nvidia-fabricmanager-580 580.95.05 needs driver 580.95.05; the host has driver 580.105.08 (the loaded "
        "nvidia module; no driver package)"]


def test_therock_tree_and_its_base_package_disagree() -> None:
    """/opt/rocm/core-7.13 saying 7.13.0 while amdrocm-base7.13 is 7.13.1 is a warning naming both; the classic
    /opt/rocm beside it, matching rocm-core, raises nothing."""
    snap = replace(_base(), dpkg=_packages(rocm_core="6.4.1.60401-83~22.04", **{"amdrocm-base7.13": "7.13.1-1"}),
                   rocm=_ok(RocmInfo(active_path="/opt/rocm-6.4.1", version="6.4.1-83", installs=[
                       RocmInstall(path="/opt/rocm-6.4.1", version="6.4.1-83"),
                       RocmInstall(path="/opt/rocm/core-7.13", version="7.13.0")])),
                   kernel=_ok(KernelInfo(running_release="6.5.0-41-generic")))
    findings = analyze(snap)
    assert [(f.kind, f.component) for f in findings] == [("rocm_version_mismatch", "rocm")]
    assert findings[0].message == "/opt/rocm/core-7.13 says ROCm 7.13.0 but package amdrocm-base7.13 is 7.13.1-1"


def test_therock_only_host_has_no_rocm_core_finding() -> None:
    """A TheRock host (active tree /opt/rocm/core-10.0, no rocm-core) whose amdrocm-base10.0 agrees: no finding."""
    snap = replace(_base(), dpkg=_packages(**{"amdrocm-base10.0": "10.0.0-4"}),
                   rocm=_ok(RocmInfo(active_path="/opt/rocm/core-10.0", version="10.0.0", installs=[
                       RocmInstall(path="/opt/rocm/core-10.0", version="10.0.0")])),
                   kernel=_ok(KernelInfo(running_release="6.5.0-41-generic")))
    assert _kinds(snap) == []


def test_pairing_sums_every_rocm_release_of_a_mixed_host() -> None:
    """The pairing of a classic 6.4.1 + TheRock 7.13 host names every release and the package carrying it."""
    from agent.snapshot.pairing import pairing_of

    pairing = pairing_of(take_snapshot(make_fixture_host("mixed-rocm641-therock713-ubuntu2204")))
    assert pairing.rocm == "6.4.1-83"
    assert pairing.rocm_core_package == "6.4.1.60401-83~22.04"
    assert pairing.rocm_releases == ("7.13.0 (amdrocm-base), 7.13.0 (amdrocm-base7.13), 6.4.1 (rocm-core), "
                                     "6.4.1 (rocm-core6.4.1)")


def test_pairing_of_a_therock_host_is_not_no_rocm() -> None:
    """A TheRock-only host: the pairing's ROCm is the 10.0 release, from its tree and amdrocm-base10.0."""
    from agent.snapshot.pairing import pairing_of

    pairing = pairing_of(take_snapshot(make_fixture_host("therock-mi300x-ubuntu2204")))
    assert (pairing.rocm, pairing.rocm_core_package, pairing.rocm_releases) == ("10.0.0", None,
                                                                               "10.0.0 (amdrocm-base10.0)")
