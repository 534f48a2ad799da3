"""AMD GPU driver (amdgpu) and per-GPU inventory: amdsmi first, sysfs when amdsmi cannot be used.

amdsmi can be missing (without libamd_smi.so, ``import amdsmi`` prints and raises KeyError), refuse to start (no GPU,
driver not loaded) or not support single queries on a given ASIC. None of that fails the collector: the first two
fall back to sysfs with the reason recorded as one short line (agent/gpu_libraries.py names each failure: ``amdsmi:
libamd_smi.so not found``, ``amdsmi: driver not loaded (AMDSMI_STATUS_DRIVER_NOT_LOADED)``), the last leaves that
one field None.

The driver's kind always comes from sysfs: only the DKMS (out-of-tree) amdgpu has /sys/module/amdgpu/version, and
when that file is missing amdsmi reports the kernel release (from /proc/version) as the "driver version".
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Dict, List, Literal, Mapping, Optional, Tuple

from agent.errors import CollectorUnavailable, HostReadError, LibraryUnavailable
from agent.frozen import Frozen, field, frozen_record
from agent.gpu_libraries import amdsmi_failure, reason, unavailable_reason
from agent.host import Host
from agent.hostfacts.kfd import gfx_target, read_kfd_nodes
from agent.lazyre import LazyPattern
from agent.log import get_logger

DriverKind = Literal["dkms", "inbox", "not_loaded"]
Source = Literal["amdsmi", "sysfs"]

log = get_logger("collectors.amdgpu")

AMD_PCI_VENDOR = "0x1002"
# PCI base classes of AMD GPUs: 0x03 display controller (Radeon, MI100/MI200) and 0x12 processing accelerator (MI300).
_GPU_CLASS_PREFIXES = ("0x03", "0x12")
MODULE_DIR = "/sys/module/amdgpu"
DRM_DIR = "/sys/class/drm"
PCI_DEVICES_DIR = "/sys/bus/pci/devices"
KFD_DEVICE = "/dev/kfd"
SMI_NOT_LOADED = reason("amdsmi", f"not loaded (no {MODULE_DIR}, no {KFD_DEVICE})")
_FW_PREFIX = "AMDSMI_FW_ID_"
_BYTES_PER_MIB = 1024 * 1024


@frozen_record
class AmdGpu(Frozen):
    """One AMD GPU (or partition) as the driver reports it."""

    bdf: str
    market_name: Optional[str] = None
    gfx_target: Optional[str] = None
    device_id: Optional[str] = None
    uuid: Optional[str] = None
    vbios_version: Optional[str] = None
    vbios_part_number: Optional[str] = None
    firmware: Dict[str, str] = field(default_factory=dict)
    vram_total_bytes: Optional[int] = None
    ecc_correctable_count: Optional[int] = None
    ecc_uncorrectable_count: Optional[int] = None


@frozen_record
class AmdgpuInfo(Frozen):
    """The loaded amdgpu driver and the GPUs it drives."""

    # Fields without a default come first (dataclass order; the JSON's keys are sorted either way).
    module_loaded: bool
    driver_kind: DriverKind
    source: Source
    driver_version: Optional[str] = None
    smi_library_version: Optional[str] = None
    smi_unavailable_reason: Optional[str] = None
    gpus: List[AmdGpu] = field(default_factory=list)


# --- pure parsers -------------------------------------------------------------------------------------------------

_BDF = LazyPattern(r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<device>[0-9a-fA-F]{1,2})"
                  r"\.(?P<function>[0-7])$")


@frozen_record
class PciAddress(Frozen):
    """The parts of a PCI address (``domain:bus:device.function``)."""

    domain: int
    bus: int
    device: int
    function: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"


def parse_bdf(text: str) -> PciAddress:
    """Parse ``0000:c1:00.0`` (or ``c1:00.0``); raises ValueError for text that is not a PCI address."""
    match = _BDF.match(text.strip())
    if match is None:
        raise ValueError(f"not a PCI address: {text!r}")
    return PciAddress(int(match.group("domain") or "0", 16), int(match.group("bus"), 16),
                      int(match.group("device"), 16), int(match.group("function")))


def kfd_location_id(address: PciAddress) -> int:
    """The ``location_id`` KFD topology gives a GPU: ``(bus << 8) | (device << 3) | function``."""
    return (address.bus << 8) | (address.device << 3) | address.function


def parse_uevent(text: str) -> Dict[str, str]:
    """A sysfs ``uevent`` file (``KEY=value`` lines) as a dict."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


