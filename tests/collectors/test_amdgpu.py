"""amdgpu driver and AMD GPU inventory: pure parsers, amdsmi reading, the sysfs fallback and driver-kind detection."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

from agent.collectors.amdgpu import (
    SMI_NOT_LOADED,
    AmdgpuCollector,
    EccCount,
    PciAddress,
    classify_driver,
    firmware_block_name,
    format_smi_lib_version,
    kfd_location_id,
    normalise_device_id,
    normalise_gfx_target,
    parse_bdf,
    parse_ras_err_count,
    parse_uevent,
    smi_driver,
)
from agent.errors import CollectorUnavailable, LibraryUnavailable
from agent.host import Host, import_gpu_library
from tests.conftest import RECORDED, ROOTS, fake_module_loader, fixed_clock, make_fixture_host
from tests.fakes.amdsmi import make_fake_amdsmi

MI300X = "mi300x-rocm62-ubuntu2204"
RHEL9 = "rocm7-rhel9"
DRIFT = "amdgpu-drift"


def _recorded_amdsmi(scenario: str) -> Dict[str, Any]:
    return json.loads((RECORDED / scenario / "amdsmi.json").read_text())


def _host_with_amdsmi(scenario: str, data: Dict[str, Any]):
    """A fixture host whose amdsmi answers from ``data``; returns (host, fake module)."""
    module = make_fake_amdsmi(data)
    return make_fixture_host(scenario, modules={"amdsmi": module}), module


def _write(root: Path, rel: str, text: str = "") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _amd_card(root: Path, card: str, bdf: str, device: str = "0x740f") -> None:
    base = f"sys/class/drm/{card}/device"
    _write(root, f"{base}/vendor", "0x1002\n")
    _write(root, f"{base}/device", f"{device}\n")
    _write(root, f"{base}/uevent", f"DRIVER=amdgpu\nPCI_SLOT_NAME={bdf}\n")


# --- pure parsers -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("ue: 0\nce: 2\n", EccCount(correctable_count=2, uncorrectable_count=0)),
    ("ue: 3\nce: 0", EccCount(correctable_count=0, uncorrectable_count=3)),
    ("ue: 1\n", EccCount(correctable_count=0, uncorrectable_count=1)),
    ("", None),
    ("not supported\n", None),
    ("ue: x\nce: y\n", None),
])
def test_parse_ras_err_count(text: str, expected: Optional[EccCount]) -> None:
    """A RAS err_count file gives (correctable, uncorrectable); one without counts gives None."""
    assert parse_ras_err_count(text) == expected


def test_parse_uevent() -> None:
    """KEY=value lines become a dict; lines without '=' are ignored."""
    text = "DRIVER=amdgpu\nPCI_CLASS=120000\nPCI_SLOT_NAME=0000:05:00.0\ngarbage\n"
    assert parse_uevent(text) == {"DRIVER": "amdgpu", "PCI_CLASS": "120000", "PCI_SLOT_NAME": "0000:05:00.0"}


@pytest.mark.parametrize("text,expected", [
    ("0000:05:00.0", PciAddress(0, 0x05, 0, 0)),
    ("0000:C1:00.1", PciAddress(0, 0xc1, 0, 1)),
    ("83:00.0", PciAddress(0, 0x83, 0, 0)),
    ("10000:01:1f.7", PciAddress(0x10000, 0x01, 0x1f, 7)),
])
def test_parse_bdf(text: str, expected: PciAddress) -> None:
    """PCI addresses parse with or without a domain and print in the sysfs form."""
    assert parse_bdf(text) == expected
    assert parse_bdf(str(expected)) == expected


@pytest.mark.parametrize("text", ["", "card0", "0000:05:00", "0000:05:00.8", "zz:00.0"])
def test_parse_bdf_rejects_non_addresses(text: str) -> None:
    """Anything that is not a PCI address is a ValueError."""
    with pytest.raises(ValueError):
        parse_bdf(text)


@pytest.mark.parametrize("bdf,location_id", [
    ("0000:05:00.0", 0x0500),
    ("0000:26:00.0", 0x2600),
    ("0000:c1:00.1", 0xc101),
    ("0000:03:02.3", (0x03 << 8) | (0x02 << 3) | 3),
])
def test_kfd_location_id(bdf: str, location_id: int) -> None:
    """KFD's location_id packs bus, device and function."""
    assert kfd_location_id(parse_bdf(bdf)) == location_id


