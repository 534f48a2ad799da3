"""The daemon's memory stays flat over many scheduled snapshots (issue #17; docs/reporting.md, "Memory").

The growth was native, not Python objects: snapshots ran on ten worker threads, each with its own glibc malloc arena
holding a freed snapshot's working set. The daemon caps the arenas and trims after each job; these tests pin that,
and that the job path keeps no Python objects per snapshot (tracemalloc), with scheduled runs on several threads.
"""

from __future__ import annotations

import ctypes.util
import gc
import sys
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent.daemon import JobRunner
from agent.daemon_jobs import memory
from agent.daemon_jobs.hooks import Hooks
from agent.daemon_jobs.snapshot import SnapshotJob
from tests.conftest import make_fixture_host
from tests.daemon.test_jobs import make_runtime

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None
                           or memory._glibc() is None, reason="glibc only")


def test_job_runner_trims_after_each_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run of a trimming job ends with malloc_trim, a failing one too; a quiet job is not trimmed."""
    trims = []
    monkeypatch.setattr("agent.daemon.release_free_memory", lambda: trims.append(1) or True)
    stopping = threading.Event()

    def fails(reason: str) -> None:
        raise RuntimeError("boom")

    JobRunner("snapshot", lambda reason: None, stopping)()
    JobRunner("guard", fails, stopping)()
    JobRunner("package_watch", lambda reason: None, stopping, trim=False)()
    assert len(trims) == 2


@glibc
def test_glibc_calls_answer() -> None:
    """mallopt(M_ARENA_MAX) and malloc_trim are reachable through ctypes on this libc."""
    assert memory.limit_malloc_arenas(2) is True
    memory.release_free_memory()  # True or False (nothing to give back): it must not raise


def test_scheduled_snapshots_keep_no_python_objects(tmp_path: Path) -> None:
    """40 snapshot jobs on a 4-thread pool: after the first 10, Python's traced memory grows by < 512 KiB."""
    host = make_fixture_host("nvidia-h200-ubuntu2404")
    rt = make_runtime(tmp_path, host)
    job = SnapshotJob(rt, Hooks().policy_check)
    runner = JobRunner("snapshot", lambda reason: job.run(reason), rt.stopping)
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(10):
            pool.submit(runner).result()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(30):
                pool.submit(runner).result()
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert grown < 512 * 1024, f"{grown} bytes kept by 30 snapshot jobs"


@glibc
def test_scheduled_snapshots_keep_rss_flat(tmp_path: Path) -> None:
    """60 snapshot jobs taking turns on an 8-thread pool (as apscheduler's pool does): RSS after the first 20 grows
    by under 4 MiB. Without the arena cap and the trim this grew by about a snapshot's working set per thread."""
    memory.limit_malloc_arenas(2)
    host = make_fixture_host("nvidia-h200-ubuntu2404")
    rt = make_runtime(tmp_path, host)
    job = SnapshotJob(rt, Hooks().policy_check)
    runner = JobRunner("snapshot", lambda reason: job.run(reason), rt.stopping)

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(20):
            list(pool.map(lambda _: runner(), range(2)))
        gc.collect()
        memory.release_free_memory()
        before = rss()
        for _ in range(40):
            list(pool.map(lambda _: runner(), range(2)))
        gc.collect()
        memory.release_free_memory()
        grown = rss() - before
    assert grown < 4 * 1024 * 1024, f"RSS grew by {grown / 2**20:.1f} MiB over 80 snapshot jobs"
