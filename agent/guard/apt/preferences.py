"""Render the policy as apt preferences: defence in depth for tools that skip the hook.

``gpuguard pin apply`` writes ``/etc/apt/preferences.d/gpuguard-*.pref``:

- ``gpuguard-frozen.pref``: ``Pin-Priority: 1001`` on the installed version of every frozen package. apt keeps
  it as the candidate, and ``apt-get --allow-downgrades full-upgrade`` even brings it back.
- ``gpuguard-forbidden.pref``: ``Pin-Priority: -1`` on every available version that no allowed state can contain
  (a kernel that is not allowed, an NVIDIA release in no pairing, a version outside a version rule, an AMD driver,
  firmware or ROCm build the hook would refuse beside the installed packages). apt never picks such a version as a
  candidate. The AMD pins follow the installed pairing and driver build: rerun after moving them.

Both are soft guards: an explicit ``apt-get install pkg=version`` overrides them (the hook still refuses it), and
the first specific record matching a version wins. Only files that start with the gpuguard header are ever
rewritten or removed. Versions are listed exactly (from ``apt-cache madison``), so rerun it after ``apt update``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from agent.files import write_atomically
from agent.guard.apt.tool import AptTool
from agent.guard.pin_records import Pin, glob_prefix, names_to_query, pin_records
from agent.host import Host
from agent.hostfacts.context import HostContext, read_host_context
from agent.policy.compiled import CompiledPolicy
from agent.policy.evaluate import facts_used

HEADER = "# Managed by gpuguard (gpuguard pin apply): edits are overwritten; remove the policy rule instead."
FILE_PREFIX = "gpuguard-"
FILE_SUFFIX = ".pref"


def render_record(pin: Pin) -> str:
    """One apt preferences record."""
    return (f"Explanation: gpuguard: {pin.why}\nPackage: {pin.package}\nPin: version {pin.version}\n"
            f"Pin-Priority: {pin.priority}\n")


def render_pins(policy: CompiledPolicy, installed: Mapping[str, str], available: Mapping[str, Sequence[str]],
                manager: str = "dpkg", *, context: Optional[HostContext]) -> Dict[str, str]:
    """File name -> content for every gpuguard preferences file (pure).

    ``installed``: guarded packages and their installed versions; ``available``: versions the indexes offer;
    ``context``: the host's facts the policy's rules read (see :func:`pin_records`).
    """
    frozen_pins, forbidden = pin_records(policy, installed, available, manager, context=context)
    files = {}
    stamp = f"# policy '{policy.name}' ({', '.join(policy.sources) or policy.path})\n"
    if frozen_pins:
        files[f"{FILE_PREFIX}frozen{FILE_SUFFIX}"] = HEADER + "\n" + stamp + "\n" + "\n".join(
            render_record(p) for p in frozen_pins)
    if forbidden:
        files[f"{FILE_PREFIX}forbidden{FILE_SUFFIX}"] = HEADER + "\n" + stamp + "\n" + "\n".join(
            render_record(p) for p in forbidden)
    return files


@dataclass(frozen=True)
class PinChanges:
    """What ``apply_pins`` wrote, removed and left alone."""

    written: List[str]
    unchanged: List[str]
    removed: List[str]
    foreign: List[str]  # gpuguard-*.pref files without our header: never touched


def plan_pin_files(existing: Mapping[str, str], wanted: Mapping[str, str]) -> PinChanges:
    """Compare the gpuguard-*.pref files in preferences.d (name -> content) with the wanted set (pure)."""
    written, unchanged, removed, foreign = [], [], [], []
    for name, content in sorted(wanted.items()):
        if name in existing and not existing[name].startswith(HEADER):
            foreign.append(name)
        elif existing.get(name) == content:
            unchanged.append(name)
        else:
            written.append(name)
    for name, content in sorted(existing.items()):
        if name in wanted or not (name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX)):
            continue
        if content.startswith(HEADER):
            removed.append(name)
        elif name not in foreign:
            foreign.append(name)
    return PinChanges(written, unchanged, removed, foreign)


def apply_pins(host: Host, policy: CompiledPolicy, preferences_dir: str, tool: AptTool, installed: Mapping[str, str],
               dry_run: bool = False) -> Tuple[PinChanges, Dict[str, str]]:
    """Query available versions, render, and write/remove gpuguard's own preferences files."""
    exact, globs = names_to_query(policy)
    names = list(exact)
    for pattern in globs:
        names += [n for n in tool.package_names(glob_prefix(pattern)) if fnmatch.fnmatchcase(n, pattern)]
    available = tool.available_versions(sorted(set(names)))
    wanted = render_pins(policy, installed, available,
                         context=read_host_context(str(host.root), facts_used(policy)))
    existing = {}
    for name in host.list_dir(preferences_dir):
        if name.startswith(FILE_PREFIX):
            existing[name] = host.read_text(f"{preferences_dir}/{name}") or ""
    changes = plan_pin_files(existing, wanted)
    if not dry_run:
        for name in changes.written:
            write_atomically(str(host.path(f"{preferences_dir}/{name}")), wanted[name])
        for name in changes.removed:
            host.path(f"{preferences_dir}/{name}").unlink()
    return changes, wanted
