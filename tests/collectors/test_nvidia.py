"""Tests for the NVIDIA collector: procfs parsers, the NVML path, and the procfs fallback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional

import pytest

from agent.collectors.nvidia import (
    NVML_NOT_LOADED,
    GpuInformation,
    NvidiaCollector,
    NvidiaGpu,
    NvidiaInfo,
    cuda_version_from_int,
    normalise_bdf,
    nvidia_pci_display_devices,
    parse_gpu_information,
)
from agent.errors import CollectorUnavailable
from agent.frozen import replace
from agent.host import Host
from agent.hostfacts.loaded_modules import parse_proc_driver_version
from tests.conftest import RECORDED, fake_module_loader, make_fixture_host
from tests.fakes.pynvml import make_fake_pynvml
from tests.fakes.runner import FakeRunner

SCENARIO = "nvidia-h200-ubuntu2404"

# /proc/driver/nvidia/version as the real H200 host prints it (open kernel module).
H200_PROC_VERSION = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
    "(dvs-builder@U22-I3-AF03-09-1)  Thu Nov 20 00:52:37 UTC 2025\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)
PROPRIETARY_535_PROC_VERSION = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n"
)
# Read verbatim on the real H200 machine behind `device` (2026-12-02): a Nix-built kernel, so no Ubuntu GCC string.
REAL_HOST_PROC_VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
                          "(nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n")
REAL_HOST_INFORMATION = (
    "Model: \t\t NVIDIA H200\nIRQ:   \t\t 41\nGPU UUID: \t GPU-4528813b-7d0d-9343-267c-1f9577804714\n"
    "Video BIOS: \t 96.00.a5.00.1a\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
    "Bus Location: \t 0000:00:06.0\nDevice Minor: \t 0\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n"
)
H200_INFORMATION = (
    "Model: \t\t NVIDIA H200\n"
    "IRQ:   \t\t 154\n"
    "GPU UUID: \t GPU-5f0a3c7e-9b1d-4e2a-8c6f-2d4b7a9e1f03\n"
    "Video BIOS: \t 96.00.a5.00.1a\n"
    "Bus Type: \t PCIe\n"
    "DMA Size: \t 52 bits\n"
    "DMA Mask: \t 0xfffffffffffff\n"
    "Bus Location: \t 0000:18:00.0\n"
    "Device Minor: \t 0\n"
    "GPU Firmware: \t 580.159.04\n"
    "GPU Excluded:\t No\n"
)
H200_GPU_NVML = NvidiaGpu(
    index=0, bdf="0000:18:00.0", name="NVIDIA H200", uuid="GPU-5f0a3c7e-9b1d-4e2a-8c6f-2d4b7a9e1f03",
    vbios_version="96.00.A5.00.1A", inforom_image_version="G520.0282.02.02", memory_total_bytes=143771 * 1024 ** 2,
    ecc_enabled=True, ecc_corrected_volatile_count=0, ecc_uncorrected_volatile_count=0,
)
H200_GPU_PROCFS = NvidiaGpu(index=0, bdf="0000:18:00.0", name="NVIDIA H200",
                            uuid="GPU-5f0a3c7e-9b1d-4e2a-8c6f-2d4b7a9e1f03", vbios_version="96.00.A5.00.1A")


def recorded_nvml() -> dict:
    return json.loads((RECORDED / SCENARIO / "nvml.json").read_text())


def fixture_host_with_nvml(data: dict):
    """The H200 fixture host, with a fake NVML built from ``data``; returns (host, fake module)."""
    nvml = make_fake_pynvml(data)
    return make_fixture_host(SCENARIO, modules={"pynvml": nvml}), nvml


def tree_host(root: Path, files: Dict[str, str], modules: Optional[dict] = None) -> Host:
    """A Host over a tree written into ``root`` from host paths to file contents."""
    root.mkdir(parents=True, exist_ok=True)
    for host_path, text in files.items():
        path = root / host_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Host(root=root, runner=FakeRunner(), load_module=fake_module_loader(modules or {}))


def pci_device(bdf: str, vendor: str, pci_class: str) -> Dict[str, str]:
    base = f"/sys/bus/pci/devices/{bdf}"
    return {f"{base}/vendor": f"{vendor}\n", f"{base}/class": f"{pci_class}\n"}


# --- pure parsers -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("00000000:18:00.0", "0000:18:00.0"),
    ("0000:18:00.0", "0000:18:00.0"),
    ("00000000:C1:00.0", "0000:c1:00.0"),
    ("0000:C1:00.1", "0000:c1:00.1"),
    ("18:00.0", "0000:18:00.0"),
    ("00010000:E1:00.0", "10000:e1:00.0"),
    ("  00000000:9A:00.0\n", "0000:9a:00.0"),
])
def test_normalise_bdf(text, expected):
    """NVML and procfs addresses become the lower-case sysfs form."""
    assert normalise_bdf(text) == expected


@pytest.mark.parametrize("text", ["", "GPU-5f0a3c7e", "0000:18:00", "0000:18:00.8", "zz:18:00.0"])
def test_normalise_bdf_rejects_non_addresses(text):
    """Text that is not a PCI address raises ValueError."""
    with pytest.raises(ValueError):
        normalise_bdf(text)


@pytest.mark.parametrize("text, expected", [
    (H200_PROC_VERSION, ("580.159.04", "open")),
    (REAL_HOST_PROC_VERSION, ("580.159.04", "open")),
    (PROPRIETARY_535_PROC_VERSION, ("535.183.01", "proprietary")),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  Release Build  "
     "(dvs-builder@U16-I3-B03-4-1)  Sun Jul 27 07:03:50 UTC 2025\n", ("580.65.06", "open")),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.256.02  Thu May  2 14:37:44 UTC 2024\n",
     ("470.256.02", "proprietary")),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157  Wed Oct 12 09:19:07 UTC 2022\n",
     ("390.157", "proprietary")),
    ("GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n", (None, None)),
    ("", (None, None)),
])
def test_parse_proc_driver_version(text, expected):
    """The NVRM line gives the driver version and whether the module is the open or the proprietary one."""
    assert parse_proc_driver_version(text) == expected


@pytest.mark.parametrize("text, expected", [
    (H200_INFORMATION, GpuInformation(bdf="0000:18:00.0", name="NVIDIA H200",
                                      uuid="GPU-5f0a3c7e-9b1d-4e2a-8c6f-2d4b7a9e1f03",
                                      vbios_version="96.00.A5.00.1A")),
    (REAL_HOST_INFORMATION, GpuInformation(bdf="0000:00:06.0", name="NVIDIA H200",
                                           uuid="GPU-4528813b-7d0d-9343-267c-1f9577804714",
                                           vbios_version="96.00.A5.00.1A")),
    # Before the GPU is initialised the driver leaves out the UUID and prints question marks for the VBIOS.
    ("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 142\nVideo BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\n"
     "Bus Location: \t 0000:9a:00.0\nDevice Minor: \t 3\n",
     GpuInformation(bdf="0000:9a:00.0", name="NVIDIA H100 80GB HBM3")),
    ("Model: \t\t NVIDIA A100-SXM4-80GB\nGPU UUID: \t GPU-0b3c\nVideo BIOS: \t N/A\nBus Location: \t 0000:C1:00.0\n",
     GpuInformation(bdf="0000:c1:00.0", name="NVIDIA A100-SXM4-80GB", uuid="GPU-0b3c")),
    ("Model: \t\t NVIDIA L4\nBus Location: \t not-an-address\n", GpuInformation(name="NVIDIA L4")),
    ("", GpuInformation()),
])
def test_parse_gpu_information(text, expected):
    """Known fields are read, unknown placeholders become None, and the VBIOS matches NVML's upper case."""
    assert parse_gpu_information(text) == expected


