"""The real amdsmi and NVML bindings on a host without their drivers (a Debian sid root): each foreign failure is
seen as it really is, the agent names it in one short line without the binding's noise on stdout, and
``gpuguard snapshot --json`` (this checkout, on sid's python3) prints nothing but JSON.

The root has no AMD driver (no /sys/module/amdgpu, no /dev/kfd), so the snapshot does not load amdsmi at all; the
bindings' failures are read through ``read_amdsmi``, what the collector calls where the driver shows.
"""

from __future__ import annotations

import json
import subprocess
from typing import Dict, Optional

import pytest

from tests.collectors.sid.conftest import DEBIAN_ROCM_PATH, PYPI_AMDSMI, PYPI_NVML
from tests.sidroot import SidRoot

pytestmark = pytest.mark.timeout(180)
LIB = "/usr/lib/gpuguard"
NO_AMD = "no amdgpu kernel module and no AMD PCI GPU; "
NO_NVIDIA = "no nvidia kernel module, /proc/driver/nvidia or NVIDIA PCI GPU; "
SMI_NOT_LOADED = "amdsmi: not loaded (no /sys/module/amdgpu, no /dev/kfd)"
# What the amdgpu collector gets from amdsmi where the driver shows: the reason, printed, the only line on stdout.
READ_AMDSMI = """
import sys
from agent.log import configure
configure(level="info", json_output=True, stream=sys.stderr)  # as the CLI and the daemon do
from agent.collectors.amdgpu import _SmiUnusable, read_amdsmi
from agent.host import Host
try:
    read_amdsmi(Host())
except _SmiUnusable as exc:
    print(exc)
"""


def python(sid: SidRoot, code: str, path: str = "",
           env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    return sid.run("python3", "-c", code, env={"PYTHONPATH": path, **(env or {})})


def snapshot(sid: SidRoot, path: str = "", env: Optional[Dict[str, str]] = None) -> dict:
    """``gpuguard snapshot --json`` inside the root: stdout must be exactly one JSON document."""
    result = sid.run("python3", "-m", "agent", "snapshot", "--json", "--config", "/nonexistent/agent.toml",
                     env={"PYTHONPATH": ":".join(p for p in (path, LIB) if p), **(env or {})})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)  # raises if any library noise reached stdout


def short(line: str) -> str:
    assert "\n" not in line and len(line) <= 160, line
    return line


PROBE_AMDSMI = """
import amdsmi, sys
try:
    amdsmi.amdsmi_init()
except amdsmi.AmdSmiLibraryException as exc:
    print(type(exc).__name__, exc.err_code, exc.get_error_info(detailed=False))
print(amdsmi.__file__)
"""


def test_debian_amd_smi_imports_and_init_says_driver_not_loaded(sid_libs: SidRoot) -> None:
    """Debian's amd-smi: the import works, amdsmi_init raises err 34; the snapshot says it in one short line."""
    probe = python(sid_libs, PROBE_AMDSMI)
    assert probe.stdout.splitlines() == ["AmdSmiLibraryException 34 AMDSMI_STATUS_DRIVER_NOT_LOADED",
                                         "/usr/lib/python3/dist-packages/amdsmi/__init__.py"], probe.stderr
    assert "Exception caught: rsmi_init." in probe.stderr  # the C library's own line, on stderr
    read = python(sid_libs, READ_AMDSMI, LIB)
    assert read.stdout == "amdsmi: driver not loaded (AMDSMI_STATUS_DRIVER_NOT_LOADED)\n", read.stderr
    snap = snapshot(sid_libs)
    assert short(snap["amdgpu"]["reason"]) == NO_AMD + SMI_NOT_LOADED


def test_pypi_amdsmi_without_its_library(sid_libs: SidRoot) -> None:
    """PyPI amdsmi with no libamd_smi.so: two lines on stdout and KeyError at import; the snapshot's stdout is clean."""
    probe = python(sid_libs, "import amdsmi", PYPI_AMDSMI)
    assert "KeyError: 'libamd_smi.so'" in probe.stderr
    assert "Unable to find libamd_smi.so library" in probe.stdout and len(probe.stdout.splitlines()) == 2
    read = python(sid_libs, READ_AMDSMI, f"{PYPI_AMDSMI}:{LIB}")
    assert read.stdout == "amdsmi: libamd_smi.so not found\n", read.stderr  # the binding's two lines: captured
    snap = snapshot(sid_libs, PYPI_AMDSMI)
    assert short(snap["amdgpu"]["reason"]) == NO_AMD + SMI_NOT_LOADED


def test_pypi_amdsmi_with_a_library_of_another_release(sid_libs: SidRoot) -> None:
    """PyPI amdsmi 7.x with Debian's libamd_smi.so (another release): AttributeError (undefined symbol) at import."""
    env = {"ROCM_PATH": DEBIAN_ROCM_PATH}
    probe = python(sid_libs, "import amdsmi", PYPI_AMDSMI, env)
    assert "AttributeError" in probe.stderr and "undefined symbol" in probe.stderr, probe.stderr
    symbol = probe.stderr.strip().rsplit("undefined symbol: ", 1)[1].split()[0].rstrip(".")
    read = python(sid_libs, READ_AMDSMI, f"{PYPI_AMDSMI}:{LIB}", env)
    assert short(read.stdout.rstrip("\n")) == f"amdsmi: binding and library releases differ (undefined symbol {symbol})"
    snap = snapshot(sid_libs, PYPI_AMDSMI, env)
    assert short(snap["amdgpu"]["reason"]) == NO_AMD + SMI_NOT_LOADED


def test_nvml_library_present_without_the_driver(sid_libs: SidRoot) -> None:
    """Debian's libnvidia-ml1 with PyPI nvidia-ml-py: nvmlInit raises NVMLError_DriverNotLoaded (9)."""
    probe = python(sid_libs, "import pynvml\ntry:\n    pynvml.nvmlInit()\nexcept pynvml.NVMLError as e:\n"
                             "    print(type(e).__name__, e.value)\n", PYPI_NVML)
    assert probe.stdout.strip() == "NVMLError_DriverNotLoaded 9", probe.stderr
    snap = snapshot(sid_libs, PYPI_NVML)
    assert short(snap["nvidia"]["reason"]) == NO_NVIDIA + "NVML: driver not loaded"


COLLECT_THREE_TIMES = """
import importlib, sys
imports = []
real_import_module = importlib.import_module
def counting(name, *args, **kwargs):
    imports.append(name)
    return real_import_module(name, *args, **kwargs)
importlib.import_module = counting
from agent.log import configure
configure(level="info", json_output=True, stream=sys.stderr)  # as the CLI and the daemon do
from agent.collectors.amdgpu import _SmiUnusable, read_amdsmi
from agent.host import Host
for _ in range(3):
    try:
        read_amdsmi(Host())
    except _SmiUnusable as exc:
        sys.stderr.write(str(exc) + "\\n")
print(imports.count("amdsmi"))
"""


def test_a_failed_import_is_tried_once_per_process(sid_libs: SidRoot) -> None:
    """A long-running agent collecting again and again imports the failing PyPI amdsmi once, and prints nothing."""
    result = python(sid_libs, COLLECT_THREE_TIMES, f"{PYPI_AMDSMI}:{LIB}")
    assert result.stdout == "1\n", result.stdout + result.stderr
    assert result.stderr.count("amdsmi: libamd_smi.so not found\n") == 3, result.stderr
    logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    failures = [e for e in logged if e["event"] == "gpu_library_unavailable"]
    assert [(e["library"], e["reason"]) for e in failures] == [("amdsmi", "libamd_smi.so not found")]
