"""NVIDIA driver and per-GPU inventory: NVML (nvidia-ml-py) first, /proc/driver/nvidia and sysfs otherwise.

NVML can be missing (no libnvidia-ml.so), refuse to start (driver not loaded, or "Driver/library version mismatch"
right after a driver upgrade without reboot) or not support single queries on a given GPU. None of that fails the
collector: the first two fall back to procfs with the reason recorded as one short line (agent/gpu_libraries.py:
``NVML: driver not loaded``), the last leaves that one field None.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, List, Literal, Optional

from agent.errors import CollectorUnavailable, LibraryUnavailable
from agent.frozen import Frozen, field, frozen_record
from agent.gpu_libraries import nvml_failure, reason, unavailable_reason
from agent.host import Host
from agent.hostfacts.loaded_modules import parse_proc_driver_version
from agent.lazyre import LazyPattern
from agent.log import get_logger

Source = Literal["nvml", "procfs"]
ModuleFlavor = Literal["open", "proprietary"]

log = get_logger("collectors.nvidia")

NVIDIA_PCI_VENDOR = "0x10de"
# PCI base class 0x03 (display controller): VGA 0x0300xx and 3D controller 0x0302xx (the data-center cards).
_DISPLAY_CLASS_PREFIX = "0x03"
PROC_DRIVER_DIR = "/proc/driver/nvidia"
CONTROL_DEVICE = "/dev/nvidiactl"
NVML_NOT_LOADED = reason("pynvml", f"not loaded (no /sys/module/nvidia, {PROC_DRIVER_DIR} or {CONTROL_DEVICE})")


@frozen_record
class NvidiaGpu(Frozen):
    """One NVIDIA GPU."""

    index: int
    bdf: str
    name: Optional[str] = None
    uuid: Optional[str] = None
    vbios_version: Optional[str] = None
    inforom_image_version: Optional[str] = None
    memory_total_bytes: Optional[int] = None
    ecc_enabled: Optional[bool] = None
    ecc_corrected_volatile_count: Optional[int] = None
    ecc_uncorrected_volatile_count: Optional[int] = None


@frozen_record
class NvidiaInfo(Frozen):
    """The loaded nvidia driver and the GPUs it drives."""

    # Fields without a default come first (dataclass order; the JSON's keys are sorted either way).
    module_loaded: bool
    source: Source
    driver_version: Optional[str] = None
    module_flavor: Optional[ModuleFlavor] = None
    cuda_driver_version: Optional[str] = None
    nvml_unavailable_reason: Optional[str] = None
    gpus: List[NvidiaGpu] = field(default_factory=list)


# --- pure parsers -------------------------------------------------------------------------------------------------

_BDF = LazyPattern(r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<device>[0-9a-fA-F]{1,2})"
                  r"\.(?P<function>[0-7])$")


def normalise_bdf(text: str) -> str:
    """A PCI address in the lower-case sysfs form ``0000:18:00.0``; NVML's 8-hex-digit domain is shortened.

    Domains wider than 4 hex digits (VMD puts devices in domain 10000) keep their digits, as sysfs does.
    Raises ValueError for text that is not a PCI address.
    """
    match = _BDF.match(text.strip())
    if match is None:
        raise ValueError(f"not a PCI address: {text!r}")
    domain = int(match.group("domain") or "0", 16)
    return "{:04x}:{:02x}:{:02x}.{:x}".format(domain, int(match.group("bus"), 16), int(match.group("device"), 16),
                                              int(match.group("function")))


@frozen_record
class GpuInformation(Frozen):
    """What /proc/driver/nvidia/gpus/<bdf>/information says about one GPU; None where it says nothing usable."""

    bdf: Optional[str] = None
    name: Optional[str] = None
    uuid: Optional[str] = None
    vbios_version: Optional[str] = None


def _known(value: str) -> Optional[str]:
    # The driver prints "??.??.??.??.??" before the GPU is initialised; emulators print "N/A".
    value = value.strip()
    if not value or "?" in value or value.upper() == "N/A":
        return None
    return value


def parse_gpu_information(text: str) -> GpuInformation:
    """Parse a ``/proc/driver/nvidia/gpus/<bdf>/information`` file (``Key: \\t value`` lines).

    The VBIOS is upper-cased: the driver prints it with ``%02x`` while NVML (and nvidia-smi) print ``96.00.AF.00.01``,
    and both sources must give the same snapshot.
    """
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value
    bdf = _known(fields.get("Bus Location", ""))
    try:
        bdf = normalise_bdf(bdf) if bdf else None
    except ValueError:
        bdf = None
    vbios = _known(fields.get("Video BIOS", ""))
    return GpuInformation(bdf=bdf, name=_known(fields.get("Model", "")), uuid=_known(fields.get("GPU UUID", "")),
                          vbios_version=vbios.upper() if vbios else None)


def module_flavor(text: Optional[str]) -> Optional[ModuleFlavor]:
    """``open`` or ``proprietary`` as the snapshot's type; None for anything else."""
    return "open" if text == "open" else "proprietary" if text == "proprietary" else None


