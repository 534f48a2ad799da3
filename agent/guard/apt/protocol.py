"""The apt adapter: parse what apt sends a ``DPkg::Pre-Install-Pkgs`` hook (protocol version 3) into a Transaction.

apt writes, on the file descriptor named in ``APT_HOOK_INFO_FD``: a ``VERSION 3`` line, its whole configuration
as ``key=value`` lines (values %-encoded), a blank line, then one line per action with nine fields::

    name oldver oldarch oldMA direction newver newarch newMA action

``-`` stands for "none", direction is ``<`` (upgrade), ``>`` (downgrade) or ``=`` (reinstall), and the action
is a .deb path, ``**CONFIGURE**`` or ``**REMOVE**`` (apt.conf(5); apt-pkg/deb/dpkgpm.cc ``SendPkgsInfo``). The
configuration may hold proxy credentials: only ``APT::Architecture`` and ``CommandLine::AsString`` are kept.
Version 1 (no header, one .deb path per line) and version 2 (five fields, no architectures) are refused by name;
anything that is not exactly what apt writes is refused rather than guessed at. Input not read whole (empty, cut
short, another first line than ``VERSION 3``, control characters or non-ASCII outside a .deb path, an over-long
action line) raises InputNotWhole, which the fail-safe refuses whatever it names; a whole stream with a field apt
would not write raises InputFileError, and the fail-safe then decides on every word that may be a package name
(:func:`guess_packages`).
Standard library only.
"""

from __future__ import annotations

from agent.errors import InputFileError, InputNotWhole
from agent.guard.hotpath.transaction import PackageChange, Transaction
from agent.hostfacts.package_keys import package_key
from agent.records import Record
from agent.versions import dpkg_version_problem

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Dict, List, Optional, Set, Tuple

PROTOCOL_VERSION = 3
_KEPT_CONFIG_KEYS = ("APT::Architecture", "CommandLine::AsString")
_HEX = "0123456789abcdefABCDEF"
_DIRECTIONS = ("<", ">", "=")
# Names and architectures as dpkg allows them ([a-z0-9][a-z0-9+.-]*, [a-z0-9][a-z0-9-]*), checked with str
# methods: importing re would cost the hook as much as starting Python.
_LOWER_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_NAME_CHARS = _LOWER_ALNUM + "+.-"
_ARCH_CHARS = _LOWER_ALNUM + "-"
_MULTIARCH = ("none", "same", "foreign", "allowed", "all")
_GUESS_TOKEN = r"[a-z0-9][a-z0-9+.:-]*"  # only for input that did not parse: not compiled at start-up
# An action line is nine short fields and a .deb path (PATH_MAX is 4096): anything longer is not apt's.
MAX_ACTION_LINE_CHARS = 65536


class AptRequest(Record):
    """One hook invocation: the Transaction, apt's native architecture and the few config values gpuguard uses."""

    __slots__ = ("transaction", "native_arch", "config")
    transaction: Transaction
    native_arch: str
    config: Dict[str, str]

    def __init__(self, transaction: Transaction, native_arch: str, config: Dict[str, str]) -> None:
        Record.__init__(self, transaction, native_arch, config)


def _is_name(text: str) -> bool:
    return bool(text) and text[0] in _LOWER_ALNUM and not text.strip(_NAME_CHARS)


def _is_arch(text: str) -> bool:
    return bool(text) and text[0] in _LOWER_ALNUM and not text.strip(_ARCH_CHARS)


def percent_decode(value: str) -> str:
    """Undo apt's %-encoding of configuration values (``%20`` is a space; a ``%`` not followed by two hex
    digits stays as it is)."""
    if "%" not in value:
        return value
    pieces = value.split("%")
    out = [pieces[0]]
    for piece in pieces[1:]:
        if len(piece) >= 2 and piece[0] in _HEX and piece[1] in _HEX:
            out.append(chr(int(piece[:2], 16)) + piece[2:])
        else:
            out.append("%" + piece)
    return "".join(out)


