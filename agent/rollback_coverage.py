"""Rollback coverage: how many guarded packages a rollback can restore, and from what, as one fact.

Written (``rollback-coverage.json``) whenever a known-good set is recorded, that is by the daemon's guard job and
by ``gpuguard guard rollback`` (agent.guard.rollback.core); read by ``gpuguard status``, the heartbeat and the NFD
labels. The reader checks that every kept file is still there, so a file removed by hand counts as not restorable
at once. On the ground floor, standard library only: the resident daemon reads it without loading the guard.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Tuple

from agent.errors import InputFileError
from agent.files import read_json_file, write_atomically

if TYPE_CHECKING:
    import datetime as dt
COVERAGE_FORMAT = 1
# How each source reads in the status line, in the order the line lists them.
SOURCE_PHRASES = (("archive cache", "from the archive cache"), ("repository", "from a repository"),
                  ("rebuilt", "rebuilt from the installed files"))


@dataclass(frozen=True)
class Coverage:
    """The coverage of one known-good set."""

    guarded: int
    by_source: Dict[str, int] = field(default_factory=dict)  # source -> packages restorable from it
    not_restorable: Tuple[str, ...] = ()  # package keys with no kept file
    inexact: Dict[str, Tuple[str, ...]] = field(default_factory=dict)  # key -> its rebuilt file's differences
    recorded_at: str = ""
    reasons: Dict[str, str] = field(default_factory=dict)  # a key not restorable -> why

    @property
    def restorable(self) -> int:
        return sum(self.by_source.values())

    def summary(self) -> str:
        """``33/33 guarded packages restorable: 1 from the archive cache, 32 rebuilt from the installed files``."""
        parts = [f"{self.by_source[s]} {phrase}" for s, phrase in SOURCE_PHRASES if self.by_source.get(s)]
        head = f"{self.restorable}/{self.guarded} guarded packages restorable"
        return head + (": " + ", ".join(parts) if parts else "")

    def attention(self) -> List[str]:
        """What an operator must know: the packages a rollback cannot restore, or not exactly."""
        out = []
        by_reason: Dict[str, List[str]] = {}
        for key in self.not_restorable:
            by_reason.setdefault(self.reasons.get(key, ""), []).append(key)
        for reason, keys in by_reason.items():
            shown = ", ".join(keys[:10]) + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")
            out.append(f"not restorable (no package file kept): {shown}" + (f" ({reason})" if reason else ""))
        for key, differences in sorted(self.inexact.items()):
            out.append(f"{key} restorable only inexactly ({'; '.join(differences[:3])})")
        return out


def write_coverage(path: str, packages: Mapping[str, Mapping[str, object]], now: "dt.datetime") -> Coverage:
    """Write ``rollback-coverage.json`` (``path`` with any root prefix) for a recorded set; its coverage.

    ``packages``: per package key, its ``version`` and ``arch`` and the kept file's ``path`` (None when none),
    ``source``, ``inexact`` and ``conffiles_edited`` (agent.guard.rollback.kept.KeptFile.entry).
    """
    data = {"format": COVERAGE_FORMAT, "recorded_at": now.isoformat(),
            "packages": {k: dict(v) for k, v in sorted(packages.items())}}
    write_atomically(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return _coverage(packages, now.isoformat(), lambda kept_path: True)


def read_coverage(path: str, root: str = "/") -> Optional[Coverage]:
    """The coverage recorded in ``path`` (with any root prefix), each kept file checked to exist under ``root``;
    None when none was recorded or the file is unreadable."""
    try:
        data = read_json_file(path)
    except InputFileError:  # an unreadable fact is an absent one to its readers: the next record rewrites it
        return None
    if not isinstance(data, dict) or data.get("format") != COVERAGE_FORMAT or not isinstance(data.get("packages"),
                                                                                             dict):
        return None
    return _coverage(data["packages"], str(data.get("recorded_at", "")),
                     lambda kept_path: os.path.isfile(os.path.join(root, kept_path.lstrip("/"))))


def summarize(packages: Mapping[str, Mapping[str, object]]) -> Coverage:
    """The coverage of entries as :func:`write_coverage` takes them, every named file taken as present."""
    return _coverage(packages, "", lambda kept_path: True)


def _coverage(packages: Mapping[str, object], recorded_at: str, present: Callable[[str], bool]) -> Coverage:
    by_source: Dict[str, int] = {}
    missing: List[str] = []
    inexact: Dict[str, Tuple[str, ...]] = {}
    reasons: Dict[str, str] = {}
    for key, entry in sorted(packages.items()):
        kept_path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(kept_path, str) or not present(kept_path):
            missing.append(str(key))
            why = entry.get("reason") if isinstance(entry, dict) else None
            reasons[str(key)] = (str(why)[:300] if why else
                                 "its kept file is gone" if isinstance(kept_path, str) else "")
            continue
        source = str(entry.get("source", "archive cache"))
        by_source[source] = by_source.get(source, 0) + 1
        if isinstance(entry.get("inexact"), list) and entry["inexact"]:
            inexact[str(key)] = tuple(str(d) for d in entry["inexact"])
    return Coverage(len(packages), by_source, tuple(missing), inexact, recorded_at, reasons)
