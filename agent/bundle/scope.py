"""Whether a bundle's scope takes a host: pure, over the few facts both the agent and the hub have.

The agent judges a bundle against its own facts before installing it; the hub, against what it has heard from the
host (id, heartbeat labels, pairing), to pick which bundle to offer. Both call :func:`scope_refusal` (one home).
``all`` takes every host; otherwise every given selector must match: a list matches when any of its globs
(fnmatch-style, case-sensitive) matches, labels when every one is equal. ``os`` is ``<os_id>-<os_version_id>``;
``pairings`` match :func:`pairing_text` (``amdgpu 6.8.5 rocm 6.2.2`` or ``nvidia 580.95.05 cuda 13.0``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Sequence, Tuple

from pydantic import Field

from agent.bundle.format import BundleScope
from agent.models import FrozenModel
from agent.policy.globs import glob_match

if TYPE_CHECKING:  # pragma: no cover
    from agent.snapshot.pairing import Pairing


class ScopeFacts(FrozenModel):
    """What a scope is judged by; None (or empty) where the fact is unknown, which no selector matches."""

    host_id: str
    labels: Dict[str, str] = Field(default_factory=dict)
    gpu_models: Tuple[str, ...] = ()
    os: Optional[str] = None
    pairing: Optional[str] = None


def pairing_text(pairing: Optional["Pairing"]) -> Optional[str]:
    """The short text ``pairings`` globs match: loaded driver and user space, AMD first; None when unknown."""
    if pairing is None:
        return None
    parts = [f"{name} {value}" for name, value in (("amdgpu", pairing.amdgpu_loaded), ("rocm", pairing.rocm),
                                                    ("nvidia", pairing.nvidia_loaded),
                                                    ("cuda", pairing.cuda_driver_api)) if value]
    return " ".join(parts) or None


def scope_facts(host_id: str, labels: Dict[str, str], pairing: Optional["Pairing"]) -> ScopeFacts:
    """The facts of a host from its id, its labels and its pairing (as the heartbeat carries them)."""
    os = None
    if pairing is not None and pairing.os_id and pairing.os_version_id:
        os = f"{pairing.os_id}-{pairing.os_version_id}"
    models = tuple(m for m in (pairing.gpu_models.split(", ") if pairing and pairing.gpu_models else ()) if m)
    return ScopeFacts(host_id=host_id, labels=dict(labels), gpu_models=models, os=os, pairing=pairing_text(pairing))


def _any(patterns: Sequence[str], values: Sequence[str]) -> bool:
    return any(glob_match(value, pattern) for pattern in patterns for value in values)


def _listed(patterns: Sequence[str]) -> str:
    return ", ".join(patterns)


def scope_refusal(scope: BundleScope, facts: ScopeFacts) -> Optional[str]:
    """None when the scope takes this host, else the one-line reason it does not (the first selector failing)."""
    if scope.all:
        return None
    if scope.host_ids and not _any(scope.host_ids, (facts.host_id,)):
        return f"out of scope: host id {facts.host_id} matches none of host_ids [{_listed(scope.host_ids)}]"
    for name, wanted in sorted(scope.labels.items()):
        have = facts.labels.get(name)
        if have != wanted:
            shown = "not set" if have is None else f"{have!r}"
            return f"out of scope: label {name} is {shown}, the bundle is for {name}={wanted!r}"
    if scope.gpu_models and not _any(scope.gpu_models, facts.gpu_models):
        shown = _listed(facts.gpu_models) or "none known"
        return f"out of scope: GPU models ({shown}) match none of gpu_models [{_listed(scope.gpu_models)}]"
    if scope.os and not _any(scope.os, (facts.os,) if facts.os else ()):
        return f"out of scope: os {facts.os or 'unknown'} matches none of os [{_listed(scope.os)}]"
    if scope.pairings and not _any(scope.pairings, (facts.pairing,) if facts.pairing else ()):
        shown = repr(facts.pairing) if facts.pairing else "unknown"
        return f"out of scope: pairing {shown} matches none of pairings [{_listed(scope.pairings)}]"
    return None
