"""Loading the GPU management bindings (amdsmi, pynvml) and naming each way they fail in one short line.

Seen on hosts without a driver (docs/hardware.md, "GPU library failure modes"; tests/collectors/sid/):

- PyPI ``amdsmi`` without libamd_smi.so prints two lines on **stdout** at import, then raises KeyError
- PyPI ``amdsmi`` with a libamd_smi.so of another release raises ``AttributeError: ...: undefined symbol: NAME``
- Debian's ``amd-smi`` (library present, no driver): ``amdsmi_init()`` raises AmdSmiLibraryException, err_code 34
  (``AMDSMI_STATUS_DRIVER_NOT_LOADED``); the C library also writes ``Exception caught: rsmi_init.`` on stderr
- nvidia-ml-py imports without libnvidia-ml; ``nvmlInit()`` raises NVMLError_LibraryNotFound (12), or with the library
  but no driver NVMLError_DriverNotLoaded (9)

:func:`import_gpu_library` is the Host's default loader: it keeps the import's printing off stdout and stderr,
maps every import failure to :class:`~agent.errors.LibraryUnavailable` with a short reason, and remembers a failed
import for the life of the process (a daemon must not re-run a binding's failing import, and its noise, on every
snapshot; installing the library takes a restart). :func:`amdsmi_failure` and :func:`nvml_failure` name a failed
``amdsmi_init`` / ``nvmlInit`` the same way; :func:`reason` renders either as ``amdsmi: ...`` / ``NVML: ...``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import warnings
from types import ModuleType
from typing import Dict, Optional, Tuple

from agent.errors import LibraryUnavailable
from agent.lazyre import LazyPattern

# How the snapshot names each library's binding in a reason.
LABELS = {"amdsmi": "amdsmi", "pynvml": "NVML"}
# What steers where a binding looks for its shared library: a failure is remembered per value of these.
_LOOKUP_ENV = ("ROCM_PATH", "ROCM_HOME", "LD_LIBRARY_PATH")
_UNDEFINED_SYMBOL = LazyPattern(r"undefined symbol: ?([A-Za-z0-9_.@]*[A-Za-z0-9_])")
_MAX_DETAIL = 120

_FAILED: Dict[Tuple[object, ...], str] = {}


def _failure_key(name: str) -> Tuple[object, ...]:
    return (name, tuple(sys.path), *(os.environ.get(v) for v in _LOOKUP_ENV))


def forget_failed_imports() -> None:
    """Forget every remembered import failure (tests; a daemon keeps them for its lifetime)."""
    _FAILED.clear()


def _short(text: object) -> str:
    try:
        said = " ".join(str(text).split())
    except Exception:  # noqa: BLE001 - a foreign exception's __str__ may itself fail
        said = ""
    return said if len(said) <= _MAX_DETAIL else said[:_MAX_DETAIL - 3] + "..."


def import_failure(name: str, exc: BaseException) -> str:
    """The short reason for a failed ``import name``."""
    if isinstance(exc, ImportError):
        missing = getattr(exc, "name", None)
        if missing and missing != name:
            return f"not installed (no module named {missing!r})"
        return "not installed"
    text = _short(exc)
    symbol = _UNDEFINED_SYMBOL.search(text)
    if symbol:
        return f"binding and library releases differ (undefined symbol {symbol.group(1)})"
    if isinstance(exc, KeyError) and exc.args and str(exc.args[0]).endswith(".so"):
        # amdsmi_wrapper.py: the library lookup failed, then _libraries['libamd_smi.so'] raises KeyError.
        return f"{exc.args[0]} not found"
    if isinstance(exc, OSError):
        return f"shared library not loadable ({text})"
    return f"import failed ({type(exc).__name__}: {text})" if text else f"import failed ({type(exc).__name__})"


def import_gpu_library(name: str) -> ModuleType:
    """Import a GPU management binding; LibraryUnavailable (short reason) for every way it fails, remembered.

    What the binding prints while importing (amdsmi's two lines on stdout, SyntaxWarnings of old code on a new
    Python) is captured, never written to our stdout or stderr; it goes into the one log event of the failure.
    """
    key = _failure_key(name)
    if key in _FAILED:
        raise LibraryUnavailable(name, _FAILED[key])
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - a binding fails at import in foreign ways (KeyError, AttributeError)
        why = import_failure(name, exc)
        _FAILED[key] = why
        from agent.log import get_logger  # here: agent.host imports this module, and logging needs structlog

        get_logger("gpu_libraries").info("gpu_library_unavailable", library=name, reason=why,
                 output=" ".join(noise.getvalue().split())[:400] or None)
        raise LibraryUnavailable(name, why) from exc


def no_gpu_library(name: str) -> ModuleType:
    """Loader used when reading a foreign root: the live GPU libraries would describe this machine instead."""
    raise LibraryUnavailable(name, "not used when --root is not /")


def reason(library: str, why: str) -> str:
    """One short line for the snapshot: ``amdsmi: libamd_smi.so not found``, ``NVML: driver not loaded``."""
    return f"{LABELS.get(library, library)}: {why}"


def unavailable_reason(exc: LibraryUnavailable) -> str:
    return reason(exc.library, exc.reason)


def amdsmi_failure(call: str, exc: BaseException) -> str:
    """The short reason for a failed amdsmi call (``amdsmi_init``), without the binding's multi-line text."""
    code = getattr(exc, "err_code", None)
    info = getattr(exc, "err_info", None)
    status = str(info).split(" - ", 1)[0].strip() if info else None
    if code == 34 or status == "AMDSMI_STATUS_DRIVER_NOT_LOADED":
        return "driver not loaded (AMDSMI_STATUS_DRIVER_NOT_LOADED)"
    if status:
        return f"{call} failed ({status})"
    text = _short(exc)
    symbol = _UNDEFINED_SYMBOL.search(text)
    if symbol:
        return f"binding and library releases differ (undefined symbol {symbol.group(1)})"
    return f"{call} failed ({type(exc).__name__}: {text})" if text else f"{call} failed ({type(exc).__name__})"


# NVML return codes (nvml.h) with a reason of their own.
_NVML_REASONS = {9: "driver not loaded", 12: "libnvidia-ml.so.1 not found",
                 18: "driver and library versions differ (reboot, or reload the driver)"}


def nvml_failure(call: str, exc: BaseException) -> str:
    """The short reason for a failed NVML call (``nvmlInit``)."""
    value: Optional[int] = getattr(exc, "value", None)
    if isinstance(value, int) and value in _NVML_REASONS:
        return _NVML_REASONS[value]
    text = _short(exc)
    return f"{call} failed ({type(exc).__name__}: {text})" if text else f"{call} failed ({type(exc).__name__})"
