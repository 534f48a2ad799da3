"""Recording the known-good set fast (issue #45): rebuilds in parallel and bounded, a kept package never rebuilt
again, every rebuilt file still checked against dpkg's md5sums, and progress with the time left for a long record."""

from __future__ import annotations

import gzip
import hashlib
import threading
from pathlib import Path
from typing import Dict, List, Tuple, Union

import pytest

from agent.guard.apt.deb_cache import DebCache
from agent.guard.apt.deb_rebuild import DATA_GZIP_LEVEL, DebRebuilder
from agent.guard.apt.tool import AptTool
from agent.guard.rollback.backend import InstalledPackage
from agent.guard.rollback.kept import (
    PROGRESS_AFTER_SECONDS,
    KeptFile,
    Manifest,
    PendingRebuild,
    RecordProgress,
    keep_set,
    rebuild_all,
    rebuild_workers,
)
from agent.host import Host
from tests.fakes.runner import FakeRunner

pytestmark = pytest.mark.timeout(120)

VERSION = "7.0.2.70002-1"
DIRECTORY = "/var/lib/gpuguard/debs"


def _stack(tmp_path: Path, count: int) -> Tuple[Path, Host, FakeRunner, DebCache, Dict[str, InstalledPackage]]:
    """A root where dpkg installed ``count`` ROCm-like packages no repository offers (apt-get download fails)."""
    root = tmp_path / "root"
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    stanzas = []
    for i in range(count):
        name = f"rocm-lib-{i}"
        files = {f"/opt/rocm/lib/{name}/lib{name}.so.7": bytes(range(256)) * (400 * (i + 1)),
                 f"/opt/rocm/share/doc/{name}/copyright": b"MIT\n"}
        for path, content in files.items():
            (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / path.lstrip("/")).write_bytes(content)
        listed = ["/opt", "/opt/rocm", "/opt/rocm/lib", f"/opt/rocm/lib/{name}", "/opt/rocm/share",
                  "/opt/rocm/share/doc", f"/opt/rocm/share/doc/{name}", *files]
        (info / f"{name}.list").write_text("\n".join(listed) + "\n")
        (info / f"{name}.md5sums").write_text("".join(f"{hashlib.md5(c).hexdigest()}  {p.lstrip('/')}\n"
                                                      for p, c in files.items()))
        stanzas.append(f"Package: {name}\nStatus: install ok installed\nInstalled-Size: {100 * (i + 1)}\n"
                       f"Architecture: amd64\nVersion: {VERSION}\nDescription: lib {i}\n")
    (root / "var/lib/dpkg/status").write_text("\n".join(stanzas))
    runner = FakeRunner()
    host = Host(root=root, runner=runner)
    tool = AptTool(host)
    installed = {f"rocm-lib-{i}": InstalledPackage(VERSION, "amd64") for i in range(count)}
    for name in installed:
        runner.add(tool._download_argv(name, VERSION, DIRECTORY), returncode=100,
                   stderr=f"E: Can't find a source to download version '{VERSION}' of '{name}'")
    return root, host, runner, DebCache(host, DIRECTORY, tool), installed


def _silent(progress: RecordProgress) -> None:
    """A progress sink that drops every report."""


def test_a_stack_is_rebuilt_exactly_and_checked_file_by_file_in_parallel(tmp_path: Path) -> None:
    """Six packages rebuilt together are each exact, and a file changed on disk still makes its package inexact."""
    root, host, _, cache, installed = _stack(tmp_path, 6)
    (root / "opt/rocm/lib/rocm-lib-3/librocm-lib-3.so.7").write_bytes(b"patched by hand")
    files = keep_set(host, cache, ".deb", installed, {}, 0, _silent)
    assert sorted(files) == sorted(installed)
    assert all(kept.source == "rebuilt" and kept.restorable for kept in files.values())
    assert [k for k, kept in files.items() if kept.inexact] == ["rocm-lib-3"]
    assert files["rocm-lib-3"].inexact == ("changed since installation: /opt/rocm/lib/rocm-lib-3/librocm-lib-3.so.7",)


