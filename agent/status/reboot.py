"""Whether a rollback left a reboot to do: gpuguard's reboot-required.pkgs against this machine's boot time.

Read by ``gpuguard status`` (facts.py) and by the daemon's NFD features file (agent/daemon_jobs/nfd.py) every
minute; apart from facts.py so that the daemon does not load the status command's models (issue #17).
"""

from __future__ import annotations

import os
from typing import List, Optional


def read_reboot_required(path: str, booted_at_seconds: Optional[float] = None) -> Optional[List[str]]:
    """The package names in gpuguard's reboot-required.pkgs; None when no reboot is marked as needed, or the
    machine booted after it was written (nothing removes the marker: the reboot it asked for is its end)."""
    from agent.files import open_regular_file

    try:  # never blocks: a FIFO in its place is "(unreadable list)" at once
        with open_regular_file(path) as handle:
            if booted_at_seconds is not None and os.fstat(handle.fileno()).st_mtime < booted_at_seconds:
                return None
            text = handle.read(65536).decode("utf-8", errors="replace")
            return [line.strip() for line in text.splitlines() if line.strip()]
    except FileNotFoundError:
        return None
    except OSError:
        return ["(unreadable list)"]
