"""This host's scope facts, read the way every other judgement reads them: the last snapshot's pairing (or a new
snapshot when there is none), the host context for the OS, the configured id and labels."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional

from agent.bundle.scope import ScopeFacts, scope_facts

if TYPE_CHECKING:  # pragma: no cover
    from agent.host import Host
    from agent.snapshot.pairing import Pairing


def host_pairing(host: "Host", last_snapshot_path: str) -> Optional["Pairing"]:
    """The pairing of the last snapshot (a host path), or of a new one when it is missing or unreadable."""
    from agent.errors import GpuguardError
    from agent.snapshot.io import load_snapshot
    from agent.snapshot.pairing import pairing_of

    path = host.path(last_snapshot_path)
    if path.is_file():
        try:
            return pairing_of(load_snapshot(str(path)))
        except GpuguardError:
            pass
    from agent.snapshot.take import take_snapshot

    return pairing_of(take_snapshot(host))


def host_scope_facts(host: "Host", host_id: str, labels: Dict[str, str], last_snapshot_path: str) -> ScopeFacts:
    """The facts a bundle's scope is judged by on this host."""
    from agent.hostfacts.context import read_host_context

    facts = scope_facts(host_id, labels, host_pairing(host, last_snapshot_path))
    if facts.os is None:
        context = read_host_context(str(host.root))
        if context.os_id and context.os_version_id:
            facts = facts.model_copy(update={"os": f"{context.os_id}-{context.os_version_id}"})
    return facts
