"""The resident's plain report records are the report models' twins: same fields, defaults and bounds, and what they
write is valid under the published schema (the models, which schemas/events-v1.json is generated from)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any, Dict, Type

import pytest
from pydantic import ValidationError

from agent.jsonrecord import JsonRecord
from agent.models import FrozenModel
from agent.report.events import (
    PAYLOAD_KINDS,
    Event,
    EventBatch,
    HealthDeferred,
    Heartbeat,
    Rollback,
    RollbackCoverage,
    StateFileDamaged,
    UnknownVersionReport,
    WorkloadReport,
    WorkloadStackReport,
)
from agent.report.plain import (
    EVENT_ID_CHARS,
    HOST_ID_CHARS,
    HOSTNAME_CHARS,
    NEVER_DROPPED_KINDS,
    PlainEvent,
    PlainHealthDeferred,
    PlainHeartbeat,
    PlainPairing,
    PlainRollback,
    PlainRollbackCoverage,
    PlainStateFileDamaged,
    PlainUnknownVersion,
    PlainWorkload,
    PlainWorkloadStack,
)
from agent.report.schema import event_batch_schema
from agent.snapshot.pairing import Pairing

NOW = dt.datetime(2026, 12, 4, 12, 30, 15, 250000, tzinfo=dt.timezone.utc)
PAIRING = PlainPairing(os_id="ubuntu", os_version_id="24.04", kernel_running="6.8.0-45-generic",
                       nvidia_loaded="580.159.04", cuda_driver_api="13.0", gpu_count=8, gpu_models="NVIDIA H200")
COVERAGE = PlainRollbackCoverage(guarded=33, restorable=32, by_source={"archive cache": 1, "rebuilt": 31},
                                 not_restorable=("cuda-cudart-13-0",), inexact=("libnvidia-compute-580",))
STACK = PlainWorkloadStack(gpu_models="NVIDIA H200", driver="nvidia 580.159.04", gpu_stack="CUDA 13.0",
                           framework="torch 2.9.1 (CUDA 13.0)", image="registry.example/llm:1")
WORKLOAD = PlainWorkload(name="resnet-train", status="cpu_fallback", gates=True, stack_id="0123456789abcdef",
                         stack=STACK)
UNKNOWN = PlainUnknownVersion(table="therock", component="therock", version="10.2", newest="10.1", dated="2026-12-06")
# Each record, its model, and an instance with every field set.
TWINS = [
    (PlainPairing, Pairing, PAIRING),
    (PlainRollbackCoverage, RollbackCoverage, COVERAGE),
    (PlainWorkloadStack, WorkloadStackReport, STACK),
    (PlainWorkload, WorkloadReport, WORKLOAD),
    (PlainUnknownVersion, UnknownVersionReport, UNKNOWN),
    (PlainHeartbeat, Heartbeat, PlainHeartbeat(agent_version="0.1.0", uptime_seconds=12.5, content_hash="sha256:ab",
                                               outbox_depth=3, pairing=PAIRING, compliant=False,
                                               last_health_status="busy", rollback_coverage=COVERAGE,
                                               labels={"rack": "a7"},
                                               policy_source="bundle", policy_serial=42, policy_refused_serial=43,
                                               policy_refused_reason="signature: no trusted key",
                                               workloads=(WORKLOAD,), unknown_versions=(UNKNOWN,))),
    (PlainStateFileDamaged, StateFileDamaged, PlainStateFileDamaged(path="/var/lib/gpuguard/outbox.sqlite3",
                                                                    problem="damaged", action="salvaged",
                                                                    moved_to="/var/lib/gpuguard/x", salvaged_events=4,
                                                                    lost_events=1)),
    (PlainRollback, Rollback, PlainRollback(reason="guard_check_failed", from_versions={"a": "1"},
                                            to_versions={"a": "0"}, succeeded=False, reboot_required=True,
                                            detail="the rollback check failed", health_status="failed")),
    (PlainHealthDeferred, HealthDeferred, PlainHealthDeferred(deferred_since=NOW, window_seconds=3600.0, attempts=4,
                                                              last_status="busy", after_change=True,
                                                              tenants=("gpu 0: pid 1 (python3)",), detail="d")),
]


def _defaults(record: Type[JsonRecord]) -> Dict[str, Any]:
    out = {f.name: f.default for f in dataclasses.fields(record) if f.default is not dataclasses.MISSING}
    out.update({f.name: f.default_factory() for f in dataclasses.fields(record)
                if f.default_factory is not dataclasses.MISSING})
    return out


def _model_defaults(model: Type[FrozenModel]) -> Dict[str, Any]:
    return {name: info.default for name, info in model.model_fields.items() if not info.is_required()
            and name != "kind"}


@pytest.mark.parametrize("record, model, _", TWINS, ids=[t[1].__name__ for t in TWINS])
def test_a_record_has_its_models_fields_and_defaults(record: Type[JsonRecord], model: Type[FrozenModel],
                                                     _: JsonRecord) -> None:
    """Field names, which are required and the defaults are the model's: a field added to either fails here."""
    assert {f.name for f in dataclasses.fields(record)} == set(model.model_fields) - {"kind"}
    assert _defaults(record) == {k: (tuple(v) if isinstance(v, list) else v) for k, v in _model_defaults(model).items()}


@pytest.mark.parametrize("record, model, instance", TWINS, ids=[t[1].__name__ for t in TWINS])
def test_what_a_record_writes_its_model_reads_back_unchanged(record: Type[JsonRecord], model: Type[FrozenModel],
                                                              instance: JsonRecord) -> None:
    """The record's JSON validates as the model and dumps back to the same JSON."""
    written = instance.to_json()
    assert model.model_validate(written).model_dump(mode="json") == written


