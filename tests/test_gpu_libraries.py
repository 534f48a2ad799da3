"""The GPU library loader and the short reasons for each way amdsmi and NVML fail (agent/gpu_libraries.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from agent.errors import LibraryUnavailable
from agent.gpu_libraries import (
    amdsmi_failure,
    forget_failed_imports,
    import_failure,
    import_gpu_library,
    nvml_failure,
    unavailable_reason,
)
from tests.fakes.amdsmi import make_fake_amdsmi
from tests.fakes.pynvml import make_fake_pynvml


@pytest.fixture(autouse=True)
def _fresh_failures() -> Iterator[None]:
    forget_failed_imports()
    yield
    forget_failed_imports()


NOISY = ("print('/opt/rocm/lib/libamd_smi.so: cannot open shared object file: No such file or directory')\n"
         "print('Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager')\n"
         "import sys; sys.stderr.write('more noise\\n')\n"
         "open({counter!r}, 'a').write('x')\n"
         "raise KeyError('libamd_smi.so')\n")


def test_noisy_import_is_one_short_reason_with_no_output(tmp_path: Path, monkeypatch, capsys) -> None:
    """amdsmi without libamd_smi.so: KeyError and two lines on stdout become 'amdsmi: libamd_smi.so not found'."""
    (tmp_path / "gg_noisy_amdsmi.py").write_text(NOISY.format(counter=str(tmp_path / "imports")))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LibraryUnavailable) as caught:
        import_gpu_library("gg_noisy_amdsmi")
    assert caught.value.reason == "libamd_smi.so not found"
    assert capsys.readouterr() == ("", "")


def test_a_failed_import_is_not_retried_in_the_same_process(tmp_path: Path, monkeypatch, capsys) -> None:
    """A daemon snapshotting every minute imports a failing binding once: later loads answer from memory."""
    counter = tmp_path / "imports"
    (tmp_path / "gg_counted_amdsmi.py").write_text(NOISY.format(counter=str(counter)))
    monkeypatch.syspath_prepend(str(tmp_path))
    reasons = []
    for _ in range(5):
        with pytest.raises(LibraryUnavailable) as caught:
            import_gpu_library("gg_counted_amdsmi")
        reasons.append(caught.value.reason)
    assert counter.read_text() == "x" and reasons == ["libamd_smi.so not found"] * 5
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))  # where the binding looks changed: tried again
    with pytest.raises(LibraryUnavailable):
        import_gpu_library("gg_counted_amdsmi")
    assert counter.read_text() == "xx" and capsys.readouterr() == ("", "")


@pytest.mark.parametrize("name,exc,reason", [
    ("amdsmi", ModuleNotFoundError("No module named 'amdsmi'", name="amdsmi"), "not installed"),
    ("amdsmi", ModuleNotFoundError("No module named 'ctypes'", name="ctypes"),
     "not installed (no module named 'ctypes')"),
    ("amdsmi", KeyError("libamd_smi.so"), "libamd_smi.so not found"),
    ("amdsmi", AttributeError("/opt/rocm-debian/lib/libamd_smi.so: undefined symbol: amdsmi_set_gpu_clk_range"),
     "binding and library releases differ (undefined symbol amdsmi_set_gpu_clk_range)"),
    ("amdsmi", OSError("libamd_smi.so: wrong ELF class: ELFCLASS32"),
     "shared library not loadable (libamd_smi.so: wrong ELF class: ELFCLASS32)"),
    ("pynvml", RuntimeError("x" * 300), f"import failed (RuntimeError: {'x' * 117}...)"),
])
def test_import_failures_are_named_once(name: str, exc: BaseException, reason: str) -> None:
    """Each way importing a GPU library fails is named in one short reason."""
    assert import_failure(name, exc) == reason


def test_amdsmi_init_failures_are_short() -> None:
    """The binding's 'Error code:\\n\\t34 | AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded' is one short line."""
    smi = make_fake_amdsmi({"gpus": []})
    assert amdsmi_failure("amdsmi_init", smi.AmdSmiLibraryException(34)) == \
        "driver not loaded (AMDSMI_STATUS_DRIVER_NOT_LOADED)"
    assert amdsmi_failure("amdsmi_init", smi.AmdSmiLibraryException(10)).startswith("amdsmi_init failed (AMDSMI_")
    assert "\n" not in amdsmi_failure("amdsmi_init", smi.AmdSmiLibraryException(10))


def test_nvml_failures_are_short() -> None:
    """NVML's errors become short reasons (driver not loaded, library not found), prefixed with the library."""
    nvml = make_fake_pynvml({"gpus": []})
    assert nvml_failure("nvmlInit", nvml.NVMLError(9)) == "driver not loaded"
    assert nvml_failure("nvmlInit", nvml.NVMLError(12)) == "libnvidia-ml.so.1 not found"
    assert unavailable_reason(LibraryUnavailable("pynvml", "not installed")) == "NVML: not installed"
