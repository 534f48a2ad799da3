"""A process's own figures from /proc, for the daemon and its children alike (the lean stdlib-only children import
it too: standard library only)."""

from __future__ import annotations


def peak_rss_kib(pid: str = "self") -> int:
    """VmHWM of a process (``self`` or a PID) in KiB; 0 when it is gone or /proc shows none."""
    try:
        with open(f"/proc/{pid}/status", "r", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0
