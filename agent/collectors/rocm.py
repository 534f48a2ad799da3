"""ROCm user space: the active /opt/rocm, every installed /opt/rocm-X.Y.Z (classic packaging), every
/opt/rocm/core-X.Y (ROCm built with TheRock, 7.13 on), the amdsmi library each carries, and what amdsmi says.

TheRock installs a release under ``/opt/rocm/core-X.Y`` (major.minor; patches in place), with ``/opt/rocm/core``
and ``/opt/rocm/core-X`` links to the newest (TheRock RFC0009). A tree's release is read from its version file
``<tree>/.info/version`` (``/opt/rocm/core-10.0/.info/version`` on TheRock hosts, which have no
``/opt/rocm/.info/version``), else from rocm-core's header ``<tree>/include/rocm-core/rocm_version.h``
(``ROCM_VERSION_MAJOR``/``MINOR``/``PATCH``); the header's release is kept beside the file's so that a
disagreement is a finding. The release packages (rocm-core, amdrocm-base<release>) are the third source, added by
the snapshot (agent/snapshot/rocm_release.py), which sees the package database. On a host with a classic stack as
well, ``/opt/rocm`` is the classic link and TheRock's trees land inside its target; they are listed all the same:
the host has both.

The amdsmi Python binding pip installed in a system site directory (agent/hostfacts/python_dists.py) is reported
here too: it loads the libamd_smi of these trees, and a binding of another release is a finding.

Debian and Ubuntu package ROCm themselves: no /opt/rocm, each library under /usr/lib/<triplet> in a package named
after its SONAME (``libamdhip64-5`` 5.7.1, ``libhsa-runtime64-1`` 6.1.2, ``librocblas0`` 5.5.1 on Debian 13). Those
packages are listed (``packaged``) with the release each carries, and where no tree gives the version, the release is
rocm-core's package, else HIP's, else ROCr's; without a dpkg database, HIP's library file under the multiarch
directories (``libamdhip64.so.5.7.31921`` is HIP 5.7). ``version_source`` names where it came from.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from agent.collectors.dpkg import DPKG_STATUS
from agent.defaults import (
    DISTRIBUTION_LIBRARY_DIRS,
    DISTRIBUTION_ROCM_PACKAGES,
    DISTRIBUTION_ROCM_RELEASE_PACKAGES,
)
from agent.errors import CollectorUnavailable, HostReadError, LibraryUnavailable
from agent.frozen import Frozen, field, frozen_record
from agent.host import Host
from agent.hostfacts.alternatives import read_active_tree
from agent.hostfacts.dpkg_status import iter_named
from agent.hostfacts.python_dists import find_distribution
from agent.lazyre import LazyPattern
from agent.log import get_logger
from agent.versions import sort_key, upstream_dotted

log = get_logger("collectors.rocm")

ROCM_LINK = "/opt/rocm"
ROCM_PREFIX = "/opt"
VERSION_FILE = ".info/version"
VERSION_HEADER = "include/rocm-core/rocm_version.h"
_HEADER_FIELD = LazyPattern(r"^\s*#\s*define\s+ROCM_VERSION_(MAJOR|MINOR|PATCH)\s+\(?\s*(\d+)\s*\)?\s*$", re.M)
_INSTALL_DIR = LazyPattern(r"^rocm-\d+(?:\.\d+)*")
_HIP_LIBRARY = LazyPattern(r"^libamdhip64\.so\.(\d+)\.(\d+)\.\d+$")  # the third number is HIP's build
_THEROCK_DIR = LazyPattern(r"^core-\d+\.\d+$")  # core-7.13, core-10.0; core and core-10 are links
_AMD_SMI_LIB = LazyPattern(r"^libamd_smi\.so\.(\d+)(?:\.\d+)*$")  # libamd_smi.so.27, libamd_smi.so.27.0.0
_LIB_DIRS = ("lib", "lib64")
_VERSION = LazyPattern(r"^\d+(?:\.\d+)+(?:[-+~.][0-9A-Za-z.~+-]*)?$")


@frozen_record
class RocmInstall(Frozen):
    """One ROCm tree on disk."""

    # added after snapshots were stored (see as_json_data)
    __json_omit_empty__ = ("amd_smi_soname", "version_source", "header_version")

    path: str
    version: Optional[str] = None
    # libamd_smi.so.27: the amdsmi binding must be of its release (the newest SONAME when a tree has several)
    amd_smi_soname: Optional[str] = None
    # where ``version`` was read when not the tree's .info/version: VERSION_HEADER, or a release package's name
    version_source: Optional[str] = None
    # the release in the tree's rocm_version.h where it has one (beside the version file's: they must agree)
    header_version: Optional[str] = None


@frozen_record
class AmdsmiBinding(Frozen):
    """The amdsmi Python binding pip installed in a system site directory."""

    version: str
    site_directory: str


@frozen_record
class PackagedComponent(Frozen):
    """One ROCm library as the distribution packages it: the package, its version and the release it carries."""

    package: str
    version: str
    release: Optional[str] = None


@frozen_record
class RocmAlternative(Frozen):
    """The update-alternatives entry that chooses the active tree (agent/hostfacts/alternatives.py): its name
    (``core``), the link it sets (``/opt/rocm/core``), the tree it points at, its mode and its choices."""

    name: str
    link: str
    target: str
    mode: str = ""  # auto | manual; "" when the alternatives database has no entry
    choices: List[str] = field(default_factory=list)


@frozen_record
class RocmInfo(Frozen):
    """Which ROCm is active and which are installed."""

    # added after snapshots were stored
    __json_omit_empty__ = ("packaged", "version_source", "amdsmi_binding", "alternative")

    active_path: Optional[str] = None
    version: Optional[str] = None
    installs: List[RocmInstall] = field(default_factory=list)
    smi_rocm_version: Optional[str] = None
    packaged: List[PackagedComponent] = field(default_factory=list)
    version_source: Optional[str] = None  # as RocmInstall's: None is the active tree's .info/version
    amdsmi_binding: Optional[AmdsmiBinding] = None
    # side-by-side trees switched by update-alternatives: which one it points at (active_path is that tree)
    alternative: Optional[RocmAlternative] = None


def parse_rocm_version_file(text: str) -> Optional[str]:
    """The version in a ROCm tree's ``.info/version``: ``6.2.2-116`` (6.x, with build) or ``7.0.1`` (7.x).

    Lenient: surrounding whitespace and further lines are ignored; text that does not start with a dotted number
    gives None.
    """
    stripped = text.strip()
    if not stripped:
        return None
    first = stripped.splitlines()[0].strip()
    return first if _VERSION.match(first) else None


def parse_rocm_version_header(text: str) -> Optional[str]:
    """``MAJOR.MINOR.PATCH`` from rocm-core's ``rocm_version.h`` (``#define ROCM_VERSION_MAJOR 7``...); None unless
    all three are defined."""
    found = {name: value for name, value in _HEADER_FIELD.findall(text)}
    if set(found) != {"MAJOR", "MINOR", "PATCH"}:
        return None
    return f"{int(found['MAJOR'])}.{int(found['MINOR'])}.{int(found['PATCH'])}"


def smi_rocm_version(result: object) -> Optional[str]:
    """The version from ``amdsmi_get_rocm_version()``'s ``(ok, text)``; None when it failed (text is the error)."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return None
    ok, text = result
    if ok is not True or not isinstance(text, str):
        return None
    return text.strip() or None


