"""The published JSON schema of report events, generated from the pydantic models (``gpuguard schema``).

``schemas/events-v1.json`` in the repository is this output; a test fails when the models change and the file
was not regenerated (``gpuguard schema -o schemas/events-v1.json``).
"""

from __future__ import annotations

import json
from typing import Any, Dict

from agent.report.events import EventBatch
from agent.report.plain import EVENT_SCHEMA_VERSION

SCHEMA_ID = f"https://gpuguard.dev/schemas/events-v{EVENT_SCHEMA_VERSION}.json"
SCHEMA_FILENAME = f"events-v{EVENT_SCHEMA_VERSION}.json"


def event_batch_schema() -> Dict[str, Any]:
    """The JSON schema (draft 2020-12) of the body POSTed to ``/v1/events``."""
    schema = EventBatch.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": f"gpuguard report events, schema version {EVENT_SCHEMA_VERSION}", **{
                k: v for k, v in schema.items() if k != "title"}}


def render_schema() -> str:
    """The schema as canonical text: sorted keys, two-space indent, final newline."""
    return json.dumps(event_batch_schema(), indent=2, sort_keys=True) + "\n"
