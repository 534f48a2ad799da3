"""A fake ``amdsmi`` module driven by a JSON-able dict, implementing just the AMD SMI calls gpuguard makes.

Shape of the dict (every key optional)::

    {
      "init_error": true,                        # amdsmi_init raises AmdSmiLibraryException (driver not loaded);
                                                 # a status name ("AMDSMI_STATUS_INIT_ERROR") picks the code
      "lib_version": {"year": 24, "major": 6, "minor": 2, "release": 0, "build": "..."},
      "rocm_version": [true, "7.0.2"],           # amdsmi_get_rocm_version() exists only when this key is given
      "missing_functions": ["amdsmi_get_gpu_memory_total"],     # calls an older binding does not have
      "errors": {"amdsmi_get_lib_version": "AMDSMI_STATUS_NOT_SUPPORTED"},   # system calls that raise
      "gpus": [{
        "bdf": "0000:05:00.0", "uuid": "...",
        "driver_info": {"driver_name": "amdgpu", "driver_version": "6.8.5", "driver_date": "2015/01/01 00:00"},
        "asic_info": {"market_name": "AMD Instinct MI300X", "device_id": "0x74a1",
                      "target_graphics_version": "gfx942", ...},
        "vbios_info": {"name": "...", "build_date": "...", "part_number": "113-...", "version": "022.040..."},
        "fw_list": [{"fw_name": "PM", "fw_version": "85.99.0"}],   # names without the AMDSMI_FW_ID_ prefix
        "vram_total_bytes": 206141652992,        # what amdsmi_get_gpu_memory_total(h, VRAM) returns
        "vram_info": {"vram_type": 9, "vram_vendor": "HYNIX", "vram_size": 196592, ...},   # vram_size in MiB
        "ecc": {"correctable_count": 0, "uncorrectable_count": 0, "deferred_count": 0},
        "errors": {"amdsmi_get_fw_info": "AMDSMI_STATUS_NOT_SUPPORTED"}   # per-GPU calls that raise
      }]
    }

Like the real binding, calls take opaque processor handles and raise AmdSmiParameterException for anything else,
``amdsmi_get_gpu_memory_total`` insists on an AmdSmiMemoryType, ``fw_name`` is an AmdSmiFwBlock member, calls
before amdsmi_init raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT), and ``module.calls`` records every call.
"""

from __future__ import annotations

import enum
import types
from typing import Any, Callable, Dict, List, Optional

# The amdsmi_status_t codes tests use, as in amdsmi_wrapper.py, with the binding's own messages.
STATUS_CODES: Dict[str, int] = {
    "AMDSMI_STATUS_SUCCESS": 0,
    "AMDSMI_STATUS_INVAL": 1,
    "AMDSMI_STATUS_NOT_SUPPORTED": 2,
    "AMDSMI_STATUS_NO_PERM": 10,
    "AMDSMI_STATUS_FILE_ERROR": 14,
    "AMDSMI_STATUS_INIT_ERROR": 18,
    "AMDSMI_STATUS_NOT_FOUND": 31,
    "AMDSMI_STATUS_NOT_INIT": 32,
    "AMDSMI_STATUS_DRIVER_NOT_LOADED": 34,
}
_MESSAGES = {
    1: "AMDSMI_STATUS_INVAL - Invalid parameters",
    2: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    10: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    14: "AMDSMI_STATUS_FILE_ERROR - Error opening file",
    18: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    31: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    32: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    34: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
}