@pytest.mark.parametrize("version,expected", [
    ({"year": 24, "major": 6, "minor": 2, "release": 0, "build": "e9a4e7f4"}, "24.6.2.0"),
    ({"major": 26, "minor": 0, "release": 2, "build": "39589fda"}, "26.0.2"),
    ({"year": None, "major": 25, "minor": 3, "release": 0}, "25.3.0"),
    ({"major": 26, "minor": 0}, None),
    ({"major": "x", "minor": 0, "release": 0}, None),
])
def test_format_smi_lib_version(version: Dict[str, Any], expected: Optional[str]) -> None:
    """2024 builds carry a year; newer ones give major.minor.release."""
    assert format_smi_lib_version(version) == expected


def test_firmware_block_name_strips_the_enum_prefix() -> None:
    """An AmdSmiFwBlock member and its plain name both give the short block name."""
    smi = make_fake_amdsmi({})
    assert firmware_block_name(smi.AmdSmiFwBlock.AMDSMI_FW_ID_PSP_SOSDRV) == "PSP_SOSDRV"
    assert firmware_block_name("AMDSMI_FW_ID_PM") == "PM"
    assert firmware_block_name("PM") == "PM"


@pytest.mark.parametrize("module_present,version_file,expected", [
    (True, "6.8.5", ("dkms", "6.8.5")),
    (True, None, ("inbox", None)),
    (False, None, ("not_loaded", None)),
])
def test_classify_driver(module_present: bool, version_file: Optional[str], expected: tuple) -> None:
    """Only the DKMS driver has /sys/module/amdgpu/version."""
    assert classify_driver(module_present, version_file) == expected


@pytest.mark.parametrize("module_present,version_file,smi_version,kernel,expected", [
    (True, "6.8.5", "6.8.5", "6.5.0-41-generic", ("dkms", "6.8.5")),
    (True, "6.8.5", None, "6.5.0-41-generic", ("dkms", "6.8.5")),
    # amdsmi falls back to the kernel release from /proc/version when the version file is missing
    (True, None, "6.8.0-45-generic", "6.8.0-45-generic", ("inbox", None)),
    (False, None, "6.8.0-45-generic", "6.8.0-45-generic", ("inbox", None)),
    (False, None, "6.10.5", "6.8.0-45-generic", ("dkms", "6.10.5")),
    (False, None, None, "6.8.0-45-generic", ("inbox", None)),
])
def test_smi_driver(module_present: bool, version_file: Optional[str], smi_version: Optional[str],
                    kernel: str, expected: tuple) -> None:
    """With amdsmi running, sysfs decides the kind; without /sys/module the kernel release gives inbox away."""
    assert smi_driver(module_present, version_file, smi_version, kernel) == expected


@pytest.mark.parametrize("value,expected", [
    (0x74a1, "0x74a1"), ("0x74A1", "0x74a1"), ("74a1", "0x74a1"), ("N/A", None), (0, None), (None, None),
    ("zz", None),
])
def test_normalise_device_id(value: Any, expected: Optional[str]) -> None:
    """amdsmi's hex text, sysfs text and ints all give one form."""
    assert normalise_device_id(value) == expected


@pytest.mark.parametrize("value,expected", [
    ("gfx942", "gfx942"), ("GFX90A", "gfx90a"), ("gfx0", None), ("N/A", None), ("", None), ("942", None),
])
def test_normalise_gfx_target(value: str, expected: Optional[str]) -> None:
    """Unset targets (gfx0, N/A) are None."""
    assert normalise_gfx_target(value) == expected


# --- collector over fixture hosts ---------------------------------------------------------------------------------