def packaged_components(status: bytes) -> List[PackagedComponent]:
    """The distribution's ROCm libraries in a dpkg status file: the runtime libraries (names ending in their
    SONAME's number, ``libamdhip64-5``, ``librocblas0``) and hipcc, with the release their version carries
    (``5.7.1-6+deb13u1`` -> ``5.7.1``, ``6.4.3+dfsg-5`` -> ``6.4.3``)."""
    prefixes = [p[:-1] for p in DISTRIBUTION_ROCM_PACKAGES if p.endswith("*")]
    names = [p for p in DISTRIBUTION_ROCM_PACKAGES if not p.endswith("*")]
    found: Dict[str, PackagedComponent] = {}
    for name, version, _arch, _state in iter_named(status, names=names, prefixes=prefixes):
        if name[-1:].isdecimal() or name in names:
            found[name] = PackagedComponent(package=name, version=version, release=upstream_dotted(version))
    return [found[name] for name in sorted(found)]


def packaged_release(components: List[PackagedComponent]) -> Tuple[Optional[str], Optional[str]]:
    """(release, the package it comes from): rocm-core's, else HIP's, else ROCr's; (None, None) without them."""
    for prefix in DISTRIBUTION_ROCM_RELEASE_PACKAGES:
        for component in components:
            if component.package.startswith(prefix) and component.release:
                return component.release, f"package {component.package}"
    return None, None