@frozen_record
class EccCount(Frozen):
    """Corrected and uncorrected memory error counts."""

    correctable_count: int
    uncorrectable_count: int


def parse_ras_err_count(text: str) -> Optional[EccCount]:
    """A RAS ``<block>_err_count`` file (``ue: 0`` and ``ce: 0`` lines); None when it holds neither count."""
    counts: Dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("ue", "ce"):
            try:
                counts[key.strip()] = int(value.strip())
            except ValueError:
                continue
    if not counts:
        return None
    return EccCount(correctable_count=counts.get("ce", 0), uncorrectable_count=counts.get("ue", 0))


def format_smi_lib_version(version: Mapping[str, Any]) -> Optional[str]:
    """``amdsmi_get_lib_version()`` as text: ``24.6.2.0`` (year.major.minor.release, 6.x builds) or ``26.0.2``.

    Builds from 2024 return a ``year`` key; newer ones dropped it and count the major from 25 on.
    """
    try:
        parts = [int(version[key]) for key in ("major", "minor", "release")]
    except (KeyError, TypeError, ValueError):
        return None
    if version.get("year") is not None:
        parts.insert(0, int(version["year"]))
    return ".".join(str(part) for part in parts)


def firmware_block_name(fw_name: Any) -> str:
    """An ``AmdSmiFwBlock`` member by its short name: ``AMDSMI_FW_ID_PSP_SOSDRV`` -> ``PSP_SOSDRV``."""
    name = getattr(fw_name, "name", None) or str(fw_name)
    return name[len(_FW_PREFIX):] if name.startswith(_FW_PREFIX) else name


def classify_driver(module_present: bool, version_file: Optional[str]) -> Tuple[DriverKind, Optional[str]]:
    """(kind, version) from sysfs: a version file means the DKMS driver, a module without one the inbox driver."""
    if not module_present:
        return "not_loaded", None
    if version_file is None:
        return "inbox", None
    return "dkms", version_file


def known(value: Any) -> Optional[str]:
    """A string amdsmi or sysfs returned, stripped; None for empty and ``N/A``."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value).strip().strip("\x00").strip()
    if not text or text.upper() == "N/A":
        return None
    return text


def normalise_device_id(value: Any) -> Optional[str]:
    """A PCI device id as ``0x74a1`` from an int, ``0x74A1`` or ``74a1``; None when unknown."""
    if isinstance(value, int):
        return "0x{:04x}".format(value) if value > 0 else None
    text = known(value)
    if text is None:
        return None
    try:
        number = int(text, 16)
    except ValueError:
        return None
    return "0x{:04x}".format(number) if number > 0 else None


def normalise_gfx_target(value: Any) -> Optional[str]:
    """amdsmi's ``target_graphics_version`` (``gfx942``); None for ``gfx0`` and ``N/A``."""
    text = known(value)
    if text is None:
        return None
    text = text.lower()
    if not text.startswith("gfx") or text[3:] in ("", "0", "n/a"):
        return None
    return text


def _error_text(exc: BaseException) -> str:
    try:
        said = " ".join(str(exc).split())
    except Exception:  # noqa: BLE001 - a foreign exception's __str__ may itself fail
        said = ""
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


# --- amdsmi -------------------------------------------------------------------------------------------------------


class _SmiUnusable(Exception):
    """amdsmi is present but cannot describe this host; carries the reason for the snapshot."""


@frozen_record
class _SmiReading(Frozen):
    driver_version: Optional[str]
    library_version: Optional[str]
    gpus: List[AmdGpu]


# What a binding that does not match the host library raises instead of AmdSmiException (an unknown firmware id is
# a ValueError from AmdSmiFwBlock(...), a symbol missing from libamd_smi.so an AttributeError): it costs the field
# (or, at amdsmi_init, the amdsmi path), never the collector.
_BINDING_SKEW_ERRORS = (ValueError, KeyError, TypeError, AttributeError)


