"""``gpuguard status [--json] [--offline]``: gather, assess, print a table (or JSON), exit with the verdict's code.

``gpuguard status --slurm [--drain]``: the same facts judged for Slurm (agent/integrations/slurm.py), one line."""

from __future__ import annotations

import json
from typing import Callable, Optional, TextIO

from agent.errors import GpuguardError
from agent.host import Host
from agent.status.assess import Assessment, assess
from agent.status.facts import HubFacts, StatusFacts, gather, probe_hub

_MARKS = {"ok": "ok", "info": "--", "warn": "WARN", "fail": "FAIL"}


def render_table(facts: StatusFacts, assessment: Assessment) -> str:
    """The human view: one line per check, then the verdict."""
    width = max(len(c.name) for c in assessment.checks)
    lines = [f"{_MARKS[c.state]:<4}  {c.name:<{width}}  {c.summary}" for c in assessment.checks]
    lines.append(f"status: {assessment.verdict} (exit {assessment.exit_code}); state {facts.state_dir}, "
                 f"config {facts.config_path}")
    return "\n".join(lines) + "\n"


def render_json(facts: StatusFacts, assessment: Assessment) -> str:
    """Verdict, checks and the facts behind them, keys sorted."""
    document = {"verdict": assessment.verdict, "exit_code": assessment.exit_code,
                "checks": [c.model_dump(mode="json") for c in assessment.checks],
                "facts": facts.model_dump(mode="json")}
    return json.dumps(document, sort_keys=True, indent=2) + "\n"


def status(host: Host, config_path: str, as_json: bool, offline: bool, out: TextIO,
           hub_probe: Optional[Callable[[str, Optional[str]], HubFacts]] = None) -> int:
    """Print the status; the exit code is 0 ok, 30 attention, 31 failing (STATUS_EXIT_CODES)."""
    facts = gather(host, config_path, offline, hub_probe or probe_hub)
    assessment = assess(facts)
    out.write(render_json(facts, assessment) if as_json else render_table(facts, assessment))
    return assessment.exit_code


def slurm_check(host: Host, config_path: str, drain: bool, node: Optional[str], out: TextIO) -> int:
    """Print ``gpuguard: ok|drain: REASON``; exit 0 (busy and deferred included) or 1 (drain). With ``drain``,
    drain or resume the node through scontrol as well (for HealthCheckProgram, whose exit code slurmd ignores)."""
    from agent.integrations.slurm import apply_to_node, node_name, slurm_verdict

    facts = gather(host, config_path, offline=True)  # the hub is not Slurm's business, and must not slow a Prolog
    verdict = slurm_verdict(facts, assess(facts))
    line = f"gpuguard: {'drain' if verdict.drain else 'ok'}: {verdict.reason}"
    if drain:
        name = node_name(host, node)
        try:
            line += f" (node {name}: {apply_to_node(host, name, verdict)})"
        except GpuguardError:
            out.write(line + "\n")  # the verdict stands; the CLI adds scontrol's failure as its own line
            raise
    out.write(line + "\n")
    return verdict.exit_code
