"""Reading /var/lib/dpkg/status with the standard library only, fast enough for the apt hook's hot path.

Shared by the dpkg collector and the apt guard; it must never import pydantic or structlog (the hook's start-up
time budget is a few tens of milliseconds).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Callable, Dict, Iterator, Optional, Sequence, Set, Tuple

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


def _line_starts(text: str, needle: str) -> Iterator[int]:
    """Where ``needle`` starts a line of ``text``."""
    at = text.find(needle)
    while at >= 0:
        if at == 0 or text[at - 1] == "\n":
            yield at
        at = text.find(needle, at + 1)


def iter_named(text: str, names: Sequence[str] = (), prefixes: Sequence[str] = (),
               suffixes: Sequence[str] = ()) -> Iterator[Tuple[str, str, str, str]]:
    """Like :func:`iter_dpkg_status` for the packages named exactly ``names``, or starting with one of
    ``prefixes``, or ending with one of ``suffixes``, in file order.

    The stanzas are found by ``str.find`` for their ``Package:`` lines, at C speed, instead of a Python step per
    stanza: the apt hook reads the few guarded packages out of thousands on every apt run. A file whose
    ``Package:`` lines are not spaced as dpkg writes them is read by the full scan instead.
    """
    exact, prefix, suffix = set(names), tuple(prefixes), tuple(suffixes)

    def wanted(name: str) -> bool:
        return name in exact or name.startswith(prefix) or name.endswith(suffix)

    if "Package:  " in text or "Package:\t" in text:
        yield from iter_dpkg_status(text, wanted)
        return
    starts: Set[int] = set()
    for lead in list(exact) + list(prefix):
        starts.update(_line_starts(text, "Package: " + lead))
    for tail in suffix:
        at = text.find(tail)
        while at >= 0:
            line = text.rfind("\n", 0, at) + 1
            if text.startswith("Package: ", line):
                starts.add(line)
            at = text.find(tail, at + 1)
    stanzas = set()
    for at in starts:
        before = text.rfind("\n\n", 0, at)
        stanzas.add(0 if before < 0 else before + 2)
    for begin in sorted(stanzas):
        end = text.find("\n\n", begin)
        yield from iter_dpkg_status(text[begin:] if end < 0 else text[begin:end], wanted)


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
