"""The published event schema matches the models."""

from __future__ import annotations

import json
from pathlib import Path

from agent.report.plain import NEVER_DROPPED_KINDS
from agent.report.schema import SCHEMA_FILENAME, event_batch_schema, render_schema

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_committed_schema_equals_the_generated_one() -> None:
    """Regenerate with: gpuguard schema -o schemas/events-v1.json"""
    assert (SCHEMAS / SCHEMA_FILENAME).read_text() == render_schema()


def test_schema_names_every_payload_kind() -> None:
    """Each payload kind, including the never-dropped ones, is a member of the discriminated union."""
    text = json.dumps(event_batch_schema())
    for kind in ["snapshot_changed", "heartbeat", "health_regression", "cpu_fallback", *NEVER_DROPPED_KINDS]:
        assert f'"const": "{kind}"' in text