def cuda_version_from_int(value: int) -> Optional[str]:
    """NVML's CUDA driver version integer as ``major.minor`` (13000 -> ``13.0``, 12040 -> ``12.4``); None if unset."""
    if value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def _text(value: Any) -> Optional[str]:
    """A string NVML returned: ``str`` in current bindings, ``bytes`` in old ones; None when empty."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if value is None:
        return None
    value = str(value).strip()
    return value or None


# --- NVML ---------------------------------------------------------------------------------------------------------


class _NvmlUnusable(Exception):
    """NVML is present but cannot describe this host; carries the reason for the snapshot."""


@frozen_record
class _NvmlReading(Frozen):
    driver_version: Optional[str]
    cuda_driver_version: Optional[str]
    gpus: List[NvidiaGpu]


def _error_text(exc: Exception) -> str:
    try:
        said = str(exc)
    except Exception:  # noqa: BLE001 - NVMLError.__str__ may call into a library that is not there
        said = ""
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


class _NvmlSession:
    """Calls into one loaded pynvml module, mapping its NVMLError once, here."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.error = nvml.NVMLError

    def is_not_supported(self, exc: Exception) -> bool:
        return getattr(exc, "value", None) == self.nvml.NVML_ERROR_NOT_SUPPORTED

    def field(self, index: int, call: str, read: Callable[[], Any]) -> Any:
        """One per-GPU query; None when the GPU does not support it or it fails."""
        try:
            return read()
        except self.error as exc:
            if self.is_not_supported(exc):
                log.debug("nvml_field_not_supported", gpu_index=index, call=call)
            else:
                log.warning("nvml_field_failed", gpu_index=index, call=call, error=_error_text(exc))
            return None

    def read(self) -> _NvmlReading:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except self.error as exc:
            raise _NvmlUnusable(reason("pynvml", nvml_failure("nvmlInit", exc))) from exc
        try:
            return self._read_initialised()
        finally:
            try:
                nvml.nvmlShutdown()
            except self.error as exc:
                log.warning("nvml_shutdown_failed", error=_error_text(exc))

    def _read_initialised(self) -> _NvmlReading:
        nvml = self.nvml
        try:
            driver_version = _text(nvml.nvmlSystemGetDriverVersion())
            count = int(nvml.nvmlDeviceGetCount())
        except self.error as exc:
            raise _NvmlUnusable(reason("pynvml", nvml_failure("query after nvmlInit", exc))) from exc
        cuda_driver_version = None
        get_cuda = getattr(nvml, "nvmlSystemGetCudaDriverVersion_v2", None) or nvml.nvmlSystemGetCudaDriverVersion
        try:
            cuda_driver_version = cuda_version_from_int(int(get_cuda()))
        except self.error as exc:
            # _v2 reads libcuda.so: a host with the kernel driver but no CUDA user-space library has no answer.
            log.info("nvml_cuda_driver_version_unavailable", error=_error_text(exc))
        gpus = []
        for index in range(count):
            gpu = self._read_gpu(index)
            if gpu is not None:
                gpus.append(gpu)
        return _NvmlReading(driver_version=driver_version, cuda_driver_version=cuda_driver_version, gpus=gpus)

    def _read_gpu(self, index: int) -> Optional[NvidiaGpu]:
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            get_pci = getattr(nvml, "nvmlDeviceGetPciInfo_v3", None) or nvml.nvmlDeviceGetPciInfo
            bdf = normalise_bdf(_text(get_pci(handle).busId) or "")
        except (self.error, ValueError) as exc:
            # Without a handle or PCI address there is no identity to record the GPU under (GPU lost, no access).
            log.warning("nvml_gpu_unreadable", gpu_index=index, error=_error_text(exc))
            return None

        def field(call: str, read: Callable[[], Any]) -> Any:
            return self.field(index, call, read)

        memory = field("nvmlDeviceGetMemoryInfo", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        ecc_mode = field("nvmlDeviceGetEccMode", lambda: nvml.nvmlDeviceGetEccMode(handle))
        corrected = field("nvmlDeviceGetTotalEccErrors", lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC))
        uncorrected = field("nvmlDeviceGetTotalEccErrors", lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))
        return NvidiaGpu(
            index=index,
            bdf=bdf,
            name=_text(field("nvmlDeviceGetName", lambda: nvml.nvmlDeviceGetName(handle))),
            uuid=_text(field("nvmlDeviceGetUUID", lambda: nvml.nvmlDeviceGetUUID(handle))),
            vbios_version=_text(field("nvmlDeviceGetVbiosVersion", lambda: nvml.nvmlDeviceGetVbiosVersion(handle))),
            inforom_image_version=_text(field("nvmlDeviceGetInforomImageVersion",
                                              lambda: nvml.nvmlDeviceGetInforomImageVersion(handle))),
            memory_total_bytes=int(memory.total) if memory is not None else None,
            # nvmlDeviceGetEccMode gives [current, pending]; the current mode is what the GPU runs with now.
            ecc_enabled=ecc_mode[0] == nvml.NVML_FEATURE_ENABLED if ecc_mode is not None else None,
            ecc_corrected_volatile_count=int(corrected) if corrected is not None else None,
            ecc_uncorrected_volatile_count=int(uncorrected) if uncorrected is not None else None,
        )


