"""The apt adapter: parse what apt sends a ``DPkg::Pre-Install-Pkgs`` hook (protocol version 3) into a Transaction.

apt writes, on the file descriptor named in ``APT_HOOK_INFO_FD``: a ``VERSION 3`` line, its whole configuration
as ``key=value`` lines (values %-encoded), a blank line, then one line per action with nine fields::

    name oldver oldarch oldMA direction newver newarch newMA action

``-`` stands for "none", direction is ``<`` (upgrade), ``>`` (downgrade) or ``=`` (reinstall), and the action
is a .deb path, ``**CONFIGURE**`` or ``**REMOVE**`` (apt.conf(5); apt-pkg/deb/dpkgpm.cc ``SendPkgsInfo``). The
configuration may hold proxy credentials: only ``APT::Architecture`` and ``CommandLine::AsString`` are kept.
Standard library only.
"""

from __future__ import annotations

import re
from collections import namedtuple

from agent.errors import InputFileError
from agent.guard.hotpath.transaction import Change, Transaction
from agent.hostfacts.dpkg_status import package_key

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Dict, List, Optional

PROTOCOL_VERSION = 3
_KEPT_CONFIG_KEYS = ("APT::Architecture", "CommandLine::AsString")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_DIRECTIONS = ("<", ">", "=")


class AptRequest(namedtuple("AptRequest", "transaction native_arch config")):
    """One hook invocation: the Transaction, apt's native architecture and the few config values gpuguard uses."""

    __slots__ = ()


def percent_decode(value: str) -> str:
    """Undo apt's %-encoding of configuration values (``%20`` is a space)."""
    return _PERCENT.sub(lambda m: chr(int(m.group(1), 16)), value)


def parse_hook_input(text: str, source: str = "apt hook input") -> AptRequest:
    """Parse protocol-version-3 hook input; InputFileError names the line that is wrong."""
    lines = text.split("\n")
    first = lines[0].strip() if lines else ""
    if not first:
        raise InputFileError(source, "empty input: apt sent nothing (is the hook's InfoFD option set?)")
    if not first.startswith("VERSION "):
        raise InputFileError(source, f"line 1: expected 'VERSION 3', got {first[:40]!r}")
    version = first[len("VERSION "):].strip()
    if version != str(PROTOCOL_VERSION):
        raise InputFileError(source, f"unknown hook protocol version {version!r}: gpuguard speaks version "
                                     f"{PROTOCOL_VERSION} (set DPkg::Tools::Options::<hook>::Version \"3\")")
    config: Dict[str, str] = {}
    index = 1
    while index < len(lines) and lines[index].strip():
        line = lines[index]
        key, sep, value = line.partition("=")
        if not sep:
            raise InputFileError(source, f"line {index + 1}: configuration line without '=' before the blank line")
        if key in _KEPT_CONFIG_KEYS:
            config[key] = percent_decode(value)
        index += 1
    if index >= len(lines) - 1:  # the blank line itself must end with a newline: "...\n\n"
        raise InputFileError(source, "no blank line after the configuration: the input was cut short")
    native_arch = config.get("APT::Architecture", "")
    changes: Dict[str, List[Optional[str]]] = {}
    arches: Dict[str, str] = {}
    for number, line in enumerate(lines[index + 1:], start=index + 2):
        if not line.strip():
            continue
        fields = line.split(maxsplit=8)
        if len(fields) != 9:
            raise InputFileError(source, f"line {number}: expected 9 fields (name oldver oldarch oldMA dir newver "
                                         f"newarch newMA action), got {len(fields)}")
        name, old_ver, old_arch, _old_ma, direction, new_ver, new_arch, _new_ma, action = fields
        if direction not in _DIRECTIONS:
            raise InputFileError(source, f"line {number}: direction {direction!r} is not one of < > =")
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
                     changes=tuple(Change(k, v[0], v[1], arches[k]) for k, v in changes.items()),
                     command_line=config.get("CommandLine::AsString"))
    return AptRequest(transaction=tx, native_arch=native_arch, config=config)


def guess_packages(text: str) -> List[str]:
    """Best-effort package names from input that did not parse (for the fail-safe decision): the first word of
    every line after the configuration, and the name part of any ``name_version_arch.deb`` path."""
    lines = text.split("\n")
    start = 0
    for i, line in enumerate(lines):
        if not line.strip() and i > 0:
            start = i + 1
            break
    names: List[str] = []
    for line in lines[start:]:
        for word in line.split():
            if word.endswith(".deb"):
                names.append(word.rsplit("/", 1)[-1].split("_", 1)[0])
        words = line.split()
        if words and "=" not in words[0] and not words[0].startswith("VERSION"):
            names.append(words[0])
    return list(dict.fromkeys(names))