def test_rebuilds_run_side_by_side_and_never_more_than_the_workers(tmp_path: Path) -> None:
    """Two rebuilds wait for each other at a barrier (so they run at once), and no more than the bound run."""
    if rebuild_workers(4) < 2:
        pytest.skip("one CPU: rebuilds run one at a time")
    host = Host(root=tmp_path, runner=FakeRunner())
    barrier = threading.Barrier(2, timeout=20)
    running: List[int] = [0]
    most: List[int] = [0]
    lock = threading.Lock()

    def rebuild() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            barrier.wait()  # BrokenBarrierError (the test fails) unless a second rebuild runs meanwhile
        finally:
            with lock:
                running[0] -= 1
        return None

    pending = {f"p{i}": PendingRebuild((f"p{i}", "1", "amd64"), f"/k/p{i}.deb", rebuild, "no repository", "dpkg")
               for i in range(4)}
    files = rebuild_all(host, Manifest(), pending, _silent)
    assert sorted(files) == ["p0", "p1", "p2", "p3"] and not any(kept.restorable for kept in files.values())
    assert 2 <= most[0] <= rebuild_workers(4)


def test_an_unchanged_package_already_kept_is_not_rebuilt_again(tmp_path: Path) -> None:
    """A second record of the same set finds every file kept: no download asked, no file written again."""
    root, host, runner, cache, installed = _stack(tmp_path, 3)
    keep_set(host, cache, ".deb", installed, {}, 0, _silent)
    kept_dir = root / DIRECTORY.lstrip("/")
    before = {p.name: p.stat().st_mtime_ns for p in kept_dir.glob("*.deb")}
    runner.calls.clear()

    class NoRebuild(DebCache):
        def find(self, name: str, version: str, arch: str, manifest: Manifest) -> Union[KeptFile, PendingRebuild]:
            found = super().find(name, version, arch, manifest)
            assert not isinstance(found, PendingRebuild), f"{name} would be rebuilt again"
            return found

    again = keep_set(host, NoRebuild(host, DIRECTORY, cache.tool), ".deb", installed, {}, 0, _silent)
    assert all(kept.source == "rebuilt" and not kept.inexact for kept in again.values())
    assert runner.calls == []
    assert {p.name: p.stat().st_mtime_ns for p in kept_dir.glob("*.deb")} == before


def test_the_data_member_is_compressed_at_gzip_level_one(tmp_path: Path) -> None:
    """data.tar.gz is written at level 1 (about half of level 6's time): its gzip header says "fastest"."""
    root, host, _, _, _ = _stack(tmp_path, 1)
    DebRebuilder(host).rebuild("rocm-lib-0", VERSION, "amd64", "/d/x.deb")
    data = (root / "d/x.deb").read_bytes()
    at = data.index(b"data.tar.gz/")
    size = int(data[at + 48:at + 58])
    member = data[at + 60:at + 60 + size]
    assert DATA_GZIP_LEVEL == 1 and member[8] == 4  # XFL 4: compressed with the fastest algorithm
    assert gzip.decompress(member)[:2] != b""


def test_a_long_record_reports_progress_and_the_time_left(tmp_path: Path) -> None:
    """Past a few seconds each report says packages and bytes done and an estimate of the time left; the last
    says all done; a short record says nothing."""
    host = Host(root=tmp_path, runner=FakeRunner())
    now = [0.0]
    step = PROGRESS_AFTER_SECONDS  # each rebuild "takes" this long on the fake clock
    lock = threading.Lock()

    def rebuild() -> None:
        with lock:
            now[0] += step
        return None

    pending = {f"p{i}": PendingRebuild((f"p{i}", "1", "amd64"), f"/k/p{i}.deb", rebuild, "none", "dpkg",
                                       installed_bytes=1_000_000_000) for i in range(4)}
    reports: List[RecordProgress] = []
    rebuild_all(host, Manifest(), pending, reports.append, clock=lambda: now[0])
    assert reports, "a record of 12 s on the clock reported nothing"
    assert reports[-1].packages_done == reports[-1].packages_total == 4 and reports[-1].eta_seconds == 0
    first = reports[0]
    assert first.bytes_total == 4_000_000_000 and first.eta_seconds is not None and first.eta_seconds > 0
    assert "of 4.0 GB" in first.line() and "s left" in first.line()
    quick: List[RecordProgress] = []
    step = 0.0
    rebuild_all(host, Manifest(), pending, quick.append, clock=lambda: now[0])
    assert quick == []


def test_guard_rollback_prints_the_progress_on_stderr(capsys: pytest.CaptureFixture) -> None:
    """``gpuguard guard rollback`` hands check_and_rollback a sink that writes each report as one line on stderr."""
    from agent.commands.guard import _progress_line

    _progress_line(RecordProgress(12, 40, 2_100_000_000, 8_600_000_000, 30.0, 95.4))
    assert capsys.readouterr().err == "rebuilding kept packages: 12/40, 2.1 of 8.6 GB, about 95 s left\n"