# A subset of AmdSmiFwBlock with the values of amdsmi 7.0.2; SMC and XGMI are the names 6.x bindings had.
FW_BLOCKS: Dict[str, int] = {
    "SMU": 1, "CP_CE": 2, "CP_PFP": 3, "CP_ME": 4, "CP_MEC1": 7, "CP_MEC2": 8, "RLC": 9, "SDMA0": 10, "SDMA1": 11,
    "VCN": 18, "UVD": 19, "VCE": 20, "RLC_V": 27, "MMSCH": 28, "PSP_SYSDRV": 29, "PSP_SOSDRV": 30, "PSP_TOC": 31,
    "PSP_KEYDB": 32, "DFC": 33, "PSP_SPL": 34, "DRV_CAP": 35, "MC": 36, "PSP_BL": 37, "RLC_P": 39,
    "SEC_POLICY_STAGE2": 40, "REG_ACCESS_WHITELIST": 41, "IMU_DRAM": 42, "CP_MES": 46, "MES_STACK": 48,
    "RS64_ME": 53, "PPTABLE": 64, "ASD": 72, "TA_RAS": 73, "TA_XGMI": 74, "PM": 77, "DMCU": 78, "PLDM_BUNDLE": 79,
    "SMC": 90, "XGMI": 91,
}


class _ProcessorHandle:
    """Stands for amdsmi_wrapper.amdsmi_processor_handle: opaque to the caller."""

    def __init__(self, index: int) -> None:
        self._index = index

    def __repr__(self) -> str:
        return f"<amdsmi_processor_handle {self._index}>"


