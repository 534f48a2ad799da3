"""Reading /var/lib/dpkg/status with the standard library only, fast enough for the apt hook's hot path.

Shared by the dpkg collector and the apt guard; it must never import pydantic or structlog (the hook's start-up
time budget is a few tens of milliseconds).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Callable, Dict, Iterator, Optional, Tuple

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