def test_mi300x_through_amdsmi() -> None:
    """Two MI300X read through amdsmi: identity, firmware, VRAM, ECC, DKMS driver, 2024-style library version."""
    host, smi = _host_with_amdsmi(MI300X, _recorded_amdsmi(MI300X))
    info = AmdgpuCollector().collect(host)
    assert (info.source, info.module_loaded, info.driver_kind, info.driver_version) == ("amdsmi", True, "dkms",
                                                                                         "6.8.5")
    assert info.smi_library_version == "24.6.2.0" and info.smi_unavailable_reason is None
    assert [g.bdf for g in info.gpus] == ["0000:05:00.0", "0000:26:00.0"]
    first = info.gpus[0]
    assert (first.market_name, first.gfx_target, first.device_id) == ("AMD Instinct MI300X", "gfx942", "0x74a1")
    assert (first.vbios_part_number, first.vbios_version) == ("113-M3000100-102", "022.040.003.042.000001")
    assert first.uuid == "4bff74a1-0000-1000-8000-a3c57f02e9d1"
    assert first.firmware["PM"] == "00.85.118.00" and first.firmware["PSP_SOSDRV"] == "00.36.02.59"
    assert first.firmware["SMC"] == "5600768"
    assert first.vram_total_bytes == 206141652992
    assert (info.gpus[1].ecc_correctable_count, info.gpus[1].ecc_uncorrectable_count) == (2, 0)
    assert smi.calls[0] == "amdsmi_init" and smi.calls[-1] == "amdsmi_shut_down"


def test_mi300x_sysfs_agrees_with_amdsmi_where_both_know() -> None:
    """Without amdsmi the same host gives the same addresses, targets, ids, VRAM, ECC and part numbers."""
    with_smi = AmdgpuCollector().collect(_host_with_amdsmi(MI300X, _recorded_amdsmi(MI300X))[0])
    sysfs = AmdgpuCollector().collect(make_fixture_host(MI300X, modules={}))
    assert sysfs.source == "sysfs" and sysfs.smi_unavailable_reason == "amdsmi: not installed (fake host)"
    assert (sysfs.driver_kind, sysfs.driver_version) == (with_smi.driver_kind, with_smi.driver_version)
    shared = ("bdf", "gfx_target", "device_id", "vram_total_bytes", "ecc_correctable_count",
              "ecc_uncorrectable_count", "vbios_part_number")
    assert [[getattr(g, f) for f in shared] for g in sysfs.gpus] == \
        [[getattr(g, f) for f in shared] for g in with_smi.gpus]
    assert [g.uuid for g in sysfs.gpus] == ["4b18a3c57f02e9d1", "9e0c57b2d4a1f368"]  # sysfs unique_id
    assert all(g.firmware == {} and g.market_name is None for g in sysfs.gpus)


def test_rocm7_rhel9_through_amdsmi() -> None:
    """An MI210 under a 7.x binding: library version without a year."""
    info = AmdgpuCollector().collect(make_fixture_host(RHEL9))
    assert (info.source, info.driver_kind, info.driver_version) == ("amdsmi", "dkms", "6.14.14")
    assert info.smi_library_version == "26.0.2"
    [gpu] = info.gpus
    assert (gpu.bdf, gpu.market_name, gpu.gfx_target, gpu.device_id) == ("0000:83:00.0", "AMD Instinct MI210",
                                                                         "gfx90a", "0x740f")
    assert gpu.vram_total_bytes == 68702699520


def test_drift_host_reads_sysfs_and_skips_connectors() -> None:
    """Without amdsmi: the loaded (old) DKMS version, one W7900, connector and render nodes ignored, no RAS."""
    info = AmdgpuCollector().collect(make_fixture_host(DRIFT))
    assert (info.source, info.module_loaded, info.driver_kind, info.driver_version) == ("sysfs", True, "dkms",
                                                                                        "6.8.5")
    assert info.smi_library_version is None and "not installed" in (info.smi_unavailable_reason or "")
    [gpu] = info.gpus
    assert (gpu.bdf, gpu.gfx_target, gpu.device_id, gpu.vbios_part_number) == ("0000:03:00.0", "gfx1100", "0x7448",
                                                                               "113-D7070100-101")
    assert gpu.vram_total_bytes == 51522830336
    assert (gpu.uuid, gpu.ecc_correctable_count, gpu.ecc_uncorrectable_count) == (None, None, None)


# --- amdsmi failure modes -----------------------------------------------------------------------------------------


