"""A fake ``pynvml`` module driven by a JSON-able dict, implementing just the NVML calls gpuguard makes.

Shape of the dict (every key optional except where noted)::

    {
      "init_error": "DriverNotLoaded",          # nvmlInit raises NVMLError_<name>
      "driver_version": "580.159.04",
      "cuda_driver_version": 13000,             # what nvmlSystemGetCudaDriverVersion(_v2) return
      "string_type": "bytes",                   # return bytes, as old bindings did; default "str"
      "errors": {"nvmlSystemGetCudaDriverVersion_v2": "LibraryNotFound"},   # system calls that fail
      "gpus": [{
        "pci_bus_id": "00000000:18:00.0",       # required; NVML's form, 8-hex-digit domain
        "name": "NVIDIA H200", "uuid": "GPU-...", "vbios_version": "96.00.AF.00.01",
        "inforom_image_version": "G525.0225.00.05", "memory_total_bytes": 150754820096,
        "ecc_mode": {"current": 1, "pending": 1},
        "ecc_errors": {"corrected": {"volatile": 0, "aggregate": 0}, "uncorrected": {"volatile": 0, "aggregate": 0}},
        "utilization": [0, 0, 97],              # nvmlDeviceGetUtilizationRates(h).gpu, call by call (the last repeats)
        "memory_used_bytes": [536870912],       # memory in use while the matching utilization call is the latest
        "not_supported": ["nvmlDeviceGetInforomImageVersion"],   # these calls raise NVMLError_NotSupported
        "errors": {"nvmlDeviceGetVbiosVersion": "GpuIsLost"}     # these calls raise NVMLError_<name>
      }]
    }

NVMLError behaves like the real one: ``NVMLError(code)`` becomes the matching ``NVMLError_<Name>`` subclass, each
subclass carries ``.value``, and ``str()`` gives NVML's message. Calls before nvmlInit raise NVMLError_Uninitialized,
and ``module.calls`` records every call so a test can check that nvmlShutdown ran.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Dict, List

# The NVML_ERROR_* codes of nvml.h that tests use, with NVML's own messages.
ERROR_CODES: Dict[str, int] = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_UNKNOWN": 999,
}
_MESSAGES = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions", 6: "Not Found",
    9: "Driver Not Loaded", 12: "NVML Shared Library Not Found", 13: "Function Not Found",
    14: "Corrupted infoROM", 15: "GPU is lost", 18: "RM has detected an NVML/RM version mismatch.",
    999: "Unknown Error",
}
CONSTANTS = {
    "NVML_FEATURE_DISABLED": 0,
    "NVML_FEATURE_ENABLED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_AGGREGATE_ECC": 1,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
}


def error_class_name(constant: str) -> str:
    """``NVML_ERROR_LIB_RM_VERSION_MISMATCH`` -> ``NVMLError_LibRmVersionMismatch``, as pynvml names them."""
    words = constant[len("NVML_ERROR_"):].split("_")
    return "NVMLError_" + "".join(word.capitalize() for word in words)


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class _PciInfo:
    def __init__(self, bus_id: str) -> None:
        self.busId = bus_id
        domain, bus, rest = bus_id.split(":")
        self.domain, self.bus, self.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)


class _Memory:
    def __init__(self, total: int, used: int = 0) -> None:
        self.total, self.free, self.used = total, total - used, used


class _Utilization:
    def __init__(self, gpu: int) -> None:
        self.gpu, self.memory = gpu, 0


def make_fake_pynvml(data: Dict[str, Any]) -> types.ModuleType:
    """A fresh module object named ``pynvml`` that answers from ``data``."""
    module = types.ModuleType("pynvml", "fake pynvml for tests")
    module.calls = []  # type: ignore[attr-defined]
    state = {"initialised": 0}
    utilization_calls: Dict[int, int] = {}
    for name, value in {**ERROR_CODES, **CONSTANTS}.items():
        setattr(module, name, value)

    class NVMLError(Exception):
        _valClassMapping: Dict[int, type] = {}

        def __new__(cls, value: int) -> "NVMLError":
            if cls is NVMLError:
                cls = NVMLError._valClassMapping.get(value, cls)
            obj = Exception.__new__(cls)
            obj.value = value
            return obj

        def __init__(self, value: int = 0) -> None:
            super().__init__(self.value)

        def __str__(self) -> str:
            return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")

    NVMLError.__module__ = "pynvml"
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    for constant, code in ERROR_CODES.items():
        def new(cls: type, *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(cls, _code)

        subclass = type(error_class_name(constant), (NVMLError,), {"__new__": new, "__module__": "pynvml"})
        NVMLError._valClassMapping[code] = subclass
        setattr(module, subclass.__name__, subclass)

    def raise_named(error_name: str) -> None:
        cls = getattr(module, f"NVMLError_{error_name}", None)
        if cls is None:
            raise AssertionError(f"fake pynvml has no NVMLError_{error_name}")
        raise cls()

    as_bytes = data.get("string_type") == "bytes"
    system_errors: Dict[str, str] = data.get("errors", {})
    gpus: List[Dict[str, Any]] = data.get("gpus", [])

    def out(value: Any) -> Any:
        return value.encode() if as_bytes and isinstance(value, str) else value

    def api(func: Callable[..., Any]) -> Callable[..., Any]:
        name = func.__name__

        def call(*args: Any) -> Any:
            module.calls.append(name)  # type: ignore[attr-defined]
            if name not in ("nvmlInit", "nvmlShutdown") and not state["initialised"]:
                raise NVMLError(ERROR_CODES["NVML_ERROR_UNINITIALIZED"])
            if name in system_errors:
                raise_named(system_errors[name])
            if args and isinstance(args[0], _Handle):
                gpu = gpus[args[0].index]
                if name in gpu.get("not_supported", ()):
                    raise NVMLError(ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"])
                if name in gpu.get("errors", {}):
                    raise_named(gpu["errors"][name])
            return out(func(*args))

        call.__name__ = name
        setattr(module, name, call)
        return call

    def gpu_of(handle: _Handle) -> Dict[str, Any]:
        return gpus[handle.index]

    def required(handle: _Handle, key: str) -> Any:
        value = gpu_of(handle).get(key)
        if value is None:
            raise NVMLError(ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"])
        return value

    @api
    def nvmlInit() -> None:
        if data.get("init_error"):
            raise_named(data["init_error"])
        state["initialised"] += 1

    @api
    def nvmlShutdown() -> None:
        if not state["initialised"]:
            raise NVMLError(ERROR_CODES["NVML_ERROR_UNINITIALIZED"])
        state["initialised"] -= 1

    @api
    def nvmlSystemGetDriverVersion() -> str:
        return data["driver_version"]

    @api
    def nvmlSystemGetCudaDriverVersion() -> int:
        return int(data["cuda_driver_version"])

    @api
    def nvmlSystemGetCudaDriverVersion_v2() -> int:
        return int(data["cuda_driver_version"])

    @api
    def nvmlDeviceGetCount() -> int:
        return len(gpus)

    @api
    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        if not 0 <= index < len(gpus):
            raise NVMLError(ERROR_CODES["NVML_ERROR_INVALID_ARGUMENT"])
        return _Handle(index)

    @api
    def nvmlDeviceGetPciInfo_v3(handle: _Handle) -> _PciInfo:
        info = _PciInfo(gpu_of(handle)["pci_bus_id"])
        info.busId = out(info.busId)
        return info

    @api
    def nvmlDeviceGetName(handle: _Handle) -> str:
        return required(handle, "name")

    @api
    def nvmlDeviceGetUUID(handle: _Handle) -> str:
        return required(handle, "uuid")

    @api
    def nvmlDeviceGetVbiosVersion(handle: _Handle) -> str:
        return required(handle, "vbios_version")

    @api
    def nvmlDeviceGetInforomImageVersion(handle: _Handle) -> str:
        return required(handle, "inforom_image_version")

    @api
    def nvmlDeviceGetPciInfo(handle: _Handle) -> _PciInfo:
        info = _PciInfo(gpu_of(handle)["pci_bus_id"])
        info.busId = out(info.busId)
        return info

    def scripted(handle: _Handle, key: str, default: int) -> int:
        """The value of ``key``'s script for the latest utilization call (the last one repeats)."""
        values = gpu_of(handle).get(key) or [default]
        return int(values[min(max(utilization_calls.get(handle.index, 0) - 1, 0), len(values) - 1)])

    @api
    def nvmlDeviceGetUtilizationRates(handle: _Handle) -> _Utilization:
        required(handle, "utilization")
        utilization_calls[handle.index] = utilization_calls.get(handle.index, 0) + 1
        return _Utilization(scripted(handle, "utilization", 0))

    @api
    def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> List[Any]:
        return []

    @api
    def nvmlDeviceGetMemoryInfo(handle: _Handle) -> _Memory:
        return _Memory(int(required(handle, "memory_total_bytes")), scripted(handle, "memory_used_bytes", 0))

    @api
    def nvmlDeviceGetEccMode(handle: _Handle) -> List[int]:
        mode = required(handle, "ecc_mode")
        return [int(mode["current"]), int(mode["pending"])]

    @api
    def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
        kind = {CONSTANTS["NVML_MEMORY_ERROR_TYPE_CORRECTED"]: "corrected",
                CONSTANTS["NVML_MEMORY_ERROR_TYPE_UNCORRECTED"]: "uncorrected"}.get(error_type)
        counter = {CONSTANTS["NVML_VOLATILE_ECC"]: "volatile", CONSTANTS["NVML_AGGREGATE_ECC"]: "aggregate"} \
            .get(counter_type)
        if kind is None or counter is None:
            raise NVMLError(ERROR_CODES["NVML_ERROR_INVALID_ARGUMENT"])
        return int(required(handle, "ecc_errors")[kind][counter])

    return module
