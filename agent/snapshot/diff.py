"""Component-by-component differences between two snapshots (pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from agent.models import FrozenModel

if TYPE_CHECKING:  # pragma: no cover
    from agent.snapshot.model import Snapshot

# The report schema (agent/report/events.py) embeds Change: the snapshot's records are imported only by the functions
# that compare snapshots, so the daemon, which only sends events, does not load them (issue #17).

# List items are matched by identity, not position, so a new GPU or kernel shows as one change.
_IDENTITY_KEYS = ("bdf", "path", "module")


class Change(FrozenModel):
    """One value that differs; None on a side means absent there."""

    section: str
    path: str
    old: Optional[str] = None
    new: Optional[str] = None


class SnapshotDiff(FrozenModel):
    """All changes from ``old_hash`` to ``new_hash``."""

    old_hash: str
    new_hash: str
    changes: List[Change]

    @property
    def changed_sections(self) -> List[str]:
        return sorted({c.section for c in self.changes})


def _item_id(item: Dict[str, Any], index: int) -> str:
    if "module" in item and "version" in item:
        return f"{item['module']}/{item['version']}/{item.get('kernel') or '-'}"
    for key in _IDENTITY_KEYS:
        if item.get(key):
            return str(item[key])
    return str(index)


def flatten(value: Any, prefix: str = "") -> Dict[str, str]:
    """Dotted paths to scalar strings; dict lists keyed by identity, scalar lists joined."""
    out: Dict[str, str] = {}
    if isinstance(value, dict):
        for key in sorted(value):
            out.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            for index, item in enumerate(value):
                out.update(flatten(item, f"{prefix}[{_item_id(item, index)}]"))
        else:
            out[prefix] = ", ".join(str(v) for v in value)
    elif value is not None:
        out[prefix] = value if isinstance(value, str) else str(value).lower() if isinstance(value, bool) \
            else str(value)
    return out


def _flatten_section(section: Any) -> Dict[str, str]:
    """A section's data paths without the ``data.`` prefix, plus its status and reason."""
    from agent.collectors.base import as_json_data

    dumped = as_json_data(section)
    out = flatten(dumped.pop("data") or {})
    out.update(flatten({k: v for k, v in dumped.items()}))
    return out


def diff_snapshots(old: Snapshot, new: Snapshot) -> SnapshotDiff:
    """Every section value that changed, appeared or disappeared between two snapshots."""
    from agent.snapshot.model import SECTION_NAMES

    changes: List[Change] = []
    if old.hostname != new.hostname:
        changes.append(Change(section="host", path="hostname", old=old.hostname, new=new.hostname))
    for name in SECTION_NAMES:
        before, after = _flatten_section(getattr(old, name)), _flatten_section(getattr(new, name))
        for path in sorted(set(before) | set(after)):
            if before.get(path) != after.get(path):
                changes.append(Change(section=name, path=path, old=before.get(path), new=after.get(path)))
    return SnapshotDiff(old_hash=old.content_hash, new_hash=new.content_hash, changes=changes)


def render_diff(diff: SnapshotDiff) -> str:
    """Human-readable lines, one per change, grouped by section."""
    if not diff.changes:
        return f"no changes ({diff.new_hash})\n"
    lines = [f"{diff.old_hash} -> {diff.new_hash}: {len(diff.changes)} change(s)"]
    for change in diff.changes:
        if change.old is None:
            lines.append(f"  + {change.section}.{change.path} = {change.new}")
        elif change.new is None:
            lines.append(f"  - {change.section}.{change.path} (was {change.old})")
        else:
            lines.append(f"  ~ {change.section}.{change.path}: {change.old} -> {change.new}")
    return "\n".join(lines) + "\n"
