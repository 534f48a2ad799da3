"""The ROCm tree the update-alternatives system points at: ``/opt/rocm/core`` (TheRock) or ``/opt/rocm`` (classic).

TheRock's ``amdrocm`` meta registers each release tree as a choice of one alternative (``update-alternatives
--install /opt/rocm/core core /opt/rocm/core-7.14 <priority>`` in its postinst), so two releases installed side by
side are switched by repointing it (``update-alternatives --set core /opt/rocm/core-10.0``) without any package
change. The active tree is what the link resolves to: ``/opt/rocm/core -> /etc/alternatives/core ->
/opt/rocm/core-10.0``; its mode (``auto``: the highest priority; ``manual``: set by hand) and its choices come from
the alternatives database, ``/var/lib/dpkg/alternatives/<name>`` on dpkg hosts, ``/var/lib/alternatives/<name>`` on
rpm hosts (:func:`parse_alternative_state`).

The apt hook reads it when a policy judges the active tree (``[amd] active_tree = "pinned"``): standard library only.
"""

from __future__ import annotations

import posix

from agent.hostfacts.paths import read_small_text, under
from agent.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import List, Optional, Tuple

THEROCK_TREE_PREFIX = "/opt/rocm/core-"  # /opt/rocm/core-10.0: TheRock's release tree, of amdrocm-base10.0
CLASSIC_TREE_PREFIX = "/opt/rocm-"  # /opt/rocm-6.4.1: a classic side-by-side tree, of rocm-core6.4.1
# The links a ROCm tree is chosen by, the most specific first (TheRock's core; classic ROCm's /opt/rocm).
TREE_LINKS = ("/opt/rocm/core", "/opt/rocm")
ALTERNATIVES_LINK_DIR = "/etc/alternatives"
# The alternatives database: dpkg's update-alternatives, then the chkconfig one on rpm hosts.
ALTERNATIVES_STATE_DIRS = ("/var/lib/dpkg/alternatives", "/var/lib/alternatives")
ALTERNATIVE_STATE_MAX_BYTES = 65536


class AlternativeState(Record):
    """One alternative's database entry: ``mode`` (auto or manual), its ``link`` and its choices (path, priority)."""

    __slots__ = ("mode", "link", "choices")
    mode: str
    link: str
    choices: Tuple[Tuple[str, int], ...]

    def __init__(self, mode: str, link: str, choices: Tuple[Tuple[str, int], ...]) -> None:
        Record.__init__(self, mode, link, choices)


class ActiveTree(Record):
    """The tree an alternative points at: the alternative's ``name`` (``core``), the ``link`` chosen by it
    (``/opt/rocm/core``), the ``target`` (``/opt/rocm/core-10.0``), its ``mode`` ("" when the database has no entry)
    and the other ``choices`` the database lists (paths, sorted)."""

    __slots__ = ("name", "link", "target", "mode", "choices")
    name: str
    link: str
    target: str
    mode: str
    choices: Tuple[str, ...]

    def __init__(self, name: str, link: str, target: str, mode: str = "", choices: Tuple[str, ...] = ()) -> None:
        Record.__init__(self, name, link, target, mode, tuple(sorted(choices)))

    @property
    def release(self) -> Optional[str]:
        """The release the target's path names (``7.14`` of ``/opt/rocm/core-7.14``); None for another path."""
        return tree_release(self.target)

    def describe(self) -> str:
        """``/opt/rocm/core-10.0 (alternative core, manual)`` for people."""
        return f"{self.target} (alternative {self.name}{', ' + self.mode if self.mode else ''})"


def tree_release(path: str) -> Optional[str]:
    """The release a tree's path names: ``/opt/rocm/core-7.14`` -> ``7.14``, ``/opt/rocm-6.4.1`` -> ``6.4.1``;
    None for any other path."""
    for prefix in (THEROCK_TREE_PREFIX, CLASSIC_TREE_PREFIX):
        if path.startswith(prefix):
            rest = path[len(prefix):].rstrip("/")
            if rest and "/" not in rest and rest[0].isdigit():
                return rest
    return None


def parse_alternative_state(text: str) -> Optional[AlternativeState]:
    """An entry of the alternatives database: the mode, the link, the slaves (name, link) up to a blank line, then
    per choice its path, priority and one line per slave, up to a blank line. None for text that is not one."""
    lines = text.split("\n")
    if len(lines) < 3 or lines[0] not in ("auto", "manual") or not lines[1].startswith("/"):
        return None
    i, slaves = 2, 0
    while i + 1 < len(lines) and lines[i]:
        slaves, i = slaves + 1, i + 2
    if i >= len(lines) or lines[i]:
        return None
    i += 1
    choices: List[Tuple[str, int]] = []
    while i + 1 < len(lines) and lines[i]:
        path, priority = lines[i], lines[i + 1].strip()
        if not path.startswith("/") or not priority.lstrip("-").isdigit():
            return None
        choices.append((path, int(priority)))
        i += 2 + slaves
    return AlternativeState(lines[0], lines[1], tuple(choices))


def read_alternative_state(root: str, name: str) -> Optional[AlternativeState]:
    """The database entry of the alternative ``name`` under ``root``; None when there is none or it is unreadable."""
    if not name or "/" in name or name in (".", ".."):
        return None
    for directory in ALTERNATIVES_STATE_DIRS:
        text = read_small_text(root, f"{directory}/{name}", ALTERNATIVE_STATE_MAX_BYTES)
        if text is not None:
            return parse_alternative_state(text)
    return None


def _read_link(root: str, path: str) -> Optional[str]:
    try:
        target = posix.readlink(under(root, path))
    except OSError:
        return None
    if not target.startswith("/"):  # relative to the link's directory
        target = path.rsplit("/", 1)[0] + "/" + target
    parts: List[str] = []
    for part in target.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


def read_active_tree(root: str) -> Optional[ActiveTree]:
    """The ROCm tree an alternative points at under ``root``: the first of :data:`TREE_LINKS` that is a link into
    ``/etc/alternatives``; None when neither is (no alternatives in use, or no ROCm)."""
    for link in TREE_LINKS:
        via = _read_link(root, link)
        if via is None or not via.startswith(ALTERNATIVES_LINK_DIR + "/"):
            continue
        name = via[len(ALTERNATIVES_LINK_DIR) + 1:]
        target = _read_link(root, via)
        if not name or "/" in name or target is None:
            continue
        state = read_alternative_state(root, name)
        if state is None:
            return ActiveTree(name, link, target)
        return ActiveTree(name, link, target, state.mode, tuple(path for path, _ in state.choices))
    return None
