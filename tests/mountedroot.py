"""A directory tree that tests enter with chroot and mount file systems into (the apt chroots, the sid roots): its
mounts, always undone, and the check that none is left behind before the tree is removed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import List, Sequence


class MountedRoot:
    """A root directory and what the test mounted inside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounted: List[Path] = []

    def mount_at(self, relative: str, source: str, *options: str) -> None:
        """``mount OPTIONS SOURCE ROOT/RELATIVE`` (the point created when missing), remembered for unmount."""
        point = self.root / relative
        point.mkdir(parents=True, exist_ok=True)
        _run(["mount", *options, source, str(point)])
        self.mounted.append(point)

    def unmount(self) -> None:
        """Undo every mount, newest first (lazily where a busy one refuses)."""
        for point in reversed(self.mounted):
            if _run(["umount", str(point)], check=False).returncode != 0:
                _run(["umount", "-l", str(point)], check=False)
        self.mounted.clear()

    def mounts_inside(self) -> List[str]:
        """The mount points below the root that /proc/mounts still lists."""
        prefix = str(self.root.resolve()) + "/"
        return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                if line.split()[1].startswith(prefix)]

    def release(self, base: Path) -> None:
        """Unmount, assert that nothing is left mounted inside, and remove ``base`` (the tree's parent work
        directory)."""
        self.unmount()
        left = self.mounts_inside()
        assert not left, f"mounts left inside {self.root}: {left}"
        shutil.rmtree(base, ignore_errors=True)


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result
