"""Slurm: the verdict it is told (drain or not, the exit code, the reason), and drain/resume through ``scontrol``.

Used as a Prolog (slurmd drains the node when the Prolog exits non-zero) or as a HealthCheckProgram (whose exit
code slurmd ignores: ``--drain`` drains through ``scontrol`` itself). The verdict is judged from ``gpuguard
status``'s assessment by agent/status/slurm.py: a node is drained for a real failure only.

gpuguard resumes only a node it drained itself, known by the ``gpuguard:`` prefix of the drain reason; a node
drained by anyone else is left alone whatever gpuguard thinks of it, and so is a node the maintenance hand-off
holds (``gpuguard: maintenance``: slurm_handoff.py resumes it after the post-change check).
"""

from __future__ import annotations

from typing import List, Literal, Optional, Tuple

from agent.errors import CommandError
from agent.host import Host
from agent.models import FrozenModel

REASON_PREFIX = "gpuguard:"
# The maintenance hand-off's drains (slurm_handoff.py): never resumed by a health check's --drain.
MAINTENANCE_REASON_PREFIX = f"{REASON_PREFIX} maintenance"
EXIT_OK = 0
EXIT_DRAIN = 1
MAX_REASON_CHARS = 200
SCONTROL_TIMEOUT_SECONDS = 15.0


class SlurmVerdict(FrozenModel):
    """Drain or not, the exit code, and the one-line reason."""

    drain: bool
    exit_code: int
    reason: str
    # After a reboot the maintenance hand-off asked for (agent/integrations/maintenance.py, phase rebooting):
    # "waiting" (not booted yet, or no health check or compliance verdict since the boot: the node stays drained),
    # "judged" (booted, and the verdict gives the node back or keeps it out); "none" otherwise.
    reboot_gate: Literal["none", "waiting", "judged"] = "none"


def parse_node(text: str) -> Tuple[bool, Optional[str]]:
    """From ``scontrol show node NAME``: whether the node is draining or drained, and its reason (without the
    `` [user@time]`` slurmctld appends). Pure."""
    drained, reason = False, None
    for line in text.splitlines():
        stripped = " " + line.strip()
        if " Reason=" in stripped:  # its own line, or the last field of ``show node -o``'s one line
            stripped, reason = stripped.split(" Reason=", 1)
            if reason.endswith("]") and " [" in reason:
                reason = reason[:reason.rindex(" [")]
        for token in stripped.split():
            if token.startswith("State="):  # IDLE+DRAIN, MIXED+DRAIN, DOWN+DRAIN+NOT_RESPONDING, DRAINED...
                drained = any(flag.startswith("DRAIN") for flag in token[len("State="):].upper().split("+"))
    return drained, reason


def run_scontrol(host: Host, argv: List[str]) -> str:
    """scontrol's output; CommandError when it is missing or refuses."""
    result = host.run(["scontrol", *argv], timeout_seconds=SCONTROL_TIMEOUT_SECONDS)
    if result.returncode != 0:
        raise CommandError(result.argv, (result.stderr or result.stdout).strip()[:300] or "failed",
                           result.returncode)
    return result.stdout


def apply_to_node(host: Host, node: str, verdict: SlurmVerdict) -> str:
    """Drain the node for a failing verdict, resume it when gpuguard drained it and all is well; what was done.

    A node drained by someone else (a reason without our prefix) is never touched: not resumed, not re-reasoned.
    CommandError when scontrol is missing or refuses."""
    drained, reason = parse_node(run_scontrol(host, ["show", "node", node]))
    if drained and (reason or "").startswith(MAINTENANCE_REASON_PREFIX):
        # A maintenance hand-off holds the node (integrations/maintenance.py): only its own end resumes it.
        return f"held for maintenance ({reason}): left alone"
    ours = drained and (reason or "").startswith(REASON_PREFIX)
    if verdict.drain:
        if drained:
            return "already drained by gpuguard" if ours else f"drained by someone else ({reason}): left alone"
        run_scontrol(host, ["update", f"nodename={node}", "state=drain", f"reason={REASON_PREFIX} {verdict.reason}"])
        return "drained"
    if ours:
        run_scontrol(host, ["update", f"nodename={node}", "state=resume"])
        return "resumed"
    if drained:
        return f"drained by someone else ({reason}): left alone"
    return "nothing to do"


def node_name(host: Host, given: Optional[str]) -> str:
    """``--node-name``, else $SLURMD_NODENAME (slurmd sets it), else the short host name."""
    return given or host.env.get("SLURMD_NODENAME") or host.hostname().split(".")[0]
