"""The snapshot model: every collector's Section, the findings derived from them, and a stable content hash.

Frozen records (agent/frozen.py): taking and printing a snapshot imports no pydantic; reading one back validates it
with pydantic (agent/snapshot/io.py).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Dict, Final, List, Literal, Optional

from agent.collectors.amdgpu import AmdgpuInfo
from agent.collectors.base import Section, Status, as_json_data
from agent.collectors.container_cgroups import ContainerCgroupsInfo
from agent.collectors.containers import ContainersInfo
from agent.collectors.cuda import CudaInfo
from agent.collectors.dkms import DkmsInfo
from agent.collectors.kernel import KernelInfo
from agent.collectors.nvidia import NvidiaInfo
from agent.collectors.os_release import OsRelease
from agent.collectors.packages import PackageInfo, PackageSet
from agent.collectors.rocm import RocmInfo
from agent.frozen import Frozen, field, frozen_record

try:  # CPython's own SHA-256 (3.12+ / earlier): hashlib would load OpenSSL's, 2.5 ms of the snapshot's start-up
    from _sha2 import sha256  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - depends on the Python version
    try:
        from _sha256 import sha256  # type: ignore[import-not-found, no-redef, unused-ignore]
    except ImportError:  # a Python built without them
        from hashlib import sha256  # type: ignore[assignment, unused-ignore]

SCHEMA_VERSION: Final = 1
SECTION_NAMES = ("os", "kernel", "dkms", "dpkg", "rpm", "amdgpu", "rocm", "nvidia", "cuda", "containers",
                 "container_cgroups")
# Fields that say when/by what the snapshot was taken, not what the host is: left out of the content hash.
_VOLATILE_FIELDS = {"taken_at", "agent_version", "content_hash"}

Severity = Literal["info", "warning", "critical"]


@frozen_record
class Finding(Frozen):
    """Something the snapshot shows that an operator should know, e.g. an installed driver that is not loaded."""

    kind: str
    severity: Severity
    component: str
    message: str
    details: Dict[str, str] = field(default_factory=dict)


# A stored snapshot from before container_cgroups was collected reads as "not collected".
_NOT_COLLECTED: "Section[ContainerCgroupsInfo]" = Section(status=Status.ABSENT, reason="not collected")


@frozen_record
class Snapshot(Frozen):
    """Everything gpuguard knows about one host at one moment."""

    agent_version: str
    hostname: str
    taken_at: dt.datetime
    os: Section[OsRelease]
    kernel: Section[KernelInfo]
    dkms: Section[DkmsInfo]
    dpkg: Section[PackageSet]
    rpm: Section[PackageSet]
    amdgpu: Section[AmdgpuInfo]
    rocm: Section[RocmInfo]
    nvidia: Section[NvidiaInfo]
    cuda: Section[CudaInfo]
    containers: Section[ContainersInfo]
    # Added after schema version 1 was first stored: a stored snapshot without it reads as "not collected".
    container_cgroups: Section[ContainerCgroupsInfo] = _NOT_COLLECTED
    findings: List[Finding] = field(default_factory=list)
    content_hash: str = ""
    schema_version: Literal[1] = SCHEMA_VERSION

    def packages(self) -> Dict[str, PackageInfo]:
        """Watched packages from whichever package database the host has (dpkg and rpm merged)."""
        merged: Dict[str, PackageInfo] = {}
        for section in (self.rpm, self.dpkg):
            if section.data is not None:
                merged.update(section.data.packages)
        return merged

    @property
    def package_manager(self) -> Optional[str]:
        for section in (self.dpkg, self.rpm):
            if section.data is not None:
                return section.data.manager
        return None

    def to_json(self, indent: Optional[int] = 2) -> str:
        """Canonical JSON: sorted keys, so equal snapshots print equal text."""
        return json.dumps(as_json_data(self), sort_keys=True, indent=indent) + ("\n" if indent else "")


def compute_content_hash(snapshot: Snapshot) -> str:
    """sha256 of the canonical JSON of everything but when/by what it was taken."""
    payload = as_json_data(snapshot)
    for name in _VOLATILE_FIELDS:
        del payload[name]
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return "sha256:" + sha256(canonical.encode("utf-8")).hexdigest()