def test_init_error_falls_back_to_sysfs_with_reason() -> None:
    """amdsmi_init raising AmdSmiLibraryException (driver not loaded) leads to sysfs with the reason kept."""
    data = dict(_recorded_amdsmi(MI300X), init_error=True)
    host, smi = _host_with_amdsmi(MI300X, data)
    info = AmdgpuCollector().collect(host)
    assert info.source == "sysfs" and len(info.gpus) == 2
    assert info.smi_unavailable_reason == "amdsmi: driver not loaded (AMDSMI_STATUS_DRIVER_NOT_LOADED)"
    assert smi.calls == ["amdsmi_init"]


def test_skewed_binding_failing_at_init_falls_back_to_sysfs() -> None:
    """A binding newer than the host library (a symbol missing: AttributeError at amdsmi_init) gives sysfs."""
    host, smi = _host_with_amdsmi(MI300X, _recorded_amdsmi(MI300X))

    def init_with_missing_symbol() -> None:
        raise AttributeError("/opt/rocm/lib/libamd_smi.so: undefined symbol: amdsmi_get_gpu_enumeration_info")

    smi.amdsmi_init = init_with_missing_symbol
    info = AmdgpuCollector().collect(host)
    assert info.source == "sysfs" and info.smi_unavailable_reason == (
        "amdsmi: binding and library releases differ (undefined symbol amdsmi_get_gpu_enumeration_info)")


def test_shut_down_runs_when_a_call_after_init_fails() -> None:
    """A failing amdsmi_get_processor_handles still shuts amdsmi down, and the collector falls back."""
    data = dict(_recorded_amdsmi(MI300X), errors={"amdsmi_get_processor_handles": "AMDSMI_STATUS_NO_PERM"})
    host, smi = _host_with_amdsmi(MI300X, data)
    info = AmdgpuCollector().collect(host)
    assert info.source == "sysfs" and info.smi_unavailable_reason == (
        "amdsmi: amdsmi_get_processor_handles failed (AMDSMI_STATUS_NO_PERM)")
    assert smi.calls[-1] == "amdsmi_shut_down"


def test_unsupported_per_gpu_call_costs_only_that_field() -> None:
    """fw_info and ECC not supported on one GPU: those fields are empty/None, everything else is still there."""
    data = copy.deepcopy(_recorded_amdsmi(MI300X))
    data["gpus"][0]["errors"] = {"amdsmi_get_fw_info": "AMDSMI_STATUS_NOT_SUPPORTED",
                                 "amdsmi_get_gpu_total_ecc_count": "AMDSMI_STATUS_NOT_SUPPORTED"}
    del data["gpus"][0]["uuid"]
    info = AmdgpuCollector().collect(_host_with_amdsmi(MI300X, data)[0])
    assert info.source == "amdsmi"
    first, second = info.gpus
    assert first.firmware == {} and first.ecc_correctable_count is None and first.uuid is None
    assert (first.market_name, first.gfx_target, first.vram_total_bytes) == ("AMD Instinct MI300X", "gfx942",
                                                                              206141652992)
    assert second.firmware["PM"] == "00.85.118.00" and second.ecc_correctable_count == 2


def test_vram_from_vram_info_when_memory_total_is_missing() -> None:
    """A binding without amdsmi_get_gpu_memory_total gives VRAM from amdsmi_get_gpu_vram_info (MiB)."""
    data = dict(_recorded_amdsmi(MI300X), missing_functions=["amdsmi_get_gpu_memory_total"])
    info = AmdgpuCollector().collect(_host_with_amdsmi(MI300X, data)[0])
    assert [g.vram_total_bytes for g in info.gpus] == [196592 * 1024 * 1024] * 2 == [206141652992] * 2


def test_lib_version_failure_leaves_only_it_unset() -> None:
    """amdsmi_get_lib_version failing costs the library version, not the GPUs."""
    data = dict(_recorded_amdsmi(RHEL9), errors={"amdsmi_get_lib_version": "AMDSMI_STATUS_NOT_SUPPORTED"})
    info = AmdgpuCollector().collect(_host_with_amdsmi(RHEL9, data)[0])
    assert info.source == "amdsmi" and info.smi_library_version is None and len(info.gpus) == 1


