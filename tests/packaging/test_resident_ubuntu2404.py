"""The Ubuntu 24.04 package's resident ``gpuguard run`` on Python 3.12, looked at from outside (issue #45).

On Python 3.12 every ``logging.LogRecord`` asks asyncio for the current task; through the resident's asyncio stand-in
that loaded the real asyncio (with subprocess, socket and selectors: 2.7 MiB) in every resident on Ubuntu 24.04,
which tests/daemon/test_resident_imports.py, run on the development container's Python 3.11, could not see. Here
the .deb is unpacked, its launcher runs the daemon with a real Python 3.12 (pyenv) over a fixture root, and once its
first snapshot child has finished the daemon's ``/proc/PID/maps`` must hold none of the extension modules the
resident keeps out (asyncio's, OpenSSL's, pydantic's), and its RSS must stay within a budget over a bare Python 3.12.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOTS
from tests.daemon.conftest import agent_config
from tests.packaging.conftest import run
from tests.packaging.test_release_upgrade_el9 import installed_launcher

pytestmark = pytest.mark.timeout(300)

# VmRSS of the daemon over a bare ``python3.12 -I -S`` waiting on stdin (9.1 MiB), measured here from outside, the
# first snapshot child done (docs/reporting.md, "Memory over a day of jobs"): 15.5 to 15.6 MiB before issue #45's
# trims (f813b8b: asyncio, subprocess, socket, pathlib loaded), 12.6 to 13.9 after.
RESIDENT_OVER_BARE_PYTHON312_MIB = 14.5

# Extension modules only what the resident keeps out loads: asyncio's event loop (agent/daemon_jobs/lazy_asyncio.py),
# OpenSSL (openssl.py), pydantic (resident_settings.py: the settings are validated in a config child).
NOT_MAPPED = ("/_asyncio.cpython-312", "/_ssl.cpython-312", "/_hashlib.cpython-312", "/_pydantic_core.cpython-312")


def python312() -> str:
    """A real Python 3.12 (pyenv), Ubuntu 24.04's; skipped where there is none (optional)."""
    found = sorted((Path.home() / ".pyenv/versions").glob("3.12.*/bin/python3.12"))
    if not found:
        pytest.skip("no Python 3.12 interpreter on this machine (optional cross-check, as the other pyenv ones)")
    return str(found[-1])


def vm_rss_kib(pid: int) -> int:
    """/proc/PID/status VmRSS."""
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1])


def stop(proc: subprocess.Popen) -> int:
    """SIGTERM, as systemd stops the unit; the exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=10)


def test_the_ubuntu2404_resident_maps_no_asyncio_openssl_or_pydantic_on_python312(ubuntu2404: Path,
                                                                                  tmp_path: Path) -> None:
    """The installed layout's daemon on Python 3.12, its first snapshot child done: none of those extension
    modules mapped, and at most 14.5 MiB over a bare Python 3.12."""
    python = python312()
    root = tmp_path / "pkg"
    run(["dpkg-deb", "-x", str(ubuntu2404), str(root)])
    launcher = installed_launcher(root, tmp_path / "gpuguard")
    shutil.copytree(ROOTS / "gpuless-debian12", tmp_path / "host", symlinks=True)
    state = tmp_path / "state"
    (tmp_path / "agent.toml").write_text(agent_config(state, log_level="info"))
    bare = subprocess.Popen([python, "-I", "-S", "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    with open(tmp_path / "agent.log", "wb") as log:
        daemon = subprocess.Popen([python, "-I", "-S", str(launcher), "run", "--config", str(tmp_path / "agent.toml"),
                                   "--root", str(tmp_path / "host")], stderr=log, env={"PATH": os.environ["PATH"]})
    try:
        deadline = time.monotonic() + 120
        while not (state / "last-snapshot.json").exists() and daemon.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (state / "last-snapshot.json").exists(), (tmp_path / "agent.log").read_text()[-3000:]
        time.sleep(2.0)  # heartbeats, deliveries and package watches run, as in tests/daemon/test_resident_imports.py
        maps = Path(f"/proc/{daemon.pid}/maps").read_text()
        over_mib = (vm_rss_kib(daemon.pid) - vm_rss_kib(bare.pid)) / 1024
    finally:
        exit_code = stop(daemon)
        bare.communicate(timeout=10)
    assert [name for name in NOT_MAPPED if name in maps] == []
    assert "/_sqlite3.cpython-312" in maps  # the outbox: it is the Python 3.12 resident that was looked at
    assert over_mib <= RESIDENT_OVER_BARE_PYTHON312_MIB, f"{over_mib:.1f} MiB over the bare interpreter"
    assert exit_code == 0
