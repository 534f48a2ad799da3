"""``gpuguard status``'s two views of the facts and their assessment: a table for a terminal, JSON for tools."""

from __future__ import annotations

import json

from agent.printable import printable
from agent.status.assess import Assessment
from agent.status.facts import StatusFacts

_MARKS = {"ok": "ok", "info": "--", "warn": "WARN", "fail": "FAIL"}


def render_table(facts: StatusFacts, assessment: Assessment) -> str:
    """The human view: one line per check, then the verdict."""
    width = max(len(c.name) for c in assessment.checks)
    lines = [f"{_MARKS[c.state]:<4}  {c.name:<{width}}  {c.summary}" for c in assessment.checks]
    lines.append(f"status: {assessment.verdict} (exit {assessment.exit_code}); state {facts.state_dir}, "
                 f"config {facts.config_path}")
    return "\n".join(printable(line) for line in lines) + "\n"


def render_json(facts: StatusFacts, assessment: Assessment) -> str:
    """Verdict, checks and the facts behind them, keys sorted."""
    document = {"verdict": assessment.verdict, "exit_code": assessment.exit_code,
                "checks": [c.model_dump(mode="json") for c in assessment.checks],
                "facts": facts.model_dump(mode="json")}
    return json.dumps(document, sort_keys=True, indent=2) + "\n"
