"""Shared test helpers: fixture hosts built from tests/fixtures, with fake runners and fake GPU libraries."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, Iterator, Optional

import pytest

from agent.errors import LibraryUnavailable
from agent.host import Host
from tests.fakes.runner import FakeRunner

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
ROOTS = FIXTURES / "roots"
RECORDED = FIXTURES / "recorded"
FIXED_TIME = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def run_fresh_python(code: str, *args: str, timeout_seconds: float = 60) -> str:
    """Run ``code`` in a new isolated interpreter (``python -I -c``) with this checkout as ``sys.argv[1]`` and
    ``args`` after it, as an installed command starts: what a process loads or does before anything else ran.
    Returns its stdout; the test fails with its stderr when it exits non-zero."""
    result = subprocess.run([sys.executable, "-I", "-c", code, str(REPO), *args], capture_output=True, text=True,
                            timeout=timeout_seconds, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def fixed_clock() -> dt.datetime:
    return FIXED_TIME


def fake_module_loader(modules: Dict[str, ModuleType]) -> Callable[[str], ModuleType]:
    """A loader serving the given fake modules and refusing everything else, like a host without the library."""

    def load(name: str) -> ModuleType:
        if name in modules:
            return modules[name]
        raise LibraryUnavailable(name, "not installed (fake host)")

    return load


def load_fake_libraries(scenario: str) -> Dict[str, ModuleType]:
    """Fake amdsmi/pynvml modules for a scenario, from tests/fixtures/recorded/<scenario>/{amdsmi,nvml}.json."""
    modules: Dict[str, ModuleType] = {}
    recorded = RECORDED / scenario
    if (recorded / "amdsmi.json").exists():
        from tests.fakes.amdsmi import make_fake_amdsmi

        modules["amdsmi"] = make_fake_amdsmi(json.loads((recorded / "amdsmi.json").read_text()))
    if (recorded / "nvml.json").exists():
        from tests.fakes.pynvml import make_fake_pynvml

        modules["pynvml"] = make_fake_pynvml(json.loads((recorded / "nvml.json").read_text()))
    return modules


def make_fixture_host(scenario: str, modules: Optional[Dict[str, ModuleType]] = None,
                      runner: Optional[FakeRunner] = None) -> Host:
    """A Host over tests/fixtures/roots/<scenario> with its recorded commands and fake libraries."""
    root = ROOTS / scenario
    assert root.is_dir(), f"no fixture root {root}"
    if runner is None:
        runner = FakeRunner.from_file(RECORDED / scenario / "commands.json", str(root))
    if modules is None:
        modules = load_fake_libraries(scenario)
    return Host(root=root, runner=runner, load_module=fake_module_loader(modules), clock=fixed_clock)


@pytest.fixture
def fixture_host() -> Callable[..., Host]:
    return make_fixture_host


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, unmounted after the test (needs root; skipped where mount is refused); fill it with
    fill_disk for ENOSPC."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    with tmpfs_at(mount_point, "size=4m"):
        yield mount_point


@contextlib.contextmanager
def tmpfs_at(mount_point: Path, options: str) -> Iterator[None]:
    """A tmpfs mounted on ``mount_point`` with ``options`` (``size=4m``), unmounted after (needs root; the test is
    skipped where mount is refused)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"mount refused: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@contextlib.contextmanager
def within_seconds(seconds: int) -> Iterator[None]:
    """Fail the test (an AssertionError, which no reader under test catches as it would an OSError) when the block
    runs past ``seconds``: a read that blocks on a FIFO fails instead of hanging the suite."""
    import signal

    def expired(signum: int, frame: object) -> None:
        raise AssertionError(f"still blocked after {seconds} s (on a FIFO?)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def fill_disk(path: Path) -> None:
    """Write until the file system says ENOSPC (the close's flush may say it too)."""
    try:
        with open(path, "wb") as handle:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
    except OSError:
        pass


@pytest.fixture(autouse=True)
def _quiet_logs():
    """Keep structlog output on stderr at warning level so tests that read stdout see only program output."""
    import sys

    from agent.log import configure

    configure(level="warning", json_output=True, stream=sys.stderr)
    yield


# Tests that build a Debian chroot, a dnf installroot or packages are marked by where they live, so that
# `make test-fast` (-m "not chroot and not installroot and not packaging and not slow") can leave them out.
_FOLDER_MARKS = (("tests/guard/apt/chroot/", "chroot"), ("tests/guard/dnf/installroot/", "installroot"),
                 ("tests/packaging/", "packaging"),
                 ("tests/guard/dnf/dnf5/", "installroot"), ("tests/collectors/sid/", "chroot"))  # the sid root


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        where = Path(str(item.fspath)).relative_to(root).as_posix()
        for folder, mark in _FOLDER_MARKS:
            if where.startswith(folder):
                item.add_marker(mark)


# The fixture roots are inputs: a test that writes into one (Debian's rpm creates <root>/root/.rpmdb under --root,
# a cache, a compiled policy) changes what every later test reads. Any file that appears, disappears or changes there
# during the session fails it, naming the paths.
def _fixture_tree() -> Dict[str, int]:
    out: Dict[str, int] = {}
    for path in FIXTURES.rglob("*"):
        if path.is_file() or path.is_symlink():
            info = path.lstat()
            out[str(path.relative_to(FIXTURES))] = hash((info.st_size, info.st_mtime_ns))
    return out


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_FIXTURES_BEFORE] = _fixture_tree()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_FIXTURES_BEFORE, None)
    if before is None:
        return
    after = _fixture_tree()
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    if changed:
        shown = ", ".join(changed[:10]) + (f" (+{len(changed) - 10} more)" if len(changed) > 10 else "")
        session.config.get_terminal_writer().line(f"tests wrote into tests/fixtures: {shown}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_FIXTURES_BEFORE = pytest.StashKey[Dict[str, int]]()
