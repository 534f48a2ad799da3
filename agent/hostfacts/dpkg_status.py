"""Reading /var/lib/dpkg/status with the standard library only, fast enough for the apt hook's hot path.

Shared by the dpkg collector and the apt guard; it must never import pydantic or structlog (the hook's start-up
time budget is a few tens of milliseconds).
"""

from __future__ import annotations

from agent.hostfacts.package_keys import package_key

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import AbstractSet, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

# dpkg status words (third field of Status:) for which the package's files are on disk.
PRESENT_STATES = frozenset({"installed", "half-installed", "unpacked", "half-configured", "triggers-awaited",
                            "triggers-pending"})


def _field(stanza: str, key: str) -> str:
    """The value of a top-level field in one stanza ("" when absent); continuation lines never match."""
    if stanza.startswith(key):
        start = len(key)
    else:
        at = stanza.find("\n" + key)
        if at < 0:
            return ""
        start = at + 1 + len(key)
    end = stanza.find("\n", start)
    return (stanza[start:] if end < 0 else stanza[start:end]).strip()


def iter_dpkg_status(text: str, want: Optional[Callable[[str], object]] = None) -> Iterator[Tuple[str, str, str, str]]:
    """Yield (package, version, architecture, state) for every stanza whose files are present.

    ``want`` filters on the package name before the rest of the stanza is read: the hook reads only the few
    packages its policy guards, out of thousands, so the loop does as little as possible per stanza.
    """
    for stanza in text.split("\n\n"):
        if stanza[:9] == "Package: ":  # dpkg always writes Package first
            end = stanza.find("\n")
            name = (stanza[9:] if end < 0 else stanza[9:end]).strip()
        else:
            stanza = stanza.lstrip("\n")
            if not stanza:
                continue
            name = _field(stanza, "Package:")
        if not name or (want is not None and not want(name)):
            continue
        version = _field(stanza, "Version:")
        if not version:
            continue
        status = _field(stanza, "Status:")
        state = status.split()[-1] if status else ""
        if state in PRESENT_STATES:
            yield name, version, _field(stanza, "Architecture:"), state


def _package_lines(data: bytes, leads: Sequence[str]) -> Iterator[int]:
    """Where a ``Package: `` line naming a package that begins with one of ``leads`` starts.

    One split at the ``Package:`` lines, then C-level iteration (map, accumulate, compress from the built-in
    itertools) over each name's first few bytes against a dict of the leads' first bytes; only the few names
    that share them are compared in Python. A Python step per stanza, or a ``bytes.find`` pass over the file per
    lead (some needles, such as "Package: hsakmt", ran ten times slower than others), cost the apt hook
    milliseconds.
    """
    import itertools  # built into the interpreter: no import cost

    if not leads:
        return
    head = min(len(lead) for lead in leads)
    groups: Dict[bytes, List[bytes]] = {}
    for lead in leads:
        encoded = lead.encode("utf-8")
        groups.setdefault(encoded[:head], []).append(encoded)
    by_head = {key: tuple(group) for key, group in groups.items()}
    pieces = data.split(b"\nPackage: ")
    if pieces[0].startswith(b"Package: ") and pieces[0][9:].startswith(by_head.get(pieces[0][9:9 + head], ())):
        yield 0
    rest = pieces[1:]
    # piece k (k >= 1) begins after k separators of 10 bytes: its "Package: " line starts 9 bytes before it.
    starts = map(int.__sub__, itertools.accumulate(map(int.__add__, map(len, pieces), itertools.repeat(10))),
                 itertools.repeat(9))
    heads = map(bytes.__getitem__, rest, itertools.repeat(slice(0, head)))
    for at, piece in itertools.compress(zip(starts, rest), map(by_head.__contains__, heads)):
        if piece.startswith(by_head[piece[:head]]):
            yield at


def _leads(names: Sequence[str], shared: int = 5) -> List[str]:
    """Fewer name beginnings to search for that still find every name: one that another one begins is dropped
    (``kernel`` finds ``kernel-core``), and neighbours sharing at least ``shared`` leading characters are searched
    by those (``linux-image-`` and ``linux-modules-`` by ``linux-``): each search is a pass over the whole file."""
    leads: List[str] = []
    for name in sorted(set(names)):
        if leads and name.startswith(leads[-1]):
            continue
        if leads:
            common = 0
            for a, b in zip(leads[-1], name):
                if a != b:
                    break
                common += 1
            if common >= shared:
                leads[-1] = name[:common]
                continue
        leads.append(name)
    return leads


