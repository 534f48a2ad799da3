"""``gpuguard status [--json] [--offline]``: gather, assess, print a table (or JSON), exit with the verdict's code."""

from __future__ import annotations

import json
from typing import Callable, Optional, TextIO

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
