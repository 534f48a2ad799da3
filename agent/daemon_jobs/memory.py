"""Giving freed memory back to the system between daemon jobs (glibc only; a no-op elsewhere).

The daemon's jobs run on worker threads (one per job), and glibc gives each thread its own malloc arena; memory freed
in one stays mapped. RSS climbed by about 1 MB per scheduled snapshot (50 MB at start, 110 MB after 84 snapshots)
while Python's own heap did not grow (tracemalloc): native allocations on the job path over the real host (GPU
library attempts, subprocesses). Two arenas for the process and ``malloc_trim(0)`` after each job keep RSS flat
(docs/reporting.md, "Memory over a day of jobs"; bench/bench_daemon_memory.py; tests/daemon/test_memory.py).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Optional

M_ARENA_MAX = -8  # mallopt(3) parameter number in glibc's malloc.h

_libc: Optional[ctypes.CDLL] = None
_loaded = False
_lock = threading.Lock()


def _glibc() -> Optional[ctypes.CDLL]:
    """glibc through ctypes, once; None on another libc (musl has neither mallopt nor malloc_trim).

    The process's own symbols (``CDLL(None)``): libc is loaded already, and ``ctypes.util.find_library`` would start
    ``ldconfig -p`` and keep subprocess resident for it."""
    global _libc, _loaded
    with _lock:
        if not _loaded:
            _loaded = True
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _libc = libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
            except OSError:
                _libc = None
    return _libc


def limit_malloc_arenas(count: int = 2) -> bool:
    """Cap glibc's malloc arenas (before the worker threads start); True when glibc took it."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, count) == 1)


def release_free_memory() -> bool:
    """``malloc_trim(0)``: return the free pages of every arena to the system; True when any were."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0) == 1)