@pytest.mark.parametrize("value, expected", [
    (13000, "13.0"), (12040, "12.4"), (12090, "12.9"), (11080, "11.8"), (10020, "10.2"), (0, None), (-1, None),
])
def test_cuda_version_from_int(value, expected):
    """NVML's CUDA driver integer becomes major.minor."""
    assert cuda_version_from_int(value) == expected


# --- the NVML path ------------------------------------------------------------------------------------------------


def test_collects_h200_through_nvml():
    """On the H200 fixture host NVML gives every field, and procfs adds the module flavor."""
    host, nvml = fixture_host_with_nvml(recorded_nvml())
    info = NvidiaCollector().collect(host)
    assert info == NvidiaInfo(module_loaded=True, driver_version="580.159.04", module_flavor="open",
                              cuda_driver_version="13.0", source="nvml", gpus=[H200_GPU_NVML])
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"


def test_fixture_host_loads_the_recorded_nvml():
    """make_fixture_host wires tests/fixtures/recorded/<scenario>/nvml.json in as pynvml."""
    info = NvidiaCollector().collect(make_fixture_host(SCENARIO))
    assert info.source == "nvml" and info.gpus == [H200_GPU_NVML]


def test_old_bindings_returning_bytes_give_the_same_result():
    """Old bindings return bytes; the collector decodes them to the same snapshot."""
    host, _ = fixture_host_with_nvml({**recorded_nvml(), "string_type": "bytes"})
    info = NvidiaCollector().collect(host)
    assert info.driver_version == "580.159.04"
    assert info.gpus == [H200_GPU_NVML]