class _SmiSession:
    """Calls into one loaded amdsmi module, mapping its exceptions once, here."""

    def __init__(self, smi: ModuleType) -> None:
        self.smi = smi
        self.error = smi.AmdSmiException

    def call(self, subject: str, function: str, *args: Any) -> Any:
        """One query; None when the binding lacks it, the ASIC does not support it or it fails."""
        fn = getattr(self.smi, function, None)
        if fn is None:
            log.debug("amdsmi_call_missing", subject=subject, call=function)
            return None
        try:
            return fn(*args)
        except self.error as exc:
            log.debug("amdsmi_field_unavailable", subject=subject, call=function, error=_error_text(exc))
        except _BINDING_SKEW_ERRORS as exc:
            log.warning("amdsmi_field_failed", subject=subject, call=function, error=_error_text(exc))
        return None

    def read(self) -> _SmiReading:
        smi = self.smi
        try:
            smi.amdsmi_init()
        except (self.error, *_BINDING_SKEW_ERRORS) as exc:
            raise _SmiUnusable(reason("amdsmi", amdsmi_failure("amdsmi_init", exc))) from exc
        try:
            return self._read_initialised()
        finally:
            try:
                smi.amdsmi_shut_down()
            except self.error as exc:
                log.warning("amdsmi_shut_down_failed", error=_error_text(exc))

    def _read_initialised(self) -> _SmiReading:
        try:
            handles = list(self.smi.amdsmi_get_processor_handles())
        except (self.error, *_BINDING_SKEW_ERRORS) as exc:
            raise _SmiUnusable(reason("amdsmi", amdsmi_failure("amdsmi_get_processor_handles", exc))) from exc
        lib_version = self.call("library", "amdsmi_get_lib_version")
        driver_version = None
        gpus: Dict[str, AmdGpu] = {}
        for handle in handles:
            gpu = self._read_gpu(handle)
            if gpu is None or gpu.bdf in gpus:
                continue
            gpus[gpu.bdf] = gpu
            if driver_version is None:
                info = self.call(gpu.bdf, "amdsmi_get_gpu_driver_info", handle)
                driver_version = known(info.get("driver_version")) if isinstance(info, dict) else None
        if not gpus:
            raise _SmiUnusable(reason("amdsmi", "found no AMD GPU"))
        return _SmiReading(driver_version=driver_version,
                           library_version=format_smi_lib_version(lib_version) if isinstance(lib_version, dict)
                           else None,
                           gpus=[gpus[bdf] for bdf in sorted(gpus)])

    def _read_gpu(self, handle: Any) -> Optional[AmdGpu]:
        smi = self.smi
        try:
            bdf = str(parse_bdf(str(smi.amdsmi_get_gpu_device_bdf(handle))))
        except (self.error, ValueError) as exc:
            # Without a PCI address there is no identity to record the GPU under.
            log.warning("amdsmi_gpu_unreadable", error=_error_text(exc))
            return None
        asic = self.call(bdf, "amdsmi_get_gpu_asic_info", handle)
        asic = asic if isinstance(asic, dict) else {}
        vbios = self.call(bdf, "amdsmi_get_gpu_vbios_info", handle)
        vbios = vbios if isinstance(vbios, dict) else {}
        ecc = self.call(bdf, "amdsmi_get_gpu_total_ecc_count", handle)
        ecc = ecc if isinstance(ecc, dict) else {}
        return AmdGpu(
            bdf=bdf,
            market_name=known(asic.get("market_name")),
            gfx_target=normalise_gfx_target(asic.get("target_graphics_version")),
            device_id=normalise_device_id(asic.get("device_id")),
            uuid=known(self.call(bdf, "amdsmi_get_gpu_device_uuid", handle)),
            vbios_version=known(vbios.get("version")),
            vbios_part_number=known(vbios.get("part_number")),
            firmware=self._firmware(bdf, handle),
            vram_total_bytes=self._vram_total_bytes(bdf, handle),
            ecc_correctable_count=_int_or_none(ecc.get("correctable_count")),
            ecc_uncorrectable_count=_int_or_none(ecc.get("uncorrectable_count")),
        )

    def _firmware(self, bdf: str, handle: Any) -> Dict[str, str]:
        info = self.call(bdf, "amdsmi_get_fw_info", handle)
        entries = info.get("fw_list", []) if isinstance(info, dict) else []
        firmware = {}
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("fw_name") is None:
                continue
            version = known(entry.get("fw_version"))
            if version is not None:
                firmware[firmware_block_name(entry["fw_name"])] = version
        return firmware

    def _vram_total_bytes(self, bdf: str, handle: Any) -> Optional[int]:
        memory_type = getattr(self.smi, "AmdSmiMemoryType", None)
        if memory_type is not None:
            total = _int_or_none(self.call(bdf, "amdsmi_get_gpu_memory_total", handle, memory_type.VRAM))
            if total is not None:
                return total
        info = self.call(bdf, "amdsmi_get_gpu_vram_info", handle)
        size_mib = _int_or_none(info.get("vram_size")) if isinstance(info, dict) else None
        # amdsmi_vram_info_t.vram_size is in MiB.
        return size_mib * _BYTES_PER_MIB if size_mib else None


