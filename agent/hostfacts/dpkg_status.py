"""Reading /var/lib/dpkg/status with the standard library only, fast enough for the apt hook's hot path.

Shared by the dpkg collector and the apt guard; it must never import pydantic or structlog (the hook's start-up
time budget is a few tens of milliseconds).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

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


def _line_starts(data: bytes, needle: bytes) -> Iterator[int]:
    """Where ``needle`` starts a line of ``data``."""
    at = data.find(needle)
    while at >= 0:
        if at == 0 or data[at - 1] == 10:  # b"\n"
            yield at
        at = data.find(needle, at + 1)


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


def iter_named(data: bytes, names: Sequence[str] = (), prefixes: Sequence[str] = (),
               suffixes: Sequence[str] = ()) -> Iterator[Tuple[str, str, str, str]]:
    """Like :func:`iter_dpkg_status` over ``data.decode("utf-8", "replace")``, for the packages named exactly
    ``names``, or starting with one of ``prefixes``, or ending with one of ``suffixes``, in file order.

    The stanzas are found in the raw bytes by ``bytes.find`` for their ``Package:`` lines, at C speed, and only
    they are decoded, instead of a Python step per stanza: the apt hook reads the few guarded packages out of
    thousands on every apt run. A file whose ``Package:`` lines are not spaced as dpkg writes them is decoded
    and read by the full scan instead.
    """
    exact, prefix, suffix = set(names), tuple(prefixes), tuple(suffixes)

    def wanted(name: str) -> bool:
        return name in exact or name.startswith(prefix) or name.endswith(suffix)

    if b"Package:  " in data or b"Package:\t" in data:
        yield from iter_dpkg_status(data.decode("utf-8", errors="replace"), wanted)
        return
    starts: Set[int] = set()
    for lead in _leads(list(exact) + list(prefix)):
        starts.update(_line_starts(data, b"Package: " + lead.encode("utf-8")))
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
        chunk = data[begin:] if end < 0 else data[begin:end]
        yield from iter_dpkg_status(chunk.decode("utf-8", errors="replace"), wanted)


def native_architecture(text: str) -> str:
    """The host's native dpkg architecture, read from the status file: dpkg's own package is built for it (what
    ``dpkg --print-architecture`` prints); "" when dpkg is not listed (a partial fixture tree)."""
    for _, _, arch, _ in iter_named(text.encode("utf-8"), names=("dpkg",)):
        return arch
    return ""


def package_key(name: str, arch: str, native_arch: str = "") -> str:
    """How a package is named in an installed set: ``name``, or ``name:arch`` for a foreign architecture."""
    if not arch or arch in ("all", "-", "none") or not native_arch or arch == native_arch:
        return name
    return f"{name}:{arch}"


def installed_versions(text: str, native_arch: str = "",
                       want: Optional[Callable[[str], object]] = None) -> Dict[str, str]:
    """Every present package's version (or those ``want`` accepts), keyed by :func:`package_key`."""
    return {package_key(name, arch, native_arch): version
            for name, version, arch, _ in iter_dpkg_status(text, want)}