def parse_hook_input(text: str, source: str = "apt hook input") -> AptRequest:
    """Parse protocol-version-3 hook input; InputFileError names the line that is wrong.

    Every field is checked (package names, dpkg versions, architectures, multi-arch values, directions,
    actions): input that is not exactly what apt writes is not guessed at but refused, and the fail-safe decides.
    Versions 1 (one .deb path per line: no old versions, no removals) and 2 (no architectures) are refused by
    name: they cannot say what the transaction does to an installed set.
    """
    if not text:
        raise InputNotWhole(source, "empty input: apt sent nothing (is the hook's InfoFD option set?)")
    lines = text.split("\n")
    first = lines[0]
    if first != f"VERSION {PROTOCOL_VERSION}":
        if len(lines) == 1:
            raise InputNotWhole(source, f"the input was cut short inside its first line {first[:40]!r}")
        if first.endswith(".deb") and " " not in first:
            raise InputNotWhole(source, "hook protocol version 1 (one .deb path per line) cannot be checked: it "
                                        "names neither old versions nor removals (set "
                                        "DPkg::Tools::Options::<hook>::Version \"3\")")
        if first == "VERSION 2":
            raise InputNotWhole(source, "hook protocol version 2 cannot be checked: it names no architectures, so "
                                        "foreign-architecture packages cannot be told apart (set "
                                        "DPkg::Tools::Options::<hook>::Version \"3\")")
        if first.startswith("VERSION "):
            raise InputNotWhole(source, f"unknown hook protocol version {first[8:28]!r}: gpuguard speaks version "
                                        f"{PROTOCOL_VERSION} (set DPkg::Tools::Options::<hook>::Version \"3\")")
        raise InputNotWhole(source, f"line 1: expected 'VERSION 3', got {first[:40]!r}")
    if not text.endswith("\n"):
        raise InputNotWhole(source, f"line {len(lines)}: the last line has no newline: the input was cut short")
    config: Dict[str, str] = {}
    index = 1
    while index < len(lines) and lines[index]:
        line = lines[index]
        key, sep, value = line.partition("=")
        # apt %-encodes every byte of a key or value that is not printable ASCII, and the "=" and spaces of a key
        if not sep or not key or " " in key or not (line.isascii() and line.isprintable()):
            raise InputNotWhole(source, f"line {index + 1}: not a configuration line ('Key::Sub=value' in printable "
                                        f"ASCII) before the blank line")
        if key in _KEPT_CONFIG_KEYS:
            config[key] = percent_decode(value)
        index += 1
    if index >= len(lines) - 1:  # the blank line itself must end with a newline: "...\n\n"
        raise InputNotWhole(source, "no blank line after the configuration: the input was cut short")
    native_arch = config.get("APT::Architecture", "")
    if native_arch and not _is_arch(native_arch):
        raise InputFileError(source, f"APT::Architecture {native_arch[:40]!r} is not an architecture")
    changes: Dict[str, List[Optional[str]]] = {}
    arches: Dict[str, str] = {}
    checked: Set[Tuple[str, ...]] = set()
    unpacked: Set[str] = set()  # the text before " <path>.deb" of each unpack line
    for number, line in enumerate(lines[index + 1:], start=index + 2):
        if line.endswith(" **CONFIGURE**") and line[:-14] in unpacked:
            continue  # the configure step of a package unpacked above, byte for byte: it changes nothing
        if not (line.isascii() and line.isprintable()):
            _check_characters(line, number, source)
        if len(line) > MAX_ACTION_LINE_CHARS:
            raise InputNotWhole(source, f"line {number}: longer than {MAX_ACTION_LINE_CHARS} characters: not what "
                                        f"apt writes")
        if not line.strip():
            continue
        fields = line.split(maxsplit=8)
        if len(fields) != 9:
            raise InputFileError(source, f"line {number}: expected 9 fields (name oldver oldarch oldMA dir newver "
                                         f"newarch newMA action), got {len(fields)}")
        name, old_ver, old_arch, old_ma, direction, new_ver, new_arch, new_ma, action = fields
        package_fields = (name, old_ver, old_arch, old_ma, direction, new_ver, new_arch, new_ma)
        if package_fields not in checked:  # apt sends each package twice (unpack, configure): check it once
            problem = _line_problem(*package_fields)
            if problem:
                raise InputFileError(source, f"line {number}: {problem}")
            checked.add(package_fields)
        if action not in ("**CONFIGURE**", "**REMOVE**") and not action.endswith(".deb"):
            raise InputFileError(source, f"line {number}: {name}: action {action[:60]!r} is not a .deb path, "
                                         f"**CONFIGURE** or **REMOVE**")
        if action.endswith(".deb"):
            unpacked.add(line[:line.rfind(" ")])
        arch = new_arch if new_arch != "-" else old_arch
        key = package_key(name, arch, native_arch)
        old = None if old_ver == "-" else old_ver
        new = None if action == "**REMOVE**" or new_ver == "-" else new_ver
        if key in changes:
            changes[key][1] = new
        else:
            changes[key] = [old, new]
            arches[key] = arch
    tx = Transaction(manager="dpkg", tool="apt",
                     changes=tuple(PackageChange(k, v[0], v[1], arches[k]) for k, v in changes.items()),
                     command_line=config.get("CommandLine::AsString"))
    return AptRequest(transaction=tx, native_arch=native_arch, config=config)


