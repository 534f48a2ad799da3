"""Render the policy as zypper locks: the zypper side of ``gpuguard pin apply``.

The records are the ones apt gets as preferences and dnf as versionlock entries (agent.guard.pin_records): frozen
packages locked at their installed build, forbidden builds locked away. libzypp reads ``/etc/zypp/locks`` (in the
target root) on every solver run of every front end (zypper, YaST, PackageKit): a locked installed build stays,
a locked available build is never installed. The file is a list of serialized PoolQuery blocks separated by empty
lines, as ``zypper addlock 'amdgpu-dkms = 1:6.8.5.60202-2041575.sles15'`` writes them::

    type: package
    version: == 1:6.8.5.60202-2041575.sles15
    match_type: glob
    case_sensitive: on
    solvable_name: amdgpu-dkms

gpuguard writes its blocks between BEGIN/END comment lines and never touches a block outside them. ``zypper
addlock``/``removelock`` rewrite the whole file without comments; a block of gpuguard's that is then outside the
markers is recognised by its content when it is still wanted (never written twice), and left alone otherwise
(``zypper removelock`` removes it). ``zypper removelock`` or editing the file still gets round the locks, so the
rpm plugin and rollback stay the real guard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from agent.errors import InputFileError
from agent.guard.pin_records import Pin, PinFileChanges

if TYPE_CHECKING:  # pragma: no cover
    from agent.host import Host
    from agent.policy.compiled import CompiledPolicy

LOCKS_FILE = "/etc/zypp/locks"
BEGIN = "# >>> gpuguard (gpuguard pin apply): blocks down to the END line are overwritten; change the policy instead"
END = "# <<< gpuguard END"
SEARCH_TIMEOUT_SECONDS = 120.0
# zypper search's exit code when nothing matched (ZYPPER_EXIT_INF_CAP_NOT_FOUND): an empty answer, not a failure.
ZYPPER_NOTHING_FOUND_CODE = 104

Block = Tuple[Tuple[str, str], ...]


def lock_block(name: str, version: Optional[str]) -> Block:
    """One lock as zypper addlock writes it: the name, and ``== EVR`` when one build is meant."""
    fields: List[Tuple[str, str]] = [("type", "package")]
    if version:
        fields.append(("version", f"== {version}"))
    fields += [("match_type", "glob"), ("case_sensitive", "on"), ("solvable_name", name)]
    return tuple(fields)


def lock_blocks(frozen: Sequence[Pin], forbidden: Sequence[Pin]) -> List[Tuple[str, Block]]:
    """(why, block) for every record: each frozen build locked where it is, each forbidden build locked away
    unless its name is frozen (the installed build's lock keeps every other out already) (pure)."""
    out = [(pin.why, lock_block(pin.package, pin.version)) for pin in frozen]
    frozen_names = {p.package for p in frozen}
    out += [(pin.why, lock_block(pin.package, pin.version)) for pin in forbidden if pin.package not in frozen_names]
    return out


def parse_locks(text: str, where: str = LOCKS_FILE) -> Tuple[List[Block], List[Block]]:
    """(blocks outside gpuguard's markers, blocks inside them); InputFileError for a line that is not
    ``key: value`` (gpuguard then leaves the file alone)."""
    outside: List[Block] = []
    inside: List[Block] = []
    current: List[Tuple[str, str]] = []
    in_block = False

    def close() -> None:
        if current:
            (inside if in_block else outside).append(tuple(current))
            current.clear()

    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line == BEGIN or line == END:
            close()
            in_block = line == BEGIN
        elif not line:
            close()
        elif line.startswith("#"):
            continue
        else:
            key, sep, value = line.partition(":")
            if not sep or not key.strip():
                raise InputFileError(where, f"line {number}: {line[:80]!r} is not 'key: value'; gpuguard left "
                                            "the file alone")
            current.append((key.strip(), value.strip()))
    close()
    return outside, inside


def render_block(block: Block) -> List[str]:
    return [f"{key}: {value}" for key, value in block]


def merge_locks(existing: str, ours: Sequence[Tuple[str, Block]], stamp: str,
                where: str = LOCKS_FILE) -> Tuple[str, List[Block], List[Block]]:
    """(the new locks file, gpuguard's blocks before, after): others' blocks kept in their order, ours replaced;
    a block outside the markers equal to one of ours is taken as ours (zypper dropped the markers) (pure)."""
    outside, inside = parse_locks(existing, where)
    wanted = [block for _, block in ours]
    kept = [b for b in outside if b not in wanted]
    before = inside + [b for b in outside if b in wanted]
    lines: List[str] = []
    for block in kept:
        lines += ["", *render_block(block)]
    if ours:
        lines += ["", BEGIN, f"# {stamp}"]
        for why, block in ours:
            lines += ["", f"# {why}", *render_block(block)]
        lines += ["", END]
    text = "\n".join(lines).lstrip("\n") + "\n" if lines else ""
    return text, before, wanted


def parse_search_xml(text: str) -> Dict[str, List[str]]:
    """Versions per name from ``zypper --xmlout search -s`` (``<solvable name= edition= kind=package>``)."""
    import xml.etree.ElementTree as ET

    start = text.find("<stream")
    try:
        root = ET.fromstring(text[start:] if start >= 0 else text)
    except ET.ParseError as exc:
        raise InputFileError("zypper search --xmlout", f"not XML ({exc})") from None
    out: Dict[str, List[str]] = {}
    for solvable in root.iter("solvable"):
        name, edition = solvable.get("name"), solvable.get("edition")
        if solvable.get("kind", "package") == "package" and name and edition:
            versions = out.setdefault(name, [])
            if edition not in versions:
                versions.append(edition)
    return out


def available_versions(host: Host, specs: Sequence[str]) -> Dict[str, List[str]]:
    """Versions the host's repositories offer per name (``specs``: names or globs), through zypper search."""
    if not specs:
        return {}
    argv = ["zypper", "--non-interactive", "--xmlout", "--no-refresh", "search", "--details", "--type", "package",
            *specs]
    if str(host.root) != "/":
        argv[1:1] = ["--root", str(host.root)]
    result = host.run(argv, timeout_seconds=SEARCH_TIMEOUT_SECONDS)
    if result.returncode == ZYPPER_NOTHING_FOUND_CODE:
        return {}
    result.check()
    return parse_search_xml(result.stdout)


def uses_zypper(host: Host) -> bool:
    """Whether the host's package front end is zypper (an rpm host with zypper and no dnf)."""
    return host.which("zypper") is not None and host.which("dnf") is None and host.which("dnf5") is None


def describe(block: Block) -> str:
    fields = dict(block)
    version = fields.get("version")
    return f"{fields.get('solvable_name', '?')}{' ' + version if version else ''}"


def apply_locks(host: Host, policy: CompiledPolicy, installed: Mapping[str, str],
                dry_run: bool = False) -> PinFileChanges:
    """Query available builds, render gpuguard's locks and merge them into the host's /etc/zypp/locks."""
    from agent.files import write_atomically
    from agent.guard.pin_records import names_to_query, pin_records
    from agent.hostfacts.context import read_host_context
    from agent.policy.evaluate import facts_used

    exact, globs = names_to_query(policy, manager="rpm")
    available = available_versions(host, sorted(set(exact)) + sorted(set(globs)))
    frozen, forbidden = pin_records(policy, installed, available, manager="rpm",
                                    context=read_host_context(str(host.root), facts_used(policy)))
    stamp = f"policy '{policy.name}' ({', '.join(policy.sources) or policy.path})"
    existing = host.read_text(LOCKS_FILE) or ""
    text, before, after = merge_locks(existing, lock_blocks(frozen, forbidden), stamp, str(host.path(LOCKS_FILE)))
    added = [describe(b) for b in after if b not in before]
    removed = [describe(b) for b in before if b not in after]
    changed = text != existing
    if changed and not dry_run:
        host.path(LOCKS_FILE).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(str(host.path(LOCKS_FILE)), text)
    return PinFileChanges(LOCKS_FILE, added, removed, len(after) - len(added), text, changed)
