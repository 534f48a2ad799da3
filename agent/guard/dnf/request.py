"""The dnf adapter: the JSON the dnf plugin (or the dnf5 action) sends -> a neutral Transaction over the installed set.

The front end sends one JSON object (format 1)::

    {"format": 1, "tool": "dnf", "command_line": "dnf upgrade rocm-core",
     "installonly": ["kernel", "kernel-core"],
     "installed": [{"name": "rocm-core", "epoch": 0, "version": "6.2.2.60202", "release": "116.el9",
                    "arch": "x86_64"}, ...],
     "items": [{"name": "rocm-core", "epoch": 0, "version": "6.3.0.60300", "release": "39.el9", "arch": "x86_64",
                "direction": "in", "action": "Upgrade"},
               {"name": "rocm-core", ..., "version": "6.2.2.60202", "direction": "out", "action": "Upgraded"}]}

``items`` is every package of the resolved transaction: ``in`` comes onto the system (install, upgrade, downgrade,
reinstall), ``out`` leaves it (upgraded, downgraded, reinstalled, removed, obsoleted). The installed set after the
transaction is the installed set minus ``out`` plus ``in``; a PackageChange is every package key whose version differs
(a reinstall is a PackageChange with equal versions, as on apt).

Versions are rpm EVR strings as the rpm collector writes them: ``version-release``, with ``epoch:`` in front only
when the epoch is not 0 (``1:6.8.5.60202-2041575.el9``); compare_rpm treats a missing epoch as 0. Package keys
are the name, ``name:arch`` when one name is installed for several architectures (multilib), and ``name@EVR`` for
install-only packages (kernels), which dnf installs side by side: a new kernel is an install, not an upgrade of
the running one, and dropping the oldest kernel (installonly_limit) is a removal. Standard library only.
"""

from __future__ import annotations

import json
import re
from collections import namedtuple

from agent.errors import InputFileError, InputNotWhole
from agent.guard.hotpath.transaction import PackageChange, Transaction

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the checker's start-up budget
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

REQUEST_FORMAT = 1
DIRECTIONS = ("in", "out")
# The front ends that send this request: dnf4's plugin, dnf5's action, and the zypper guard's rpm plugin hook (which
# names rpm when rpm runs by hand: agent/guard/zypper/rpm_hook.py).
TOOLS = ("dnf", "dnf5", "zypper", "rpm")
# Install-only on every RHEL/Fedora dnf (their packages provide installonlypkg(kernel)); the front end adds what
# its own configuration says (installonlypkgs).
DEFAULT_INSTALLONLY = frozenset({
    "kernel", "kernel-core", "kernel-modules", "kernel-modules-core", "kernel-modules-extra", "kernel-devel",
    "kernel-uek", "kernel-uek-core", "kernel-uek-modules", "kernel-rt-core", "kernel-64k-core", "kernel-default",
})
_TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
_RPM_VR_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ._+~^")
_NAME_FIELD = re.compile(r'"name"\s*:\s*"([^"\\]{1,200})"')


class RpmPackage(namedtuple("RpmPackage", "name evr arch")):
    """One package as the guard sees it: name, EVR string (``[E:]V-R``) and architecture."""

    __slots__ = ()


class DnfRequest(namedtuple("DnfRequest", "transaction installed tool")):
    """One check: the Transaction, the installed set keyed like it (key -> EVR) and the front end's name."""

    __slots__ = ()


def rpm_evr(epoch: Any, version: str, release: str) -> str:
    """``version-release`` with ``epoch:`` in front only when the epoch is not 0 (as the rpm collector writes it)."""
    text = "" if epoch is None else str(epoch).strip()
    evr = f"{version}-{release}" if release else version
    return evr if text in ("", "0") else f"{text}:{evr}"


def _field(item: Mapping[str, Any], key: str, where: str, source: str, required: bool = True) -> str:
    value = item.get(key)
    if value is None or value == "":
        if required:
            raise InputFileError(source, f"{where} -> {key}: missing")
        return ""
    if not isinstance(value, str):
        raise InputFileError(source, f"{where} -> {key}: expected a string, got {type(value).__name__}")
    return value


def _package(item: Any, where: str, source: str) -> RpmPackage:
    if not isinstance(item, dict):
        raise InputFileError(source, f"{where}: expected an object, got {type(item).__name__}")
    name = _field(item, "name", where, source)
    version = _field(item, "version", where, source)
    release = _field(item, "release", where, source, required=False)
    arch = _field(item, "arch", where, source, required=False)
    for label, value in (("version", version), ("release", release)):
        bad = next((ch for ch in value if ch not in _RPM_VR_CHARS), None)
        if bad is not None or ".." in value:  # rpm builds no such version: the request is not what dnf sends
            raise InputFileError(source, f"{where} -> {label}: {value[:60]!r} has {bad or '..'!r}, which rpm does "
                                         f"not allow")
    epoch = item.get("epoch")
    if epoch is not None and not isinstance(epoch, int) and not (isinstance(epoch, str) and
                                                                  (epoch == "" or epoch.isdigit())):
        raise InputFileError(source, f"{where} -> epoch: {epoch!r} is not a number")
    if isinstance(epoch, bool):
        raise InputFileError(source, f"{where} -> epoch: {epoch!r} is not a number")
    return RpmPackage(name, rpm_evr(epoch, version, release), arch)