def test_unsupported_inforom_query_leaves_only_that_field_empty():
    """One per-GPU call raising NVMLError_NotSupported makes that field None and keeps the rest."""
    data = recorded_nvml()
    data["gpus"][0]["not_supported"] = ["nvmlDeviceGetInforomImageVersion"]
    host, _ = fixture_host_with_nvml(data)
    info = NvidiaCollector().collect(host)
    assert info.source == "nvml"
    assert info.gpus == [replace(H200_GPU_NVML, inforom_image_version=None)]


def test_gpu_without_ecc_support_has_no_ecc_fields():
    """A GPU without ECC (NotSupported for the mode and the counters) records None for all three ECC fields."""
    data = recorded_nvml()
    data["gpus"][0]["not_supported"] = ["nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors"]
    host, _ = fixture_host_with_nvml(data)
    gpu = NvidiaCollector().collect(host).gpus[0]
    assert (gpu.ecc_enabled, gpu.ecc_corrected_volatile_count, gpu.ecc_uncorrected_volatile_count) == (None,) * 3
    assert gpu.memory_total_bytes == H200_GPU_NVML.memory_total_bytes


def test_other_per_gpu_nvml_errors_also_leave_the_field_empty():
    """A per-GPU call failing with another NVMLError (GPU lost) does not fail the collector."""
    data = recorded_nvml()
    data["gpus"][0]["errors"] = {"nvmlDeviceGetVbiosVersion": "GpuIsLost"}
    host, _ = fixture_host_with_nvml(data)
    assert NvidiaCollector().collect(host).gpus == [replace(H200_GPU_NVML, vbios_version=None)]


def test_ecc_disabled_is_recorded_as_false():
    """The current ECC mode decides ecc_enabled, whatever mode is pending."""
    data = recorded_nvml()
    data["gpus"][0]["ecc_mode"] = {"current": 0, "pending": 1}
    host, _ = fixture_host_with_nvml(data)
    assert NvidiaCollector().collect(host).gpus[0].ecc_enabled is False


def test_volatile_ecc_counts_are_read_per_error_type():
    """Corrected and uncorrected volatile counts come from their own counters, not the aggregate ones."""
    data = recorded_nvml()
    data["gpus"][0]["ecc_errors"] = {"corrected": {"volatile": 7, "aggregate": 120},
                                     "uncorrected": {"volatile": 1, "aggregate": 3}}
    host, _ = fixture_host_with_nvml(data)
    gpu = NvidiaCollector().collect(host).gpus[0]
    assert (gpu.ecc_corrected_volatile_count, gpu.ecc_uncorrected_volatile_count) == (7, 1)


def test_missing_libcuda_leaves_cuda_driver_version_empty():
    """nvmlSystemGetCudaDriverVersion_v2 fails without libcuda.so; the rest of NVML is still used."""
    host, _ = fixture_host_with_nvml({**recorded_nvml(),
                                      "errors": {"nvmlSystemGetCudaDriverVersion_v2": "LibraryNotFound"}})
    info = NvidiaCollector().collect(host)
    assert info.source == "nvml" and info.cuda_driver_version is None and info.gpus == [H200_GPU_NVML]


