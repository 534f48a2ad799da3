"""Render the policy as dnf versionlock entries: the rpm side of ``gpuguard pin apply``.

The records are the ones apt gets as preferences (agent.guard.pin_records): frozen packages locked to their
installed build, forbidden builds excluded. Both versionlock implementations work through excludes, so even an
explicit ``dnf install name-version`` of a forbidden build finds nothing ("All matches were filtered out by
exclude filtering"); ``--disableplugin=versionlock`` (dnf4) or editing the file still gets round them, so the
dnf plugin and rollback stay the real guard.

- dnf4 (dnf-plugins-core versionlock): ``/etc/dnf/plugins/versionlock.list`` (or the plugin's ``locklist=``),
  one ``name-epoch:version-release.*`` lock or ``!name-epoch:version-release.*`` exclude per line. gpuguard keeps
  its entries between its own BEGIN/END marker lines and never touches a line outside them.
- dnf5 (built in): ``/etc/dnf/versionlock.toml``, ``[[packages]]`` entries with ``[[packages.conditions]]``
  (key ``evr``, comparator ``=`` / ``!=``). dnf5 rewrites the file without TOML comments, so gpuguard marks its
  entries in their ``comment`` field (``gpuguard: ...``); every other entry is kept as it is.

Entries of one name are OR'ed by both tools, and the conditions of one dnf5 entry AND'ed: the forbidden builds
of a name therefore go into one entry with one ``!=`` condition each.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from agent.errors import InputFileError
from agent.guard.pin_records import Pin, PinFileChanges
from agent.tomlreader import toml_module

if TYPE_CHECKING:  # pragma: no cover
    from agent.guard.dnf.tool import DnfTool
    from agent.host import Host
    from agent.policy.compiled import CompiledPolicy

DNF4_CONF = "/etc/dnf/plugins/versionlock.conf"
DNF4_LIST = "/etc/dnf/plugins/versionlock.list"
DNF5_TOML = "/etc/dnf/versionlock.toml"
BEGIN = "# >>> gpuguard (gpuguard pin apply): entries down to the END line are overwritten; change the policy instead"
END = "# <<< gpuguard END"
COMMENT_PREFIX = "gpuguard: "
TOML_VERSION = "1.0"


def _epoch_evr(version: str) -> str:
    """``epoch:version-release`` with the epoch spelled out (versionlock.list wants it)."""
    return version if re.match(r"^\d+:", version) else f"0:{version}"


def dnf4_entries(frozen: Sequence[Pin], forbidden: Sequence[Pin]) -> List[str]:
    """The versionlock.list lines for the records, with a comment line saying why (pure)."""
    lines: List[str] = []
    for pin in frozen:
        lines += [f"# {pin.why}", f"{pin.package}-{_epoch_evr(pin.version)}.*"]
    frozen_names = {p.package for p in frozen}
    for pin in forbidden:
        if pin.package not in frozen_names:  # a lock already excludes every other build of the name
            lines += [f"# {pin.why}", f"!{pin.package}-{_epoch_evr(pin.version)}.*"]
    return lines


def split_managed_block(text: str) -> Tuple[List[str], List[str]]:
    """(operator lines, gpuguard's lines) of a versionlock.list; an unclosed block runs to the end of the file."""
    outside: List[str] = []
    inside: List[str] = []
    in_block = False
    for line in text.splitlines():
        if line.strip() == BEGIN:
            in_block = True
        elif line.strip() == END and in_block:
            in_block = False
        elif in_block:
            inside.append(line)
        else:
            outside.append(line)
    return outside, inside


def merge_dnf4(existing: str, entries: Sequence[str], stamp: str) -> str:
    """The new versionlock.list: the operator's lines untouched, gpuguard's block replaced (or dropped) (pure)."""
    outside, _ = split_managed_block(existing)
    while outside and not outside[-1].strip():
        outside.pop()
    if not entries:
        return "\n".join(outside) + "\n" if outside else ""
    block = [BEGIN, stamp, *entries, END]
    return "\n".join([*outside, *([""] if outside else []), *block]) + "\n"


def _entry_lines(lines: Sequence[str]) -> List[str]:
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _evr(version: str) -> str:
    return version.split(":", 1)[1] if version.startswith("0:") else version


def dnf5_packages(frozen: Sequence[Pin], forbidden: Sequence[Pin]) -> List[Dict[str, Any]]:
    """gpuguard's ``[[packages]]`` entries for versionlock.toml (pure)."""
    out: List[Dict[str, Any]] = []
    for pin in frozen:
        out.append({"name": pin.package, "comment": COMMENT_PREFIX + pin.why,
                    "conditions": [{"key": "evr", "comparator": "=", "value": _evr(pin.version)}]})
    frozen_names = {p.package for p in frozen}
    by_name: Dict[str, List[Pin]] = {}
    for pin in forbidden:
        if pin.package not in frozen_names:
            by_name.setdefault(pin.package, []).append(pin)
    for name, pins in sorted(by_name.items()):
        reasons = "; ".join(dict.fromkeys(p.why for p in pins))
        out.append({"name": name, "comment": COMMENT_PREFIX + "forbidden: " + reasons,
                    "conditions": [{"key": "evr", "comparator": "!=", "value": _evr(p.version)} for p in pins]})
    return out


def _toml_value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    raise ValueError(f"{where}: cannot keep a value of type {type(value).__name__}")


def render_dnf5(document: Mapping[str, Any], where: str = "versionlock.toml") -> str:
    """versionlock.toml text for a parsed document: scalars, then ``[[packages]]`` with their conditions."""
    lines = [f"{key} = {_toml_value(value, f'{where}: {key}')}" for key, value in document.items()
             if key != "packages"]
    for index, package in enumerate(document.get("packages") or [], 1):
        lines += ["", "[[packages]]"]
        tables = []
        for key, value in package.items():
            if key == "conditions":
                tables = value
                continue
            lines.append(f"{key} = {_toml_value(value, f'{where}: packages -> {index} -> {key}')}")
        for cond_index, condition in enumerate(tables, 1):
            lines.append("[[packages.conditions]]")
            lines += [f"{key} = {_toml_value(value, f'{where}: packages -> {index} -> conditions -> {cond_index}')}"
                      for key, value in condition.items()]
    return "\n".join(lines) + "\n"


def _is_ours(package: Mapping[str, Any]) -> bool:
    return str(package.get("comment", "")).startswith(COMMENT_PREFIX)


def parse_dnf5(text: str, where: str) -> Dict[str, Any]:
    """A parsed versionlock.toml; InputFileError (one line) when it is not TOML or not version 1.0."""
    tomllib = toml_module()
    document: Dict[str, Any]
    try:
        document = tomllib.loads(text) if text.strip() else {"version": TOML_VERSION}
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(where, f"not valid TOML ({exc}); fix or remove it, gpuguard left it alone") from None
    if str(document.get("version", "")) != TOML_VERSION:
        raise InputFileError(where, f"versionlock file version {document.get('version')!r} is not "
                                    f"{TOML_VERSION!r}; gpuguard left it alone")
    packages = document.get("packages", [])
    if not isinstance(packages, list) or not all(isinstance(p, dict) for p in packages):
        raise InputFileError(where, "packages is not an array of tables; gpuguard left it alone")
    return document


def merge_dnf5(existing: str, ours: Sequence[Mapping[str, Any]], where: str) -> Tuple[str, int, int]:
    """(new versionlock.toml text, gpuguard entries before, after): others' entries kept, ours replaced (pure)."""
    document = parse_dnf5(existing, where)
    packages = list(document.get("packages") or [])
    kept = [p for p in packages if not _is_ours(p)]
    before = len(packages) - len(kept)
    merged = {k: v for k, v in document.items() if k != "packages"}
    merged["version"] = document.get("version", TOML_VERSION)
    merged["packages"] = [*kept, *ours]
    try:
        text = render_dnf5(merged, where) if merged["packages"] or existing.strip() else ""
    except ValueError as exc:
        raise InputFileError(where, f"{exc}; gpuguard left it alone") from None
    return text, before, len(ours)


def dnf4_locklist_path(host: Host) -> Tuple[str, Optional[str]]:
    """The host path of versionlock.list (``locklist=`` of the plugin's config) and a note when the plugin's
    config is missing (then the entries have no effect until python3-dnf-plugin-versionlock is installed)."""
    from agent.hostfacts.keyvalue import parse_key_value_lines

    conf = host.read_text(DNF4_CONF)
    if conf is None:
        return DNF4_LIST, (f"{DNF4_CONF} not found: install the dnf versionlock plugin "
                           "(python3-dnf-plugin-versionlock) for these entries to take effect")
    return parse_key_value_lines(conf).get("locklist") or DNF4_LIST, None


def uses_dnf5(host: Host) -> bool:
    """Whether the host's dnf is dnf5 (its versionlock is built in and reads versionlock.toml)."""
    return host.which("dnf5") is not None


def apply_versionlock(host: Host, policy: CompiledPolicy, tool: DnfTool, installed: Mapping[str, str],
                      dry_run: bool = False) -> PinFileChanges:
    """Query available builds, render gpuguard's entries and merge them into the host's versionlock file."""
    from agent.files import write_atomically
    from agent.guard.pin_records import names_to_query, pin_records
    from agent.hostfacts.context import read_host_context
    from agent.policy.evaluate import facts_used

    exact, globs = names_to_query(policy, manager="rpm")
    available = tool.available_versions(sorted(set(exact)) + sorted(set(globs)))
    frozen, forbidden = pin_records(policy, installed, available, manager="rpm",
                                    context=read_host_context(str(host.root), facts_used(policy)))
    stamp = f"# policy '{policy.name}' ({', '.join(policy.sources) or policy.path})"
    if uses_dnf5(host):
        path, note = DNF5_TOML, None
        existing = host.read_text(path) or ""
        ours = dnf5_packages(frozen, forbidden)
        document = parse_dnf5(existing, str(host.path(path)))
        old = [p for p in document.get("packages") or [] if _is_ours(p)]
        text, _, _ = merge_dnf5(existing, ours, str(host.path(path)))
        old_keys = [_dnf5_key(p) for p in old]
        new_keys = [_dnf5_key(p) for p in ours]
    else:
        path, note = dnf4_locklist_path(host)
        existing = host.read_text(path) or ""
        entries = dnf4_entries(frozen, forbidden)
        text = merge_dnf4(existing, entries, stamp)
        old_keys = _entry_lines(split_managed_block(existing)[1])
        new_keys = _entry_lines(entries)
    added = [k for k in new_keys if k not in old_keys]
    removed = [k for k in old_keys if k not in new_keys]
    changed = text != existing
    if changed and not dry_run:
        write_atomically(str(host.path(path)), text)
    return PinFileChanges(path, added, removed, len(new_keys) - len(added), text, changed, note)


def _dnf5_key(package: Mapping[str, Any]) -> str:
    conditions = " ".join(f"evr {c.get('comparator')} {c.get('value')}" for c in package.get("conditions") or [])
    return f"{package.get('name')}: {conditions}"