def _list(doc: Mapping[str, Any], key: str, source: str) -> List[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise InputFileError(source, f"{key}: expected a list, got {type(value).__name__}")
    return value


def parse_request(text: str, source: str = "dnf plugin input", tool: str = "dnf") -> DnfRequest:
    """Parse the plugin's JSON into a DnfRequest; InputFileError names the field that is wrong."""
    if not text.strip():
        raise InputNotWhole(source, "empty input: the dnf plugin sent nothing")
    try:
        doc = json.loads(text)
    except ValueError as exc:  # cut short or not the plugin's: either way not the whole transaction
        raise InputNotWhole(source, f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InputFileError(source, f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != REQUEST_FORMAT:
        raise InputFileError(source, f"request format {doc.get('format')!r} is not {REQUEST_FORMAT}: the dnf "
                                     f"plugin and the checker come from different gpuguard versions")
    sent_tool = doc.get("tool", tool)
    if sent_tool not in TOOLS:
        raise InputFileError(source, f"tool: {sent_tool!r} is not one of {', '.join(TOOLS)}")
    command_line = doc.get("command_line")
    if command_line is not None and not isinstance(command_line, str):
        raise InputFileError(source, "command_line: expected a string")
    installonly = set(DEFAULT_INSTALLONLY)
    for index, name in enumerate(doc.get("installonly") or [], 1):
        if not isinstance(name, str):
            raise InputFileError(source, f"installonly -> {index}: expected a string")
        installonly.add(name)
    installed = [_package(item, f"installed -> {i}", source)
                 for i, item in enumerate(_list(doc, "installed", source), 1)]
    incoming: List[RpmPackage] = []
    outgoing: List[RpmPackage] = []
    for index, item in enumerate(_list(doc, "items", source), 1):
        where = f"items -> {index}"
        package = _package(item, where, source)
        direction = item.get("direction")
        if direction not in DIRECTIONS:
            raise InputFileError(source, f"{where} -> direction: {direction!r} is not 'in' or 'out'")
        (incoming if direction == "in" else outgoing).append(package)
    return build_request(installed, incoming, outgoing, installonly, sent_tool, command_line)


def build_request(installed: Sequence[RpmPackage], incoming: Sequence[RpmPackage], outgoing: Sequence[RpmPackage],
                  installonly: Set[str], tool: str = "dnf", command_line: Optional[str] = None) -> DnfRequest:
    """The Transaction and keyed installed set for packages coming in and going out of an installed set."""
    after = [p for p in installed if p not in set(outgoing)] + list(incoming)
    multiarch = _multiarch(installed, installonly) | _multiarch(after, installonly)
    before_map = _keyed(installed, installonly, multiarch)
    after_map = _keyed(after, installonly, multiarch)
    arches = {_key(p, installonly, multiarch): p.arch for p in list(installed) + list(incoming)}
    reinstalled = {_key(p, installonly, multiarch) for p in incoming if p in set(outgoing)}
    changes = []
    for key in list(dict.fromkeys(list(before_map) + list(after_map))):
        old, new = before_map.get(key), after_map.get(key)
        if old != new or key in reinstalled:
            changes.append(PackageChange(key, old, new, arches.get(key, "")))
    tx = Transaction(manager="rpm", tool=tool, changes=tuple(changes), command_line=command_line)
    return DnfRequest(transaction=tx, installed=before_map, tool=tool)


def _multiarch(packages: Sequence[RpmPackage], installonly: Set[str]) -> Set[str]:
    arches: Dict[str, Set[str]] = {}
    for p in packages:
        if p.name not in installonly:
            arches.setdefault(p.name, set()).add(p.arch)
    return {name for name, seen in arches.items() if len(seen) > 1}


def _key(p: RpmPackage, installonly: Set[str], multiarch: Set[str]) -> str:
    if p.name in installonly:
        return f"{p.name}@{p.evr}"
    return f"{p.name}:{p.arch}" if p.name in multiarch else p.name


def _keyed(packages: Sequence[RpmPackage], installonly: Set[str], multiarch: Set[str]) -> Dict[str, str]:
    return {_key(p, installonly, multiarch): p.evr for p in packages}


def guess_packages(text: str) -> List[str]:
    """Every word of input that did not parse that may be a package name, for the fail-safe decision: the
    ``"name"`` fields first, then every other word (a guarded name in a field the parser never reached, or in a
    document cut short, must still count)."""
    return list(dict.fromkeys(_NAME_FIELD.findall(text) + _TOKEN.findall(text)))


def request_document(installed: Sequence[Tuple[str, Any, str, str, str]],
                     items: Sequence[Tuple[str, Any, str, str, str, str, str]], installonly: Sequence[str] = (),
                     tool: str = "dnf", command_line: Optional[str] = None) -> Dict[str, Any]:
    """The request JSON object from plain tuples: installed ``(name, epoch, version, release, arch)`` and items
    ``(name, epoch, version, release, arch, direction, action)`` (what the front ends send; tests build it too)."""
    def pkg(t: Sequence[Any]) -> Dict[str, Any]:
        return {"name": t[0], "epoch": t[1], "version": t[2], "release": t[3], "arch": t[4]}

    return {"format": REQUEST_FORMAT, "tool": tool, "command_line": command_line, "installonly": list(installonly),
            "installed": [pkg(t) for t in installed],
            "items": [dict(pkg(t), direction=t[5], action=t[6]) for t in items]}
