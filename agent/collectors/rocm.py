"""ROCm user space: the active /opt/rocm, every installed /opt/rocm-X.Y.Z, and what amdsmi says."""

from __future__ import annotations

import re
from typing import List, Optional

from agent.errors import CollectorUnavailable, HostReadError, LibraryUnavailable
from agent.frozen import Frozen, field, frozen_record
from agent.host import Host
from agent.log import get_logger
from agent.versions import sort_key

log = get_logger("collectors.rocm")

ROCM_LINK = "/opt/rocm"
ROCM_PREFIX = "/opt"
VERSION_FILE = ".info/version"
_INSTALL_DIR = re.compile(r"^rocm-\d+(?:\.\d+)*")
_VERSION = re.compile(r"^\d+(?:\.\d+)+(?:[-+~.][0-9A-Za-z.~+-]*)?$")


@frozen_record
class RocmInstall(Frozen):
    """One ROCm tree on disk."""

    path: str
    version: Optional[str] = None


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


class RocmCollector:
    """Reads /opt/rocm (usually a link, possibly through /etc/alternatives) and every /opt/rocm-X.Y.Z."""

    name = "rocm"

    def collect(self, host: Host) -> RocmInfo:
        trees = [f"{ROCM_PREFIX}/{name}" for name in host.list_dir(ROCM_PREFIX)
                 if _INSTALL_DIR.match(name) and host.read_link(f"{ROCM_PREFIX}/{name}") is None
                 and host.is_dir(f"{ROCM_PREFIX}/{name}")]
        has_link = host.exists(ROCM_LINK)
        if not has_link and not trees:
            raise CollectorUnavailable("no /opt/rocm and no /opt/rocm-*")
        active_path = host.resolve(ROCM_LINK) if has_link else None
        trees.sort(key=lambda path: sort_key("rpm")(path[len(f"{ROCM_PREFIX}/rocm-"):]))
        return RocmInfo(
            active_path=active_path,
            version=_read_version(host, active_path) if active_path else None,
            installs=[RocmInstall(path=tree, version=_read_version(host, tree)) for tree in trees],
            smi_rocm_version=read_smi_rocm_version(host),
        )