def test_gpus_are_listed_in_nvml_order_with_normalised_addresses():
    """Several GPUs keep NVML's index and get sysfs-form addresses."""
    data = recorded_nvml()
    second = dict(data["gpus"][0], pci_bus_id="00000000:2A:00.0", uuid="GPU-2")
    data["gpus"].append(second)
    host, _ = fixture_host_with_nvml(data)
    gpus = NvidiaCollector().collect(host).gpus
    assert [(g.index, g.bdf, g.uuid) for g in gpus] == [(0, "0000:18:00.0", H200_GPU_NVML.uuid),
                                                       (1, "0000:2a:00.0", "GPU-2")]


def test_gpu_whose_handle_cannot_be_read_is_skipped():
    """A GPU NVML cannot open has no address to be recorded under and is left out; the others stay."""
    data = recorded_nvml()
    data["gpus"].append(dict(data["gpus"][0], pci_bus_id="00000000:2A:00.0",
                             errors={"nvmlDeviceGetPciInfo_v3": "GpuIsLost"}))
    host, _ = fixture_host_with_nvml(data)
    assert NvidiaCollector().collect(host).gpus == [H200_GPU_NVML]


# --- the procfs fallback ------------------------------------------------------------------------------------------


def test_host_without_nvml_library_falls_back_to_procfs():
    """A host without libnvidia-ml.so (the loader raises LibraryUnavailable) is read from /proc/driver/nvidia."""
    info = NvidiaCollector().collect(make_fixture_host(SCENARIO, modules={}))
    assert info == NvidiaInfo(module_loaded=True, driver_version="580.159.04", module_flavor="open",
                              cuda_driver_version=None, source="procfs",
                              nvml_unavailable_reason="NVML: not installed (fake host)",
                              gpus=[H200_GPU_PROCFS])


def test_foreign_root_uses_procfs():
    """Host.for_root on a fixture tree loads no GPU library and says so in the reason."""
    info = NvidiaCollector().collect(Host.for_root(str(make_fixture_host(SCENARIO).root)))
    assert info.source == "procfs" and info.nvml_unavailable_reason == \
        "NVML: not used when --root is not /"
    assert info.gpus == [H200_GPU_PROCFS]


@pytest.mark.parametrize("init_error, reason", [
    ("LibraryNotFound", "NVML: libnvidia-ml.so.1 not found"),
    ("DriverNotLoaded", "NVML: driver not loaded"),
    ("LibRmVersionMismatch", "NVML: driver and library versions differ (reboot, or reload the driver)"),
    ("NoPermission", "NVML: nvmlInit failed (NVMLError_NoPermission: Insufficient Permissions)"),
])
def test_nvml_init_failure_falls_back_to_procfs_with_the_reason(init_error, reason):
    """nvmlInit raising an NVMLError gives the procfs reading, with NVML's error as the reason."""
    host, nvml = fixture_host_with_nvml({**recorded_nvml(), "init_error": init_error})
    info = NvidiaCollector().collect(host)
    assert info.source == "procfs"
    assert info.nvml_unavailable_reason == reason
    assert info.driver_version == "580.159.04" and info.cuda_driver_version is None
    assert info.gpus == [H200_GPU_PROCFS]
    assert "nvmlShutdown" not in nvml.calls


def test_nvml_shut_down_even_when_a_query_after_init_fails():
    """A failure after nvmlInit still shuts NVML down, and the collector falls back to procfs."""
    host, nvml = fixture_host_with_nvml({**recorded_nvml(), "errors": {"nvmlDeviceGetCount": "Unknown"}})
    info = NvidiaCollector().collect(host)
    assert info.source == "procfs"
    assert info.nvml_unavailable_reason == "NVML: query after nvmlInit failed (NVMLError_Unknown: Unknown Error)"
    assert nvml.calls[-1] == "nvmlShutdown"