def make_fake_amdsmi(data: Dict[str, Any]) -> types.ModuleType:
    """A fresh module object named ``amdsmi`` that answers from ``data``."""
    module = types.ModuleType("amdsmi", "fake amdsmi for tests")
    calls: List[str] = []
    module.calls = calls  # type: ignore[attr-defined]
    state = {"initialised": False}
    gpus: List[Dict[str, Any]] = list(data.get("gpus", []))
    handles = [_ProcessorHandle(i) for i in range(len(gpus))]
    missing = set(data.get("missing_functions", []))

    class AmdSmiException(Exception):
        """Base smi exception class"""

    class AmdSmiLibraryException(AmdSmiException):
        def __init__(self, err_code: int) -> None:
            err_code = abs(err_code)
            super().__init__(err_code)
            self.err_code = err_code
            self.err_info = _MESSAGES.get(err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")

        def __str__(self) -> str:
            return "Error code:\n\t{} | {}".format(self.err_code, self.err_info)

        def get_error_code(self) -> int:
            return self.err_code

    class AmdSmiParameterException(AmdSmiException):
        def __init__(self, received: Any, expected_type: Any) -> None:
            super().__init__(None)
            self.err_code = None
            self.err_msg = f"Invalid parameter:\nActual type: {type(received)}\nExpected type: {expected_type}"

        def __str__(self) -> str:
            return self.err_msg

    class AmdSmiInitFlags(enum.IntEnum):
        INIT_ALL_PROCESSORS = 0xFFFFFFFF
        INIT_AMD_CPUS = 1
        INIT_AMD_GPUS = 2
        INIT_NON_AMD_CPUS = 4
        INIT_NON_AMD_GPUS = 8
        INIT_AMD_APUS = 3

    class AmdSmiMemoryType(enum.IntEnum):
        VRAM = 0
        VIS_VRAM = 1
        GTT = 2

    AmdSmiFwBlock = enum.IntEnum("AmdSmiFwBlock",  # type: ignore[misc]
                                 {f"AMDSMI_FW_ID_{name}": value for name, value in FW_BLOCKS.items()})

    for cls in (AmdSmiException, AmdSmiLibraryException, AmdSmiParameterException, AmdSmiInitFlags,
                AmdSmiMemoryType, AmdSmiFwBlock):
        cls.__module__ = "amdsmi"
        setattr(module, cls.__name__, cls)

    def fail(error_name: str) -> None:
        raise AmdSmiLibraryException(STATUS_CODES[error_name])

    def gpu_for(handle: Any) -> Dict[str, Any]:
        if not isinstance(handle, _ProcessorHandle):
            raise AmdSmiParameterException(handle, _ProcessorHandle)
        return gpus[handle._index]

    def export(function: Callable[..., Any], needs_init: bool = True) -> None:
        name = function.__name__
        if name in missing:
            return

        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            if needs_init and not state["initialised"]:
                fail("AMDSMI_STATUS_NOT_INIT")
            return function(*args, **kwargs)

        call.__name__ = name
        setattr(module, name, call)

    def per_gpu(key: str, function_name: str) -> Callable[[Any], Any]:
        def read(handle: Any) -> Any:
            gpu = gpu_for(handle)
            if function_name in gpu.get("errors", {}):
                fail(gpu["errors"][function_name])
            if key not in gpu:
                fail("AMDSMI_STATUS_NOT_SUPPORTED")
            return _copy(gpu[key])

        read.__name__ = function_name
        return read

    def amdsmi_init(flag: Any = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        error = data.get("init_error")
        if error:
            fail(error if isinstance(error, str) else "AMDSMI_STATUS_DRIVER_NOT_LOADED")
        state["initialised"] = True

    def amdsmi_shut_down() -> None:
        state["initialised"] = False

    def system_error(function_name: str) -> None:
        error: Optional[str] = data.get("errors", {}).get(function_name)
        if error:
            fail(error)

    def amdsmi_get_processor_handles() -> List[_ProcessorHandle]:
        system_error("amdsmi_get_processor_handles")
        return list(handles)

    def amdsmi_get_lib_version() -> Dict[str, Any]:
        system_error("amdsmi_get_lib_version")
        return _copy(data.get("lib_version", {"major": 26, "minor": 0, "release": 2, "build": "fake"}))

    def amdsmi_get_rocm_version() -> tuple:
        ok, text = data["rocm_version"]
        return bool(ok), str(text)

    def amdsmi_get_fw_info(handle: Any) -> Dict[str, List[Dict[str, Any]]]:
        gpu = gpu_for(handle)
        if "amdsmi_get_fw_info" in gpu.get("errors", {}):
            fail(gpu["errors"]["amdsmi_get_fw_info"])
        return {"fw_list": [{"fw_name": AmdSmiFwBlock[f"AMDSMI_FW_ID_{entry['fw_name']}"],
                             "fw_version": entry["fw_version"]} for entry in gpu.get("fw_list", [])]}

    def amdsmi_get_gpu_memory_total(handle: Any, mem_type: Any) -> int:
        gpu = gpu_for(handle)
        if not isinstance(mem_type, AmdSmiMemoryType):
            raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
        if "amdsmi_get_gpu_memory_total" in gpu.get("errors", {}):
            fail(gpu["errors"]["amdsmi_get_gpu_memory_total"])
        if mem_type != AmdSmiMemoryType.VRAM or "vram_total_bytes" not in gpu:
            fail("AMDSMI_STATUS_NOT_SUPPORTED")
        return int(gpu["vram_total_bytes"])

    export(amdsmi_init, needs_init=False)
    for function in (amdsmi_shut_down, amdsmi_get_processor_handles, amdsmi_get_lib_version,
                     amdsmi_get_fw_info, amdsmi_get_gpu_memory_total,
                     per_gpu("bdf", "amdsmi_get_gpu_device_bdf"),
                     per_gpu("uuid", "amdsmi_get_gpu_device_uuid"),
                     per_gpu("driver_info", "amdsmi_get_gpu_driver_info"),
                     per_gpu("asic_info", "amdsmi_get_gpu_asic_info"),
                     per_gpu("vbios_info", "amdsmi_get_gpu_vbios_info"),
                     per_gpu("vram_info", "amdsmi_get_gpu_vram_info"),
                     per_gpu("ecc", "amdsmi_get_gpu_total_ecc_count")):
        export(function)
    if "rocm_version" in data:
        # It dlopens librocm-core.so by itself and works without amdsmi_init.
        export(amdsmi_get_rocm_version, needs_init=False)
    return module


def _copy(value: Any) -> Any:
    """A deep copy of JSON-like data, so a caller mutating a result cannot change the fake's state."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
