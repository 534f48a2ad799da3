"""The maintenance hand-off's one small interface: a scheduler that takes a node out of service and gives it back.

    SchedulerHandoff   begin(reason, wait_seconds) / end(drained_by_us) / keep(drained_by_us, why) /
                       reboot(drained_by_us, why)
    HandoffStep        what one step did and saw

Implementations: ``slurm_handoff.SlurmHandoff`` (scontrol drain/resume) and ``kubernetes_handoff.KubernetesHandoff``
(a node-feature-discovery label); ``maintenance.py`` picks one from ``[integrations] scheduler`` and keeps the
state that says this host holds its node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol


@dataclass(frozen=True)
class HandoffStep:
    """What one hand-off step did and saw."""

    drained_by_us: bool  # the hold on the node is gpuguard's (so only gpuguard's end gives it back)
    ready: bool  # begin: nothing runs there any more; end: back in service (or left to whoever drained it)
    detail: str  # one line for the operator
    scheduler_state: str = ""  # the scheduler's own word for the node (Slurm's State=, a label value)


class SchedulerHandoff(Protocol):
    """A scheduler that the host hands its node to while the node changes."""

    name: str

    def begin(self, reason: str, wait_seconds: float) -> HandoffStep:
        """Take the node out of service for ``reason``; wait up to ``wait_seconds`` until nothing runs there."""
        ...

    def end(self, drained_by_us: bool) -> HandoffStep:
        """Give the node back, only when the hold is gpuguard's own."""
        ...

    def keep(self, drained_by_us: bool, why: str) -> HandoffStep:
        """Keep the node out of service (a failed post-change check), saying why."""
        ...

    def reboot(self, drained_by_us: bool, why: str) -> "Optional[HandoffStep]":
        """Ask the scheduler to reboot the node once it is idle, keeping it out of service afterwards until the
        gate after the boot gives it back; None where this scheduler cannot (the caller ends the hold as before)."""
        ...
