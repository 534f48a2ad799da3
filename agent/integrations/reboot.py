"""Whether a change needs a reboot, decided from the snapshot's typed findings, and when this machine booted.

    reboot_needs(findings)      the reasons a reboot is needed (pure): the next-boot kernel is not the running one
                                (``reboot_pending``), a GPU driver package is installed at another version than the
                                module loaded (``driver_installed_not_loaded``); each from the finding's kind and
                                its typed details (agent/snapshot/drift.py), never from its message
    read_reboot_needs(path)     the same, from the daemon's last snapshot file
    parse_boot_time(text)       ``btime`` of /proc/stat (pure); booted_at_seconds(host) reads it through the seam

Used by the maintenance hand-off (agent/integrations/maintenance.py): a post-change check that passes on a node that
still needs a reboot asks Slurm for one instead of giving the node back, and the gate after the boot
(``gpuguard status --slurm --drain``) judges only health checks that finished after the boot.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from agent.errors import GpuguardError, InputFileError
from agent.files import read_json_file
from agent.host import Host

# Snapshot finding kinds that a reboot settles (also the NFD ``reboot-needed`` label's, agent/integrations/nfd.py).
REBOOT_FINDINGS = ("reboot_pending", "driver_installed_not_loaded")
MAX_NEEDS = 4


def _need(kind: str, component: str, details: Mapping[str, str]) -> Optional[str]:
    """One reason for people, built from the typed details of one finding; None for another kind."""
    if kind == "reboot_pending":
        return f"kernel: next boot {details.get('next_boot', '?')}, running {details.get('running', '?')}"
    if kind == "driver_installed_not_loaded":
        package = f" ({details['package']})" if "package" in details else ""
        return (f"{component}: installed {details.get('installed', '?')}{package}, "
                f"loaded {details.get('loaded', '?')}")
    return None


def reboot_needs(findings: Sequence[object]) -> List[str]:
    """The reasons a reboot is needed, one short line each, from the snapshot's findings (dicts as stored, with
    ``kind``, ``component`` and ``details``); empty: none. Pure."""
    out: List[str] = []
    for finding in findings:
        if not isinstance(finding, dict) or finding.get("kind") not in REBOOT_FINDINGS:
            continue
        raw = finding.get("details")
        details: Dict[str, str] = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        need = _need(str(finding["kind"]), str(finding.get("component", "?")), details)
        if need is not None and need not in out:
            out.append(need)
    return out[:MAX_NEEDS]


def read_reboot_needs(path: str) -> List[str]:
    """The reboot reasons of the daemon's last snapshot (``last-snapshot.json``); empty when there is none.
    InputFileError naming the file when it is damaged or not a snapshot."""
    data = read_json_file(path)
    if data is None:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("findings", []), list):
        raise InputFileError(path, "not a gpuguard snapshot (no findings list)")
    return reboot_needs(data.get("findings", []))


def parse_boot_time(text: str) -> Optional[float]:
    """The ``btime`` line of /proc/stat: when the machine booted, seconds since the epoch; None without one. Pure."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "btime" and value.strip().isdigit():
            return float(value.strip())
    return None


def booted_at_seconds(host: Host) -> Optional[float]:
    """When this machine booted (/proc/stat under the host root), None where it does not say."""
    try:
        text = host.read_text("/proc/stat", max_chars=1 << 20)
    except GpuguardError:
        return None  # unknown: the hand-off then treats the node as not booted yet (it stays out)
    return None if text is None else parse_boot_time(text)