def _read_nvml(host: Host) -> _NvmlReading:
    """Everything NVML says; raises _NvmlUnusable (with the reason) when NVML cannot be loaded or started."""
    try:
        nvml = host.load_module("pynvml")
    except LibraryUnavailable as exc:
        raise _NvmlUnusable(unavailable_reason(exc)) from exc
    return _NvmlSession(nvml).read()


# --- procfs / sysfs -----------------------------------------------------------------------------------------------


def nvidia_pci_display_devices(host: Host) -> List[str]:
    """BDFs of NVIDIA display/3D controllers in sysfs, whether or not a driver is bound to them."""
    found = []
    for name in host.list_dir("/sys/bus/pci/devices"):
        base = f"/sys/bus/pci/devices/{name}"
        vendor = (host.read_first_line(f"{base}/vendor") or "").lower()
        pci_class = (host.read_first_line(f"{base}/class") or "").lower()
        if vendor == NVIDIA_PCI_VENDOR and pci_class.startswith(_DISPLAY_CLASS_PREFIX):
            try:
                found.append(normalise_bdf(name))
            except ValueError:
                continue
    return sorted(found)


def procfs_gpus(host: Host) -> List[NvidiaGpu]:
    """GPUs from /proc/driver/nvidia/gpus/<bdf>/information, indexed in PCI order as NVML enumerates them."""
    infos = []
    for entry in host.list_dir(f"{PROC_DRIVER_DIR}/gpus"):
        text = host.read_text(f"{PROC_DRIVER_DIR}/gpus/{entry}/information")
        if text is None:
            continue
        info = parse_gpu_information(text)
        bdf = info.bdf
        if bdf is None:
            try:
                bdf = normalise_bdf(entry)
            except ValueError:
                log.warning("nvidia_gpu_information_without_address", entry=entry)
                continue
        infos.append((bdf, info))
    infos.sort(key=lambda pair: pair[0])
    return [NvidiaGpu(index=i, bdf=bdf, name=info.name, uuid=info.uuid, vbios_version=info.vbios_version)
            for i, (bdf, info) in enumerate(infos)]


class NvidiaCollector:
    """Reads NVML when it starts, else /proc/driver/nvidia; module flavor always comes from procfs."""

    name = "nvidia"

    def collect(self, host: Host) -> NvidiaInfo:
        proc_version_text = host.read_text(f"{PROC_DRIVER_DIR}/version")
        proc_version, flavor_text = parse_proc_driver_version(proc_version_text) if proc_version_text else (None, None)
        flavor = module_flavor(flavor_text)
        module_loaded = host.exists("/sys/module/nvidia") or proc_version_text is not None
        try:
            if not module_loaded and not host.exists(CONTROL_DEVICE):
                # NVML needs the driver (a container without /proc/driver/nvidia still has /dev/nvidiactl): without
                # either, loading it (the binding and libnvidia-ml, milliseconds) could only say so.
                raise _NvmlUnusable(NVML_NOT_LOADED)
            reading = _read_nvml(host)
        except _NvmlUnusable as exc:
            reason = str(exc)
        else:
            # NVML starting proves the kernel module is loaded, even where a container hides /sys/module.
            return NvidiaInfo(module_loaded=True, driver_version=reading.driver_version or proc_version,
                              module_flavor=flavor, cuda_driver_version=reading.cuda_driver_version, source="nvml",
                              gpus=reading.gpus)
        pci_gpus = nvidia_pci_display_devices(host)
        if not module_loaded and not host.exists(PROC_DRIVER_DIR) and not pci_gpus:
            raise CollectorUnavailable(f"no nvidia kernel module, {PROC_DRIVER_DIR} or NVIDIA PCI GPU; {reason}")
        log.info("nvml_unavailable", reason=reason)
        gpus = procfs_gpus(host)
        if not gpus:
            # Driver not loaded (or not bound): still list the cards sysfs sees, so their presence is on record.
            gpus = [NvidiaGpu(index=i, bdf=bdf) for i, bdf in enumerate(pci_gpus)]
        return NvidiaInfo(module_loaded=module_loaded,
                          driver_version=proc_version or host.read_first_line("/sys/module/nvidia/version"),
                          module_flavor=flavor, cuda_driver_version=None, source="procfs",
                          nvml_unavailable_reason=reason, gpus=gpus)