def _check_characters(line: str, number: int, source: str) -> None:
    """InputNotWhole unless ``line`` is printable and its package fields ASCII: apt writes control characters and
    non-ASCII nowhere but in a local .deb path (the action field), where the words a guess reads could hide."""
    fields = line.split(" ", 8)
    if not all(field.isascii() and field.isprintable() for field in fields[:8]) or not fields[-1].isprintable():
        raise InputNotWhole(source, f"line {number}: control characters or non-ASCII outside a .deb path: not what "
                                    f"apt writes")


def _line_problem(name: str, old_ver: str, old_arch: str, old_ma: str, direction: str, new_ver: str,
                  new_arch: str, new_ma: str) -> Optional[str]:
    """What is wrong with one action line's package fields (all but the action), or None."""
    if not _is_name(name):
        return f"{name[:60]!r} is not a package name"
    for label, value in (("old", old_ver), ("new", new_ver)):
        if value != "-":
            problem = dpkg_version_problem(value)
            if problem:
                return f"{name}: {label} version {value[:60]!r} is not a dpkg version ({problem})"
    for label, value in (("old", old_arch), ("new", new_arch)):
        if value != "-" and not _is_arch(value):
            return f"{name}: {label} architecture {value[:40]!r} is not an architecture"
    for label, value in (("old", old_ma), ("new", new_ma)):
        if value not in _MULTIARCH:
            return f"{name}: {label} multi-arch {value[:40]!r} is not one of {', '.join(_MULTIARCH)}"
    if direction not in _DIRECTIONS:
        return f"direction {direction[:20]!r} is not one of < > ="
    if old_ver == "-" and new_ver == "-":
        return f"{name}: neither an old nor a new version"
    return None


def guess_packages(text: str) -> List[str]:
    """Every word of input that did not parse that may be a package name, for the fail-safe decision.

    Deliberately generous: every line, wherever it stands and whatever it looks like (a ``linux-image-..._amd64.deb``
    path, a stray action line, a line cut short), %-decoded and split at anything a package name cannot contain,
    so that a guarded name hidden where the parser did not expect it still counts. The one exception is apt's
    configuration dump (``Key::Sub=value`` lines): its values name package globs apt uses for itself
    (``APT::NeverAutoRemove``, ``APT::VersionedKernelPackages``: ``linux-image-.*``), not the transaction, so only
    ``CommandLine::AsString`` (what the operator typed) is read from it.
    """
    import re  # only input that did not parse gets here

    words: List[str] = []
    for line in text.split("\n"):
        key, sep, value = line.partition("=")
        if sep and "::" in key and not any(ch.isspace() for ch in key):
            if key == "CommandLine::AsString":
                words += re.findall(_GUESS_TOKEN, percent_decode(value).lower())
            continue
        words += re.findall(_GUESS_TOKEN, percent_decode(line).lower())
    return list(dict.fromkeys(words))