def test_proprietary_module_reads_version_from_procfs(tmp_path):
    """A proprietary module's /proc version line gives version and flavor; GPUs are indexed in PCI order."""
    host = tree_host(tmp_path, {
        "/proc/driver/nvidia/version": PROPRIETARY_535_PROC_VERSION,
        "/proc/driver/nvidia/gpus/0000:3b:00.0/information": "Model: \t\t Tesla T4\nBus Location: \t 0000:3b:00.0\n",
        "/proc/driver/nvidia/gpus/0000:1a:00.0/information": "Model: \t\t Tesla T4\nBus Location: \t 0000:1a:00.0\n",
        "/sys/module/nvidia/version": "535.183.01\n",
    })
    info = NvidiaCollector().collect(host)
    assert (info.driver_version, info.module_flavor, info.source) == ("535.183.01", "proprietary", "procfs")
    assert [(g.index, g.bdf) for g in info.gpus] == [(0, "0000:1a:00.0"), (1, "0000:3b:00.0")]


def test_sys_module_version_is_used_when_proc_has_none(tmp_path):
    """Without /proc/driver/nvidia/version the driver version comes from /sys/module/nvidia/version."""
    host = tree_host(tmp_path, {"/sys/module/nvidia/version": "580.159.04\n"})
    info = NvidiaCollector().collect(host)
    assert (info.module_loaded, info.driver_version, info.module_flavor) == (True, "580.159.04", None)


def test_gpu_present_but_driver_not_loaded(tmp_path):
    """NVIDIA GPUs in sysfs with no module loaded are recorded by address, with module_loaded false."""
    host = tree_host(tmp_path, {**pci_device("0000:18:00.0", "0x10de", "0x030200"),
                                **pci_device("0000:00:02.0", "0x8086", "0x030000")})
    info = NvidiaCollector().collect(host)
    assert info == NvidiaInfo(module_loaded=False, source="procfs", nvml_unavailable_reason=NVML_NOT_LOADED,
                              gpus=[NvidiaGpu(index=0, bdf="0000:18:00.0")])


def test_nvidia_pci_display_devices_ignores_other_classes_and_vendors(tmp_path):
    """Only NVIDIA display (0x03xxxx) functions count: not NVSwitches, HDMI audio or other vendors' GPUs."""
    host = tree_host(tmp_path, {**pci_device("0000:18:00.0", "0x10de", "0x030200"),
                                **pci_device("0000:01:00.0", "0x10de", "0x030000"),
                                **pci_device("0000:01:00.1", "0x10de", "0x040300"),
                                **pci_device("0000:05:00.0", "0x10de", "0x068000"),
                                **pci_device("0000:c1:00.0", "0x1002", "0x038000")})
    assert nvidia_pci_display_devices(host) == ["0000:01:00.0", "0000:18:00.0"]


def test_gpu_less_host_is_unavailable(tmp_path):
    """No module, no /proc/driver/nvidia, no NVIDIA PCI device and no NVML: the collector is absent."""
    host = tree_host(tmp_path, {"/etc/os-release": "ID=ubuntu\n",
                                **pci_device("0000:c1:00.0", "0x1002", "0x038000")})
    with pytest.raises(CollectorUnavailable, match="no nvidia kernel module"):
        NvidiaCollector().collect(host)


def test_gpu_less_host_with_nvml_bindings_installed_is_unavailable(tmp_path):
    """pynvml installed on a host without the driver is not even loaded: absent, not broken, saying why."""
    loaded = []
    host = tree_host(tmp_path, {"/etc/os-release": "ID=ubuntu\n"})
    host = replace(host, load_module=lambda name: loaded.append(name) or make_fake_pynvml(recorded_nvml()))
    with pytest.raises(CollectorUnavailable) as caught:
        NvidiaCollector().collect(host)
    assert caught.value.reason == f"no nvidia kernel module, /proc/driver/nvidia or NVIDIA PCI GPU; {NVML_NOT_LOADED}"
    assert loaded == []


def test_nvml_is_tried_where_only_the_control_device_shows_the_driver(tmp_path):
    """A container without /proc/driver/nvidia or /sys/module still gets /dev/nvidiactl: NVML is asked there."""
    host = tree_host(tmp_path, {"/dev/nvidiactl": ""}, modules={"pynvml": make_fake_pynvml(recorded_nvml())})
    info = NvidiaCollector().collect(host)
    assert (info.source, info.module_loaded, info.nvml_unavailable_reason) == ("nvml", True, None)
    assert [g.bdf for g in info.gpus] == ["0000:18:00.0"]