def test_gpu_without_address_is_skipped() -> None:
    """A GPU whose BDF cannot be read is left out; the others are kept."""
    data = copy.deepcopy(_recorded_amdsmi(MI300X))
    data["gpus"][0]["errors"] = {"amdsmi_get_gpu_device_bdf": "AMDSMI_STATUS_FILE_ERROR"}
    info = AmdgpuCollector().collect(_host_with_amdsmi(MI300X, data)[0])
    assert [g.bdf for g in info.gpus] == ["0000:26:00.0"]


def test_amdsmi_without_gpus_falls_back_to_sysfs() -> None:
    """amdsmi starting but listing no GPU is no answer: sysfs is read instead."""
    data = dict(_recorded_amdsmi(MI300X), gpus=[])
    host, smi = _host_with_amdsmi(MI300X, data)
    info = AmdgpuCollector().collect(host)
    assert info.source == "sysfs" and info.smi_unavailable_reason == "amdsmi: found no AMD GPU"
    assert len(info.gpus) == 2 and smi.calls[-1] == "amdsmi_shut_down"


def test_import_gpu_library_hides_amdsmi_noise(tmp_path: Path, monkeypatch, capsys) -> None:
    """A binding that prints and raises KeyError at import (amdsmi without libamd_smi.so) is LibraryUnavailable."""
    (tmp_path / "gpuguard_noisy_binding.py").write_text(
        "print('/opt/rocm/lib/libamd_smi.so: cannot open shared object file: No such file or directory')\n"
        "print('Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager')\n"
        "raise KeyError('libamd_smi.so')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LibraryUnavailable) as caught:
        import_gpu_library("gpuguard_noisy_binding")
    assert (caught.value.library, caught.value.reason) == ("gpuguard_noisy_binding", "libamd_smi.so not found")
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("module_text,reason", [
    ("print('gpuguard-test: Unable to find libamd_smi.so library')\nraise KeyError('libamd_smi.so')\n",
     "amdsmi: libamd_smi.so not found"),
    ("import gpuguard_no_such_module_amdsmi_wrapper\n",
     "amdsmi: not installed (no module named 'gpuguard_no_such_module_amdsmi_wrapper')"),
    ("raise AttributeError('/opt/rocm/lib/libamd_smi.so: undefined symbol: amdsmi_set_gpu_clk_range')\n",
     "amdsmi: binding and library releases differ (undefined symbol amdsmi_set_gpu_clk_range)"),
])
def test_real_import_failures_of_amdsmi_lead_to_sysfs(tmp_path: Path, monkeypatch, capsys, module_text: str,
                                                      reason: str) -> None:
    """An ``amdsmi`` that fails at import (KeyError with noise, ImportError, a missing symbol) gives the sysfs path and
    one short reason, without the binding's noise."""
    (tmp_path / "amdsmi.py").write_text(module_text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "amdsmi" or m.startswith("amdsmi.")]:
        monkeypatch.delitem(sys.modules, name)
    host = Host(root=ROOTS / MI300X, load_module=import_gpu_library, clock=fixed_clock)
    info = AmdgpuCollector().collect(host)
    assert info.source == "sysfs" and len(info.gpus) == 2
    assert info.smi_unavailable_reason == reason
    assert capsys.readouterr().out == ""


# --- driver kind and absence on hand-built trees ------------------------------------------------------------------


def test_inbox_driver_without_version_file(tmp_path: Path) -> None:
    """A loaded amdgpu module without a version file is the kernel's inbox driver, version unknown."""
    _write(tmp_path, "sys/module/amdgpu/initstate", "live\n")
    _amd_card(tmp_path, "card1", "0000:c1:00.0")
    info = AmdgpuCollector().collect(Host(root=tmp_path, load_module=fake_module_loader({})))
    assert (info.module_loaded, info.driver_kind, info.driver_version) == (True, "inbox", None)
    assert [(g.bdf, g.device_id) for g in info.gpus] == [("0000:c1:00.0", "0x740f")]


def test_inbox_driver_ignores_amdsmi_kernel_release(tmp_path: Path) -> None:
    """amdsmi reports the kernel release as driver version on the inbox driver; the kind stays inbox, version None."""
    _write(tmp_path, "sys/module/amdgpu/initstate", "live\n")
    _write(tmp_path, "proc/sys/kernel/osrelease", "6.8.0-45-generic\n")
    data = {"gpus": [{"bdf": "0000:c1:00.0",
                      "driver_info": {"driver_name": "amdgpu", "driver_version": "6.8.0-45-generic",
                                      "driver_date": "2015/01/01 00:00"},
                      "asic_info": {"market_name": "AMD Instinct MI210", "device_id": "0x740f",
                                    "target_graphics_version": "gfx90a"}}]}
    host = Host(root=tmp_path, load_module=fake_module_loader({"amdsmi": make_fake_amdsmi(data)}))
    info = AmdgpuCollector().collect(host)
    assert (info.source, info.driver_kind, info.driver_version) == ("amdsmi", "inbox", None)
    assert info.gpus[0].vram_total_bytes is None and info.gpus[0].gfx_target == "gfx90a"


def test_amdsmi_in_a_container_without_sys_module(tmp_path: Path) -> None:
    """amdsmi running proves the driver is loaded even when /sys/module is hidden; its version names the DKMS one.

    The container still has /dev/kfd, which is what makes the collector ask amdsmi without /sys/module/amdgpu.
    """
    _write(tmp_path, "proc/sys/kernel/osrelease", "6.8.0-45-generic\n")
    _write(tmp_path, "dev/kfd")
    data = {"gpus": [{"bdf": "0000:c1:00.0",
                      "driver_info": {"driver_name": "amdgpu", "driver_version": "6.10.5", "driver_date": ""}}]}
    host = Host(root=tmp_path, load_module=fake_module_loader({"amdsmi": make_fake_amdsmi(data)}))
    info = AmdgpuCollector().collect(host)
    assert (info.module_loaded, info.driver_kind, info.driver_version) == (True, "dkms", "6.10.5")


def test_gpu_present_but_driver_not_loaded(tmp_path: Path) -> None:
    """An AMD accelerator on the PCI bus without amdgpu loaded is recorded as not_loaded, audio/CPU functions not."""
    for bdf, vendor, pci_class, device in [("0000:c1:00.0", "0x1002", "0x038000", "0x740f"),
                                           ("0000:c1:00.1", "0x1002", "0x040300", "0xab28"),
                                           ("0000:00:00.0", "0x1022", "0x060000", "0x14a4")]:
        for name, value in (("vendor", vendor), ("class", pci_class), ("device", device)):
            _write(tmp_path, f"sys/bus/pci/devices/{bdf}/{name}", value + "\n")
    info = AmdgpuCollector().collect(Host(root=tmp_path, load_module=fake_module_loader({})))
    assert (info.module_loaded, info.driver_kind, info.driver_version, info.source) == (False, "not_loaded", None,
                                                                                        "sysfs")
    assert [(g.bdf, g.device_id) for g in info.gpus] == [("0000:c1:00.0", "0x740f")]


def test_absent_without_module_gpu_or_amdsmi(tmp_path: Path) -> None:
    """No module, no /dev/kfd, no AMD PCI GPU: absent, and amdsmi (installed or not) is not even loaded."""
    _write(tmp_path, "sys/class/drm/version", "drm 1.1.0 20060810\n")
    loaded = []
    host = Host(root=tmp_path, load_module=lambda name: loaded.append(name) or make_fake_amdsmi({"gpus": []}))
    with pytest.raises(CollectorUnavailable) as caught:
        AmdgpuCollector().collect(host)
    assert caught.value.reason == f"no amdgpu kernel module and no AMD PCI GPU; {SMI_NOT_LOADED}"
    assert loaded == []


def test_gpu_without_driver_is_recorded_without_loading_amdsmi(tmp_path: Path) -> None:
    """An AMD GPU on the PCI bus with neither the module nor /dev/kfd: sysfs only, amdsmi's absence explained."""
    for name, value in (("vendor", "0x1002"), ("class", "0x038000"), ("device", "0x740f")):
        _write(tmp_path, f"sys/bus/pci/devices/0000:c1:00.0/{name}", value + "\n")
    loaded = []
    host = Host(root=tmp_path, load_module=lambda name: loaded.append(name) or make_fake_amdsmi({"gpus": []}))
    info = AmdgpuCollector().collect(host)
    assert (info.source, info.smi_unavailable_reason, loaded) == ("sysfs", SMI_NOT_LOADED, [])
