"""The dnf4 plugin survives a checker that exits without reading its stdin.

dnf resets SIGPIPE to its default action when its stdout is not a terminal (dnf/i18n.py), so writing the
transaction to a checker that already exited used to kill dnf itself: exit -13, no message, nothing said about
the guard. This runs the real plugin module in dnf's Python (the system python3 with the dnf module) under that
same signal setting, with a payload far larger than a pipe buffer so the broken pipe is certain, not a race.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests import needs

PLUGIN = Path(__file__).resolve().parents[3] / "packaging" / "dnf" / "gpuguard.py"
SYSTEM_PYTHON = "/usr/bin/python3"

DRIVER = textwrap.dedent(
    """
    import importlib.util, signal, sys
    import dnf.exceptions
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)          # what dnf does when stdout is a pipe
    spec = importlib.util.spec_from_file_location("gpuguard_dnf_plugin", sys.argv[1])
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)

    class Conf:
        installroot = "/"

    class Base:
        conf = Conf()

    guard = plugin.GpuGuard.__new__(plugin.GpuGuard)     # no dnf.Base: only _run_checker is exercised
    guard.base = Base()
    guard.checker = sys.argv[2]
    guard.timeout_seconds = 30.0
    try:
        guard._run_checker(b"x" * (4 * 1024 * 1024))
    except dnf.exceptions.Error as exc:
        print("REFUSAL:" + str(exc).replace("\\n", " | "))
        sys.exit(1)
    print("ALLOWED")
    """
)


def _dnf_python_available() -> bool:
    if not os.path.exists(SYSTEM_PYTHON):
        return False
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import dnf.exceptions"], capture_output=True, timeout=60)
    return probe.returncode == 0


@pytest.fixture(autouse=True)
def _needs_dnf_python() -> None:
    if not _dnf_python_available():
        needs.unavailable("dnf plugin tests", "the dnf Python module (python3-dnf) is missing on the system python3")


def _run(tmp_path: Path, checker_body: str) -> subprocess.CompletedProcess:
    checker = tmp_path / "checker"
    checker.write_text(checker_body)
    checker.chmod(0o755)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    return subprocess.run(
        [SYSTEM_PYTHON, str(driver), str(PLUGIN), str(checker)],
        capture_output=True, text=True, timeout=120,
    )


def test_checker_that_never_reads_stdin_is_a_named_refusal_not_a_dead_dnf(tmp_path: Path) -> None:
    """A checker that closes stdin and dies makes the dnf4 plugin refuse with a named reason and the bypass, not dnf
    crash."""
    result = _run(tmp_path, "#!/bin/sh\nexec 0<&-\nexit 139\n")
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "exited 139 without a decision" in result.stdout
    assert "--disableplugin=gpuguard" in result.stdout


def test_checker_that_refuses_early_keeps_its_own_message(tmp_path: Path) -> None:
    """A checker that refuses before reading its input keeps its own REFUSED message."""
    body = ("#!/bin/sh\n"
            "echo 'gpuguard: REFUSED (policy): amdgpu-dkms 6.2 is not paired with rocm-core 6.4' >&2\nexit 1\n")
    result = _run(tmp_path, body)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "REFUSED (policy): amdgpu-dkms 6.2" in result.stdout
    assert "without a decision" not in result.stdout


def test_sigpipe_is_restored_after_the_check(tmp_path: Path) -> None:
    """The plugin must not leave dnf's own signal setting changed."""
    driver_tail = tmp_path / "tail.py"
    driver_tail.write_text(DRIVER.replace(
        'print("ALLOWED")',
        'print("ALLOWED", signal.getsignal(signal.SIGPIPE) == signal.SIG_DFL)',
    ))
    checker = tmp_path / "ok"
    checker.write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
    checker.chmod(0o755)
    result = subprocess.run([SYSTEM_PYTHON, str(driver_tail), str(PLUGIN), str(checker)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout.strip() == "ALLOWED True"
