"""ROCm user space: the active /opt/rocm, every installed /opt/rocm-X.Y.Z (classic packaging), every
/opt/rocm/core-X.Y (ROCm built with TheRock, 7.13 on), the amdsmi library each carries, and what amdsmi says.

TheRock installs a release under ``/opt/rocm/core-X.Y`` (major.minor; patches in place), with ``/opt/rocm/core``
and ``/opt/rocm/core-X`` links to the newest (TheRock RFC0009). Its version file is read where rocm-core writes it,
``<tree>/.info/version`` (assumed for TheRock trees: AMD's packages put rocm-core's files under the release prefix).
On a host with a classic stack as well, ``/opt/rocm`` is the classic link and TheRock's trees land inside its
target; they are listed all the same: the host has both.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from agent.errors import CollectorUnavailable, HostReadError, LibraryUnavailable
from agent.frozen import Frozen, field, frozen_record
from agent.host import Host
from agent.lazyre import LazyPattern
from agent.log import get_logger
from agent.versions import sort_key

log = get_logger("collectors.rocm")

ROCM_LINK = "/opt/rocm"
ROCM_PREFIX = "/opt"
VERSION_FILE = ".info/version"
_INSTALL_DIR = LazyPattern(r"^rocm-\d+(?:\.\d+)*")
_THEROCK_DIR = LazyPattern(r"^core-\d+\.\d+$")  # core-7.13, core-10.0; core and core-10 are links
_AMD_SMI_LIB = LazyPattern(r"^libamd_smi\.so\.(\d+)(?:\.\d+)*$")  # libamd_smi.so.27, libamd_smi.so.27.0.0
_LIB_DIRS = ("lib", "lib64")
_VERSION = LazyPattern(r"^\d+(?:\.\d+)+(?:[-+~.][0-9A-Za-z.~+-]*)?$")


@frozen_record
class RocmInstall(Frozen):
    """One ROCm tree on disk."""

    __json_omit_empty__ = ("amd_smi_soname",)  # added after snapshots were stored (see as_json_data)

    path: str
    version: Optional[str] = None
    # libamd_smi.so.27: the amdsmi binding must be of its release (the newest SONAME when a tree has several)
    amd_smi_soname: Optional[str] = None


@frozen_record
class RocmInfo(Frozen):
    """Which ROCm is active and which are installed."""

    active_path: Optional[str] = None
    version: Optional[str] = None
    installs: List[RocmInstall] = field(default_factory=list)
    smi_rocm_version: Optional[str] = None


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


def smi_rocm_version(result: object) -> Optional[str]:
    """The version from ``amdsmi_get_rocm_version()``'s ``(ok, text)``; None when it failed (text is the error)."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return None
    ok, text = result
    if ok is not True or not isinstance(text, str):
        return None
    return text.strip() or None


def _read_version(host: Host, tree: str) -> Optional[str]:
    try:
        text = host.read_text(f"{tree}/{VERSION_FILE}")
    except HostReadError as exc:
        log.warning("rocm_version_unreadable", path=tree, error=exc.reason)
        return None
    return parse_rocm_version_file(text) if text is not None else None


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
    return RocmInstall(path=tree, version=_read_version(host, where), amd_smi_soname=sonames[-1] if sonames else None)


def _therock_trees(host: Host) -> List[Tuple[str, str]]:
    """Every /opt/rocm/core-X.Y that is a directory (the core and core-X links are not releases of their own), as
    (its /opt/rocm path, where it is on disk)."""
    real = host.resolve(ROCM_LINK)  # on a mixed host /opt/rocm is the classic link and TheRock's trees are inside it
    found = [(f"{ROCM_LINK}/{name}", f"{real}/{name}") for name in host.list_dir(real)
             if _THEROCK_DIR.match(name) and host.read_link(f"{real}/{name}") is None and host.is_dir(f"{real}/{name}")]
    return sorted(found, key=lambda pair: sort_key("rpm")(pair[0][len(f"{ROCM_LINK}/core-"):]))


class RocmCollector:
    """Reads /opt/rocm (usually a link, possibly through /etc/alternatives), every /opt/rocm-X.Y.Z and every
    /opt/rocm/core-X.Y."""

    name = "rocm"

    def collect(self, host: Host) -> RocmInfo:
        trees = [f"{ROCM_PREFIX}/{name}" for name in host.list_dir(ROCM_PREFIX)
                 if _INSTALL_DIR.match(name) and host.read_link(f"{ROCM_PREFIX}/{name}") is None
                 and host.is_dir(f"{ROCM_PREFIX}/{name}")]
        has_link = host.exists(ROCM_LINK)
        therock = _therock_trees(host) if has_link else []
        if not has_link and not trees:
            raise CollectorUnavailable("no /opt/rocm and no /opt/rocm-*")
        trees.sort(key=lambda path: sort_key("rpm")(path[len(f"{ROCM_PREFIX}/rocm-"):]))
        active_path = host.resolve(ROCM_LINK) if has_link else None
        version = _read_version(host, active_path) if active_path else None
        if version is None and therock and active_path == ROCM_LINK:
            # a TheRock-only host: /opt/rocm is a plain directory; /opt/rocm/core points at the newest release
            newest = f"{ROCM_LINK}/core"
            active_path = host.resolve(newest) if host.exists(newest) else therock[-1][1]
            version = _read_version(host, active_path)
        return RocmInfo(
            active_path=active_path,
            version=version,
            installs=[*(_install(host, tree) for tree in trees), *(_install(host, *pair) for pair in therock)],
            smi_rocm_version=read_smi_rocm_version(host),
        )