def _int_or_none(value: Any) -> Optional[int]:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def read_amdsmi(host: Host) -> _SmiReading:
    """Everything amdsmi says; raises _SmiUnusable (with the reason) when amdsmi cannot be loaded or started."""
    try:
        smi = host.load_module("amdsmi")
    except LibraryUnavailable as exc:
        raise _SmiUnusable(unavailable_reason(exc)) from exc
    if not isinstance(getattr(smi, "AmdSmiException", None), type):
        raise _SmiUnusable(reason("amdsmi", "module has no AmdSmiException: not the AMD SMI binding"))
    return _SmiSession(smi).read()


def smi_driver(module_present: bool, version_file: Optional[str], smi_version: Optional[str],
               kernel_release: Optional[str]) -> Tuple[DriverKind, Optional[str]]:
    """(kind, version) when amdsmi started, which proves that amdgpu is loaded.

    With /sys/module/amdgpu visible, sysfs decides the kind. Without it (a container that hides /sys/module), an
    amdsmi "driver version" equal to the kernel release is amdsmi's fallback for the inbox driver.
    """
    if module_present:
        kind, version = classify_driver(True, version_file)
        return kind, (smi_version or version) if kind == "dkms" else None
    if smi_version is None or smi_version == kernel_release:
        return "inbox", None
    return "dkms", smi_version


# --- sysfs --------------------------------------------------------------------------------------------------------

_DRM_CARD = LazyPattern(r"^card\d+$")


def _read_optional(host: Host, path: str) -> Optional[str]:
    """A one-value sysfs file; None when missing, empty or unreadable (an attribute the ASIC does not support)."""
    try:
        return host.read_first_line(path)
    except HostReadError as exc:
        log.debug("sysfs_attribute_unreadable", path=path, error=exc.reason)
        return None


def kfd_gfx_targets(host: Host) -> Dict[Tuple[int, int], str]:
    """gfx targets of the GPU nodes in the KFD topology, keyed by (PCI domain, location_id)."""
    targets: Dict[Tuple[int, int], str] = {}
    for props in read_kfd_nodes(str(host.root)):
        gfx = gfx_target(props.get("gfx_target_version", 0))
        if gfx is not None and "location_id" in props:
            targets.setdefault((props.get("domain", 0), props["location_id"]), gfx)
    return targets


def _ras_ecc(host: Host, device_dir: str) -> Optional[EccCount]:
    # Like amdsmi's total, the sum over every RAS block the driver exposes (umc, gfx, sdma, mmhub, ...).
    total: Optional[EccCount] = None
    for name in host.list_dir(f"{device_dir}/ras"):
        if not name.endswith("_err_count"):
            continue
        try:
            counts = parse_ras_err_count(host.read_text(f"{device_dir}/ras/{name}") or "")
        except HostReadError:
            continue
        if counts is None:
            continue
        total = counts if total is None else EccCount(total.correctable_count + counts.correctable_count,
                                                      total.uncorrectable_count + counts.uncorrectable_count)
    return total


def _card_address(host: Host, card: str) -> Optional[PciAddress]:
    device_dir = f"{DRM_DIR}/{card}/device"
    slot = parse_uevent(host.read_text(f"{device_dir}/uevent") or "").get("PCI_SLOT_NAME")
    if slot is None:
        link = host.read_link(device_dir)
        slot = link.rstrip("/").rsplit("/", 1)[-1] if link else None
    try:
        return parse_bdf(slot) if slot else None
    except ValueError:
        return None