def hip_library_release(names: List[str]) -> Optional[Tuple[str, str]]:
    """(major.minor, file name) of the newest HIP runtime among a library directory's entries
    (``libamdhip64.so.5.7.31921`` -> ``5.7``); None without one."""
    found = [(int(m.group(1)), int(m.group(2)), name) for name in names for m in [_HIP_LIBRARY.match(name)] if m]
    if not found:
        return None
    major, minor, name = max(found)
    return f"{major}.{minor}", name


def _hip_library(host: Host) -> Optional[Tuple[str, str]]:
    """(release, source) from the first multiarch directory that holds HIP's runtime library."""
    for directory in DISTRIBUTION_LIBRARY_DIRS:
        found = hip_library_release(host.list_dir(directory))
        if found:
            return found[0], f"library {directory}/{found[1]}"
    return None


def _read_version(host: Host, tree: str, leaf: str = VERSION_FILE) -> Optional[str]:
    try:
        text = host.read_text(f"{tree}/{leaf}", max_chars=65536)
    except HostReadError as exc:
        log.warning("rocm_version_unreadable", path=f"{tree}/{leaf}", error=exc.reason)
        return None
    if text is None:
        return None
    return parse_rocm_version_file(text) if leaf == VERSION_FILE else parse_rocm_version_header(text)


