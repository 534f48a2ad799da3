"""Slurm's side of the maintenance hand-off: drain the node through ``scontrol``, wait until no job runs there,
resume it afterwards, and never resume a node that an operator drained.

``begin`` drains with ``Reason="gpuguard: maintenance: <reason>"`` and polls ``scontrol show node -o NODE``
(bounded) until slurmctld shows the node DRAINED: the DRAIN flag and no job left (state IDLE or DOWN, nothing
allocated or completing). A node that someone else drained (a reason without the ``gpuguard:`` prefix) is already
out of scheduling: gpuguard waits for it to empty but does not replace the reason and will not resume it.
``end`` resumes only a node whose reason still starts with the maintenance prefix and that this agent drained.
``keep`` rewrites the reason of a node kept drained after a failed post-change check. ``reboot`` asks slurmctld to
reboot the node gpuguard drained once it is idle (``scontrol reboot reason=... NODE``, without ``ASAP`` and
without ``nextstate``: both clear the DRAIN flag when slurmd registers after the boot, so the node would take jobs
before gpuguard's gate judged it; docs/integrations.md), keeping the maintenance drain through the boot.

The parser of the one-line node record is pure; the commands go through the Host seam.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from agent.errors import CommandError
from agent.host import Host
from agent.integrations.handoff import HandoffStep
from agent.integrations.slurm import MAINTENANCE_REASON_PREFIX, MAX_REASON_CHARS, run_scontrol

# Base states in which the node still runs (or is finishing) jobs: DRAINING, not yet DRAINED.
BUSY_STATES = ("ALLOCATED", "MIXED", "COMPLETING")
DEFAULT_POLL_SECONDS = 2.0


@dataclass(frozen=True)
class SlurmNode:
    """What the hand-off needs of ``scontrol show node -o``."""

    name: str
    state: str  # the whole State= value: IDLE+DRAIN, MIXED+DRAIN, DOWN+DRAIN+NOT_RESPONDING...
    reason: Optional[str]  # without the " [user@time]" slurmctld appends
    cpus_allocated: int = 0

    @property
    def flags(self) -> Tuple[str, ...]:
        return tuple(self.state.upper().split("+"))

    @property
    def draining(self) -> bool:
        """DRAIN flag set (DRAINING or DRAINED in sinfo's words)."""
        return any(flag.startswith("DRAIN") for flag in self.flags)

    @property
    def empty(self) -> bool:
        """No job runs or completes on the node."""
        return not any(flag in BUSY_STATES for flag in self.flags) and self.cpus_allocated == 0

    @property
    def drained(self) -> bool:
        """DRAINED: drain flag set and no job left."""
        return self.draining and self.empty

    @property
    def ours(self) -> bool:
        """Drained by gpuguard's maintenance hand-off (the reason says so)."""
        return self.draining and (self.reason or "").startswith(MAINTENANCE_REASON_PREFIX)

    @property
    def phase(self) -> str:
        """``drained``, ``draining`` or ``in service``: the word the hand-off reports."""
        return "drained" if self.drained else "draining" if self.draining else "in service"


def parse_node_line(text: str) -> SlurmNode:
    """The node record from ``scontrol show node -o NODE`` (one line of ``Key=value`` pairs). Pure.

    ``Reason=`` is the last field and may hold spaces; ``OS=`` holds spaces too, so only known keys are read, each
    as the token starting with ``Key=``. ValueError when the text has no ``NodeName=``/``State=``."""
    line = next((ln for ln in text.splitlines() if ln.strip().startswith("NodeName=")), "")
    name = state = None
    cpus_allocated = 0
    reason: Optional[str] = None
    head = line
    if " Reason=" in line:
        head, reason = line.split(" Reason=", 1)
        reason = reason.strip()
        if reason.endswith("]") and " [" in reason:
            reason = reason[:reason.rindex(" [")]
        reason = reason or None
    for token in head.split():
        key, _, value = token.partition("=")
        if key == "NodeName":
            name = value
        elif key == "State":
            state = value
        elif key == "CPUAlloc" and value.isdigit():
            cpus_allocated = int(value)
    if not name or not state:
        raise ValueError(f"not a scontrol node record: {text.strip()[:120]!r}")
    return SlurmNode(name=name, state=state, reason=reason, cpus_allocated=cpus_allocated)


def maintenance_reason(reason: str) -> str:
    """The Slurm drain reason for a hand-off: ``gpuguard: maintenance: <reason>``, one line, bounded."""
    text = " ".join(f"{MAINTENANCE_REASON_PREFIX}: {reason}".split())
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


def reboot_argv(node: str, why: str) -> List[str]:
    """scontrol's arguments to reboot ``node`` once it is idle, the reason saying why (one line, bounded). Pure.

    No ``ASAP`` and no ``nextstate=RESUME``: the node is drained by the hand-off already (no job is killed:
    slurmctld reboots it only when idle), and the drain must outlive the boot so that the gate after it decides."""
    return ["reboot", f"reason={maintenance_reason(f'reboot: {why}')}", node]


def _step(node: SlurmNode, drained_by_us: bool, ready: bool, detail: str) -> HandoffStep:
    return HandoffStep(drained_by_us, ready, detail, node.state)


class SlurmHandoff:
    """Drain, wait, resume one Slurm node through ``scontrol`` (the Host seam runs it)."""

    name = "slurm"

    def __init__(self, host: Host, node: str, poll_seconds: float = DEFAULT_POLL_SECONDS,
                 sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        self.node = node
        self.poll_seconds = poll_seconds
        self._sleep = sleep
        self._monotonic = monotonic

    def _scontrol(self, *argv: str) -> str:
        return run_scontrol(self.host, list(argv))

    def show(self) -> SlurmNode:
        """The node as slurmctld sees it now; CommandError when scontrol fails or answers nonsense."""
        text = self._scontrol("show", "node", "-o", self.node)
        try:
            return parse_node_line(text)
        except ValueError as exc:
            raise CommandError(("scontrol", "show", "node", "-o", self.node), str(exc), 0) from None

    def begin(self, reason: str, wait_seconds: float) -> HandoffStep:
        """Drain the node (unless it is drained already) and wait up to ``wait_seconds`` until it is empty."""
        node = self.show()
        if node.draining and not node.ours:
            drained_by_us = False
            detail = f"drained by someone else ({node.reason}): left as it is, will not be resumed"
        else:
            if not node.ours:
                self._scontrol("update", f"NodeName={self.node}", "State=DRAIN",
                               f"Reason={maintenance_reason(reason)}")
            drained_by_us = True
            detail = "drained by gpuguard"
        deadline = self._monotonic() + max(0.0, wait_seconds)
        node = self.show()
        while not node.drained and self._monotonic() < deadline:
            self._sleep(min(self.poll_seconds, max(0.0, deadline - self._monotonic())))
            node = self.show()
        if node.drained:
            return _step(node, drained_by_us, True, f"{detail}; no job left (DRAINED)")
        if not node.draining:
            return _step(node, drained_by_us, False, f"{detail}; the drain was lifted by someone else")
        return _step(node, drained_by_us, False,
                         f"{detail}; jobs still running after {wait_seconds:g} s (DRAINING, state {node.state})")

    def end(self, drained_by_us: bool) -> HandoffStep:
        """Resume the node when this hand-off drained it and the reason is still ours; otherwise leave it."""
        node = self.show()
        if not node.draining:
            return _step(node, drained_by_us, True, "already in service")
        if not node.ours or not drained_by_us:
            return _step(node, False, True, f"drained by someone else ({node.reason}): not resumed")
        self._scontrol("update", f"NodeName={self.node}", "State=RESUME")
        return _step(self.show(), True, True, "resumed")

    def keep(self, drained_by_us: bool, why: str) -> HandoffStep:
        """Keep the node drained after a failed post-change check, the reason saying why (only our own drain is
        re-reasoned; a node that is somehow back in service is drained again)."""
        node = self.show()
        if node.draining and not node.ours:
            return _step(node, False, False, f"drained by someone else ({node.reason}): left as it is")
        self._scontrol("update", f"NodeName={self.node}", "State=DRAIN", f"Reason={maintenance_reason(why)}")
        return _step(self.show(), True, False, f"kept drained: {why}")

    def reboot(self, drained_by_us: bool, why: str) -> Optional[HandoffStep]:
        """Ask slurmctld to reboot the node once it is idle, when it is gpuguard's own drain; None when it is not
        (someone else drained it, or the drain was lifted): theirs to reboot."""
        node = self.show()
        if not (node.ours and drained_by_us):
            return None
        self._scontrol(*reboot_argv(self.node, why))
        return _step(self.show(), True, False, f"reboot asked: {why}")
