"""The neutral transaction model shared by every package-manager front end (apt, dnf, dnf5).

A Transaction is what a package manager is about to do, package by package: old and new version (None for
"not installed" / "removed"). Adapters build it from their own protocol; the policy never sees apt or dnf.
Standard library only, and records (agent/records.py) rather than dataclasses or named tuples: the apt hook's
start-up budget is a few tens of milliseconds.
"""

from __future__ import annotations

from agent.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Dict, Iterable, Mapping, Optional, Tuple


class PackageChange(Record):
    """One package's move: install (old_version None), removal (new_version None), upgrade, downgrade or reinstall.

    ``package`` is the package key (``name``, or ``name:arch`` for a foreign architecture).
    """

    __slots__ = ("package", "old_version", "new_version", "arch")
    package: str
    old_version: Optional[str]
    new_version: Optional[str]
    arch: str

    def __init__(self, package: str, old_version: Optional[str], new_version: Optional[str], arch: str = "") -> None:
        Record.__init__(self, package, old_version, new_version, arch)

    @property
    def kind(self) -> str:
        if self.old_version is None:
            return "install"
        if self.new_version is None:
            return "remove"
        return "reinstall" if self.old_version == self.new_version else "change"


class Transaction(Record):
    """What a package manager is about to do, as one change per package key (``changes``: a tuple of PackageChange).

    ``manager`` is the version scheme (``dpkg`` or ``rpm``), ``tool`` the front end (``apt``, ``dnf``, ``dnf5``),
    ``command_line`` what the operator typed when the front end says so.
    """

    __slots__ = ("manager", "tool", "changes", "command_line")
    manager: str
    tool: str
    changes: Tuple[PackageChange, ...]
    command_line: Optional[str]

    def __init__(self, manager: str, tool: str, changes: Tuple[PackageChange, ...],
                 command_line: Optional[str] = None) -> None:
        Record.__init__(self, manager, tool, tuple(changes), command_line)

    def packages(self) -> Dict[str, PackageChange]:
        return {c.package: c for c in self.changes}

    def describe(self, limit: int = 6) -> str:
        """``rocm-core 6.2.2 -> 6.3.0, amdgpu-dkms (new) 6.8.5, ...`` for messages."""
        parts = []
        for change in self.changes[:limit]:
            parts.append(f"{change.package} {change.old_version or '(new)'} -> {change.new_version or '(removed)'}")
        more = len(self.changes) - limit
        return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


def _with_versions(installed: Mapping[str, str], versions: Iterable[Tuple[str, Optional[str]]]) -> Dict[str, str]:
    """``installed`` with each (package, version) set, a None version removing the package."""
    result = dict(installed)
    for package, version in versions:
        if version is None:
            result.pop(package, None)
        else:
            result[package] = version
    return result


def resulting_set(installed: Mapping[str, str], tx: Transaction) -> Dict[str, str]:
    """The installed set after the transaction: ``installed`` with every change applied."""
    return _with_versions(installed, ((change.package, change.new_version) for change in tx.changes))


def before_set(installed: Mapping[str, str], tx: Transaction) -> Dict[str, str]:
    """The installed set before the transaction, taking the old versions the package manager reported as truth."""
    return _with_versions(installed, ((change.package, change.old_version) for change in tx.changes))