def _tree_release(host: Host, tree: str) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(release, where it was read when not the version file, the header's release) of one tree."""
    header = _read_version(host, tree, VERSION_HEADER)
    version = _read_version(host, tree)
    if version is not None:
        return version, None, header
    return header, (VERSION_HEADER if header else None), header


def read_smi_rocm_version(host: Host) -> Optional[str]:
    """What amdsmi (through librocm-core) says the ROCm version is; None when it cannot say."""
    try:
        smi = host.load_module("amdsmi")
    except LibraryUnavailable as exc:
        log.debug("amdsmi_unavailable", reason=exc.reason)
        return None
    get_version = getattr(smi, "amdsmi_get_rocm_version", None)
    if get_version is None:
        # Bindings before ROCm 6.3/6.4 have no such call.
        log.debug("amdsmi_call_missing", call="amdsmi_get_rocm_version")
        return None
    try:
        result = get_version()
    except Exception as exc:  # noqa: BLE001 - a foreign binding's failure must not cost the facts read from disk
        log.warning("amdsmi_rocm_version_failed", error=f"{type(exc).__name__}: {exc}")
        return None
    return smi_rocm_version(result)


def amd_smi_sonames(names: List[str]) -> List[str]:
    """The amdsmi library SONAMEs among a lib directory's entries (``libamd_smi.so.27.0.0`` -> ``libamd_smi.so.27``),
    sorted by major."""
    majors = {int(m.group(1)) for m in map(_AMD_SMI_LIB.match, names) if m}
    return [f"libamd_smi.so.{major}" for major in sorted(majors)]


def _install(host: Host, tree: str, real: Optional[str] = None) -> RocmInstall:
    """The tree ``tree`` as reported, read at ``real`` (where it is on disk, when that differs)."""
    where = real or tree
    names: List[str] = []
    for lib in _LIB_DIRS:
        names += host.list_dir(f"{where}/{lib}")
    sonames = amd_smi_sonames(names)
    version, source, header = _tree_release(host, where)
    return RocmInstall(path=tree, version=version, amd_smi_soname=sonames[-1] if sonames else None,
                       version_source=source, header_version=header)


def _therock_trees(host: Host) -> List[Tuple[str, str]]:
    """Every /opt/rocm/core-X.Y that is a directory (the core and core-X links are not releases of their own), as
    (its /opt/rocm path, where it is on disk)."""
    real = host.resolve(ROCM_LINK)  # on a mixed host /opt/rocm is the classic link and TheRock's trees are inside it
    found = [(f"{ROCM_LINK}/{name}", f"{real}/{name}") for name in host.list_dir(real)
             if _THEROCK_DIR.match(name) and host.read_link(f"{real}/{name}") is None and host.is_dir(f"{real}/{name}")]
    return sorted(found, key=lambda pair: sort_key("rpm")(pair[0][len(f"{ROCM_LINK}/core-"):]))


class RocmCollector:
    """Reads /opt/rocm (usually a link, possibly through /etc/alternatives), every /opt/rocm-X.Y.Z, every
    /opt/rocm/core-X.Y and the pip amdsmi binding (reported even on a host with no ROCm tree: its library may
    come from elsewhere, or be missing)."""

    name = "rocm"

    def collect(self, host: Host) -> RocmInfo:
        trees = [f"{ROCM_PREFIX}/{name}" for name in host.list_dir(ROCM_PREFIX)
                 if _INSTALL_DIR.match(name) and host.read_link(f"{ROCM_PREFIX}/{name}") is None
                 and host.is_dir(f"{ROCM_PREFIX}/{name}")]
        has_link = host.exists(ROCM_LINK)
        therock = _therock_trees(host) if has_link else []
        binding = find_distribution(str(host.root), "amdsmi")
        status = host.read_bytes(DPKG_STATUS)
        packaged = packaged_components(status) if status is not None else []
        library = _hip_library(host) if not has_link and not trees and not packaged else None
        if not has_link and not trees and binding is None and not packaged and library is None:
            raise CollectorUnavailable("no /opt/rocm and no /opt/rocm-*")  # the reason stored snapshots carry
        trees.sort(key=lambda path: sort_key("rpm")(path[len(f"{ROCM_PREFIX}/rocm-"):]))
        active_path = host.resolve(ROCM_LINK) if has_link else None
        chosen = read_active_tree(str(host.root))
        alternative = None if chosen is None else RocmAlternative(
            name=chosen.name, link=chosen.link, target=chosen.target, mode=chosen.mode, choices=list(chosen.choices))
        version, source, _header = _tree_release(host, active_path) if active_path else (None, None, None)
        if version is None and therock and active_path == ROCM_LINK:
            # a TheRock-only host: /opt/rocm is a plain directory; /opt/rocm/core points at the newest release
            newest = f"{ROCM_LINK}/core"
            active_path = host.resolve(newest) if host.exists(newest) else therock[-1][1]
            version, source, _header = _tree_release(host, active_path)
        if version is None and packaged:
            version, source = packaged_release(packaged)
        if version is None and library is not None:
            version, source = library
        return RocmInfo(
            active_path=active_path,
            version=version,
            installs=[*(_install(host, tree) for tree in trees), *(_install(host, *pair) for pair in therock)],
            smi_rocm_version=read_smi_rocm_version(host),
            packaged=packaged,
            version_source=source,
            amdsmi_binding=AmdsmiBinding(version=binding[0], site_directory=binding[1]) if binding else None,
            alternative=alternative,
        )