def sysfs_gpus(host: Host) -> List[AmdGpu]:
    """AMD GPUs the amdgpu driver exposes under /sys/class/drm, sorted by PCI address."""
    targets = kfd_gfx_targets(host)
    gpus: Dict[str, AmdGpu] = {}
    for card in host.list_dir(DRM_DIR):
        if not _DRM_CARD.match(card):
            continue
        device_dir = f"{DRM_DIR}/{card}/device"
        if (_read_optional(host, f"{device_dir}/vendor") or "").lower() != AMD_PCI_VENDOR:
            continue
        address = _card_address(host, card)
        if address is None:
            log.warning("amdgpu_card_without_address", card=card)
            continue
        ecc = _ras_ecc(host, device_dir)
        gpus.setdefault(str(address), AmdGpu(
            bdf=str(address),
            gfx_target=targets.get((address.domain, kfd_location_id(address))),
            device_id=normalise_device_id(_read_optional(host, f"{device_dir}/device")),
            uuid=known(_read_optional(host, f"{device_dir}/unique_id")),
            # The sysfs vbios_version attribute holds the VBIOS part number (amdsmi's part_number, 113-...).
            vbios_part_number=known(_read_optional(host, f"{device_dir}/vbios_version")),
            vram_total_bytes=_int_or_none(_read_optional(host, f"{device_dir}/mem_info_vram_total")),
            ecc_correctable_count=ecc.correctable_count if ecc else None,
            ecc_uncorrectable_count=ecc.uncorrectable_count if ecc else None,
        ))
    return [gpus[bdf] for bdf in sorted(gpus)]


def pci_gpus(host: Host) -> List[AmdGpu]:
    """AMD display and accelerator PCI functions, whether or not a driver is bound to them."""
    found: Dict[str, AmdGpu] = {}
    for name in host.list_dir(PCI_DEVICES_DIR):
        base = f"{PCI_DEVICES_DIR}/{name}"
        vendor = (_read_optional(host, f"{base}/vendor") or "").lower()
        pci_class = (_read_optional(host, f"{base}/class") or "").lower()
        if vendor != AMD_PCI_VENDOR or not pci_class.startswith(_GPU_CLASS_PREFIXES):
            continue
        try:
            bdf = str(parse_bdf(name))
        except ValueError:
            continue
        found[bdf] = AmdGpu(bdf=bdf, device_id=normalise_device_id(_read_optional(host, f"{base}/device")))
    return [found[bdf] for bdf in sorted(found)]


class AmdgpuCollector:
    """Reads amdsmi when it starts, else sysfs; the driver's kind always comes from /sys/module/amdgpu."""

    name = "amdgpu"

    def collect(self, host: Host) -> AmdgpuInfo:
        module_present = host.is_dir(MODULE_DIR)
        version_file = _read_optional(host, f"{MODULE_DIR}/version")
        try:
            if not module_present and not host.exists(KFD_DEVICE):
                # amdsmi needs the driver (a container that hides /sys/module still has /dev/kfd): without either,
                # loading it (a binding and libamd_smi.so, milliseconds) could only say so.
                raise _SmiUnusable(SMI_NOT_LOADED)
            reading = read_amdsmi(host)
        except _SmiUnusable as exc:
            reason = str(exc)
        else:
            kind, version = smi_driver(module_present, version_file, reading.driver_version,
                                       _read_optional(host, "/proc/sys/kernel/osrelease"))
            return AmdgpuInfo(module_loaded=True, driver_version=version, driver_kind=kind, source="amdsmi",
                              smi_library_version=reading.library_version, gpus=reading.gpus)
        gpus = sysfs_gpus(host) if module_present else []
        if not gpus:
            # Driver not loaded, or not bound (vfio-pci): still list the cards PCI sees, so their presence is on record.
            gpus = pci_gpus(host)
        if not module_present and not gpus:
            raise CollectorUnavailable(f"no amdgpu kernel module and no AMD PCI GPU; {reason}")
        log.info("amdsmi_unavailable", reason=reason)
        kind, version = classify_driver(module_present, version_file)
        return AmdgpuInfo(module_loaded=module_present, driver_version=version, driver_kind=kind, source="sysfs",
                          smi_unavailable_reason=reason, gpus=gpus)