def test_a_plain_event_is_a_valid_event_of_the_published_schema() -> None:
    """The envelope the resident stores validates as an Event (in a batch, as delivery sends it)."""
    for _, _, payload in TWINS[5:]:
        stored = PlainEvent.of(payload, "h-1", "node-1", NOW, "warning").with_sequence(7)
        event = Event.model_validate_json(stored.to_json_text())
        assert (event.event_id, event.sequence, event.kind, event.occurred_at) == (stored.event_id, 7, payload.kind,
                                                                                   NOW)
        assert json.loads(event.model_dump_json()) == json.loads(stored.to_json_text())
        EventBatch(events=[event])


def test_the_envelope_bounds_are_the_schemas() -> None:
    """The lengths PlainEvent checks are the published schema's for Event, and it refuses what the model refuses."""
    fields = event_batch_schema()["$defs"]["Event"]["properties"]
    for name, (least, most) in (("event_id", EVENT_ID_CHARS), ("host_id", HOST_ID_CHARS),
                                ("hostname", HOSTNAME_CHARS)):
        assert (fields[name]["minLength"], fields[name]["maxLength"]) == (least, most)
    heartbeat = Heartbeat(agent_version="1", uptime_seconds=1.0)
    for bad in ({"host_id": ""}, {"hostname": "n" * 256}, {"event_id": "short"}):
        envelope = {"host_id": "h-1", "hostname": "node-1", "occurred_at": NOW, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            PlainEvent.of(heartbeat, **envelope)
        with pytest.raises(ValidationError):
            Event(payload=heartbeat, **envelope)


def test_a_damage_report_refuses_what_the_model_refuses() -> None:
    """StateFileDamaged's length bounds hold for the record too."""
    for field, limit in (("problem", 2000), ("action", 500), ("path", 4096)):
        values = {"path": "/p", "problem": "x", "action": "a", field: "y" * (limit + 1)}
        with pytest.raises(ValueError, match=field):
            PlainStateFileDamaged(**values)
        with pytest.raises(ValidationError):
            StateFileDamaged(**values)


def test_a_heartbeat_refuses_what_the_model_refuses() -> None:
    """The policy fields' bounds (serials at least 1, a reason of at most 2000 characters) hold for the record too."""
    for bad in ({"policy_serial": 0}, {"policy_refused_serial": 0}, {"policy_refused_reason": "r" * 2001}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PlainHeartbeat(agent_version="1", uptime_seconds=1.0, **bad)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            Heartbeat(agent_version="1", uptime_seconds=1.0, **bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [{"name": "Resnet"}, {"name": "r" * 65}, {"status": "skipped"},
                                 {"status": "great"}, {"stack_id": "0123456789ABCDEF"}, {"stack_id": "abc"}])
def test_a_workload_refuses_what_the_model_refuses(bad: Dict[str, Any]) -> None:
    """A workload's name, status and stack id are checked alike by the record and the model."""
    values = {"name": "resnet-train", "status": "pass", "gates": True, "stack_id": "0123456789abcdef", **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        PlainWorkload(**values)
    with pytest.raises(ValidationError):
        WorkloadReport(**values)


def test_the_heartbeats_workloads_are_bounded() -> None:
    """At most 32 workloads and stack texts of at most 300 characters, in the record and the model alike."""
    many = tuple(dataclasses.replace(WORKLOAD, name=f"w{i}") for i in range(33))
    with pytest.raises(ValueError, match="workloads"):
        PlainHeartbeat(agent_version="1", uptime_seconds=1.0, workloads=many)
    with pytest.raises(ValidationError):
        Heartbeat(agent_version="1", uptime_seconds=1.0, workloads=[w.to_json() for w in many])  # type: ignore[misc]
    with pytest.raises(ValueError, match="framework"):
        PlainWorkloadStack(framework="t" * 301)
    with pytest.raises(ValidationError):
        WorkloadStackReport(framework="t" * 301)


@pytest.mark.parametrize("bad", [{"table": "nvidia-matrix"}, {"component": "kernel"}, {"version": ""},
                                 {"newest": "1" * 65}, {"dated": ""}])
def test_an_unknown_version_refuses_what_the_model_refuses(bad: Dict[str, Any]) -> None:
    """An unknown version's table and component (agent/wire.py's lists) and its texts (1-64 characters) are checked
    alike by the record and the model; more than 32 in a heartbeat are refused by both."""
    values = {**UNKNOWN.to_json(), **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        PlainUnknownVersion(**values)
    with pytest.raises(ValidationError):
        UnknownVersionReport(**values)
    with pytest.raises(ValueError, match="unknown_versions"):
        PlainHeartbeat(agent_version="1", uptime_seconds=1.0, unknown_versions=(UNKNOWN,) * 33)
    with pytest.raises(ValidationError):
        Heartbeat(agent_version="1", uptime_seconds=1.0, unknown_versions=[UNKNOWN.to_json()] * 33)  # type: ignore[list-item]


def test_an_old_agents_heartbeat_still_validates() -> None:
    """A heartbeat without any policy field (an agent from before signed bundles) is valid, the fields None."""
    heartbeat = Heartbeat.model_validate({"kind": "heartbeat", "agent_version": "0.9", "uptime_seconds": 3.0})
    assert (heartbeat.labels, heartbeat.policy_source, heartbeat.policy_serial) == (None, None, None)
    assert heartbeat.workloads is None


def test_the_never_dropped_kinds_are_payload_kinds() -> None:
    """The outbox's never-dropped set names kinds the schema has."""
    assert NEVER_DROPPED_KINDS <= set(PAYLOAD_KINDS)