def iter_named(data: bytes, names: Sequence[str] = (), prefixes: Sequence[str] = (), suffixes: Sequence[str] = (),
               known: AbstractSet[str] = frozenset(), native_arch: str = "") -> Iterator[Tuple[str, str, str, str]]:
    """Like :func:`iter_dpkg_status` over ``data.decode("utf-8", "replace")``, for the packages named exactly
    ``names``, or starting with one of ``prefixes``, or ending with one of ``suffixes``, in file order.

    The stanzas are found in the raw bytes by ``bytes.find`` for their ``Package:`` lines, at C speed, and only
    they are decoded, instead of a Python step per stanza: the apt hook reads the few guarded packages out of
    thousands on every apt run. A file whose ``Package:`` lines are not spaced as dpkg writes them is decoded
    and read by the full scan instead.

    ``known``: names whose native-architecture copy the caller already has a version for (the apt hook: the
    transaction's packages, whose old versions apt sends); their native or ``all`` stanzas are skipped, a
    foreign-architecture copy (``name:arch``, another key) is still read.
    """
    exact, prefix, suffix = set(names), tuple(prefixes), tuple(suffixes)

    def wanted(name: str) -> bool:
        return name in exact or name.startswith(prefix) or name.endswith(suffix)

    mine = ("", "all", native_arch)
    if not _dpkg_spaced(data):
        for row in iter_dpkg_status(data.decode("utf-8", errors="replace"), wanted):
            if row[0] not in known or row[2] not in mine:
                yield row
        return
    starts: Set[int] = set(_package_lines(data, _leads(list(exact) + list(prefix))))
    for tail in suffix:
        needle = tail.encode("utf-8")
        at = data.find(needle)
        while at >= 0:
            line = data.rfind(b"\n", 0, at) + 1
            if data.startswith(b"Package: ", line):
                starts.add(line)
            at = data.find(needle, at + 1)
    stanzas = set()
    for at in starts:
        before = data.rfind(b"\n\n", 0, at)
        stanzas.add(0 if before < 0 else before + 2)
    for begin in sorted(stanzas):
        end = data.find(b"\n\n", begin)
        if end < 0:
            end = len(data)
        name = _field_at(data, begin, end, b"Package:")
        if not name or not wanted(name):
            continue
        if name in known and _field_at(data, begin, end, b"Architecture:") in mine:
            continue
        version = _field_at(data, begin, end, b"Version:")
        if not version:
            continue
        status = _field_at(data, begin, end, b"Status:")
        state = status.split()[-1] if status else ""
        if state in PRESENT_STATES:
            yield name, version, _field_at(data, begin, end, b"Architecture:"), state


def _dpkg_spaced(data: bytes) -> bool:
    """Whether the file's ``Package:`` lines are spaced as dpkg writes them (what the byte searches rely on)."""
    return b"Package:  " not in data and b"Package:\t" not in data


_PRESENT_STATES_BYTES = frozenset(state.encode("ascii") for state in PRESENT_STATES)


def count_present(data: bytes) -> int:
    """How many packages' files are present: what :func:`iter_dpkg_status` counts, read from the ``Status:`` lines
    alone (dpkg writes Package and Version in every such stanza) without decoding the file.

    The status value is found by ``bytes.find`` at C speed; a file not spaced as dpkg writes it is decoded and
    counted by the full scan instead.
    """
    if not _dpkg_spaced(data) or data.startswith(b"Status:"):
        return sum(1 for _ in iter_dpkg_status(data.decode("utf-8", errors="replace")))
    count = 0
    at = data.find(b"\nStatus:")
    while at >= 0:
        end = data.find(b"\n", at + 8)
        if end < 0:
            end = len(data)
        words = data[at + 8:end].split()
        if words and words[-1] in _PRESENT_STATES_BYTES:
            count += 1
        at = data.find(b"\nStatus:", end)
    return count


def _field_at(data: bytes, begin: int, end: int, key: bytes) -> str:
    """:func:`_field` of the stanza ``data[begin:end]``, read in place (only the value is copied and decoded)."""
    if data.startswith(key, begin, end):
        start = begin + len(key)
    else:
        at = data.find(b"\n" + key, begin, end)
        if at < 0:
            return ""
        start = at + 1 + len(key)
    stop = data.find(b"\n", start, end)
    return data[start:end if stop < 0 else stop].decode("utf-8", errors="replace").strip()


def native_architecture(text: str) -> str:
    """The host's native dpkg architecture, read from the status file: dpkg's own package is built for it (what
    ``dpkg --print-architecture`` prints); "" when dpkg is not listed (a partial fixture tree)."""
    for _, _, arch, _ in iter_named(text.encode("utf-8"), names=("dpkg",)):
        return arch
    return ""


def installed_versions(text: str, native_arch: str = "",
                       want: Optional[Callable[[str], object]] = None) -> Dict[str, str]:
    """Every present package's version (or those ``want`` accepts), keyed by :func:`package_key`."""
    return {package_key(name, arch, native_arch): version
            for name, version, arch, _ in iter_dpkg_status(text, want)}
