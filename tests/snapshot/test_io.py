"""Reading a snapshot back: pydantic validates the frozen dataclasses strictly, the error names file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.collectors.os_release import OsRelease
from agent.collectors.packages import PackageSet
from agent.errors import InputFileError
from agent.snapshot.io import load_snapshot
from tests.snapshot.test_serialization import GOLDEN

STORED = json.loads(GOLDEN["gpuless-debian12"]["json"])


def _with(change) -> dict:
    data = json.loads(json.dumps(STORED))
    change(data)
    return data


def test_a_stored_snapshot_reads_back_into_the_same_types(tmp_path: Path) -> None:
    """Sections hold the collectors' dataclasses again, equal to the stored values."""
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(STORED))
    snap = load_snapshot(str(path))
    assert isinstance(snap.os.data, OsRelease) and isinstance(snap.dpkg.data, PackageSet)
    assert snap.os.data.id == STORED["os"]["data"]["id"]
    assert snap.packages()["containerd.io"].version == STORED["dpkg"]["data"]["packages"]["containerd.io"]["version"]


@pytest.mark.parametrize("change, problem", [
    (lambda d: d["os"]["data"].update(bogus=1), "os -> data -> bogus: Unexpected keyword argument"),
    (lambda d: d.update(bogus=1), "bogus: Unexpected keyword argument"),
    (lambda d: d["os"].update(status="fine"), "os -> status: Input should be 'ok', 'absent' or 'error'"),
    (lambda d: d["dpkg"]["data"].update(installed_count="many"),
     "dpkg -> data -> installed_count: Input should be a valid integer, unable to parse string as an integer"),
    (lambda d: d.pop("kernel"), "kernel: Field required"),
    (lambda d: d.update(schema_version=2), "schema_version: Input should be 1"),
])
def test_what_is_not_a_snapshot_is_refused_naming_the_field(tmp_path: Path, change, problem: str) -> None:
    """Unknown fields, wrong types, missing sections and another schema version: one line with file and field."""
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(_with(change)))
    with pytest.raises(InputFileError) as caught:
        load_snapshot(str(path))
    assert caught.value.path == str(path)
    assert caught.value.reason == f"not a gpuguard snapshot: {problem}"
