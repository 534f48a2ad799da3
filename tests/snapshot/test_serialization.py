"""The snapshot's JSON and content hash are byte-identical to those of the pydantic models they replaced.

tests/snapshot/serialization_golden.json was written by the pydantic models (commit 081bb24) for every fixture root:
``to_json()``, ``to_json(indent=None)`` and ``compute_content_hash`` of the snapshot taken there, and of that
snapshot read back from a file with other ``taken_at`` forms (microseconds, offsets, naive) and without the fields
added after schema version 1 (``@legacy``). Stored snapshots keep their content hash only while these hold.

Since then the collectors load amdsmi and NVML only where the driver shows (a module, /dev/kfd, /dev/nvidiactl),
which changed the reason an absent GPU section gives (tests/golden has today's); the fixture hosts here show those
devices, so the collectors ask the (fake) libraries as the pydantic-era code did and the content is the same.
The TheRock fixture roots (therock-*, mixed-*) and debian13-rocm-cuda came later: their entries were written by
today's code, which leaves the fields added since (a ROCm tree's amd_smi_soname, the distribution's packages of ROCm
and CUDA) out while empty, so the older roots' bytes stay. The rocm7-rhel9 root's /opt/rocm is an alternative
(``/etc/alternatives/rocm``): its entry was rewritten when the ROCm section began naming the alternative that
chooses the active tree (issue 40); its read-back cases still read the pydantic-era file (``stored_json``) and print
what pydantic printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.frozen import field_values
from agent.host import Host
from agent.snapshot.io import load_snapshot
from agent.snapshot.model import compute_content_hash
from agent.snapshot.take import take_snapshot
from tests.conftest import ROOTS, make_fixture_host

GOLDEN = json.loads((Path(__file__).parent / "serialization_golden.json").read_text())
SCENARIOS = sorted(p.name for p in ROOTS.iterdir() if p.is_dir())
READ_BACK = sorted(case for case in GOLDEN if "@" in case)


class _DriverDevicesShown(Host):
    """A fixture host that also shows /dev/kfd and /dev/nvidiactl, so amdsmi and NVML are asked whatever it holds."""

    def exists(self, host_path: str) -> bool:
        return host_path in ("/dev/kfd", "/dev/nvidiactl") or super().exists(host_path)


def _as_pydantic_era_collectors_saw_it(scenario: str) -> Host:
    host = make_fixture_host(scenario)
    return _DriverDevicesShown(**field_values(host))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_taken_snapshot_prints_what_pydantic_printed(scenario: str) -> None:
    """A fixture root's snapshot: the same indented and compact JSON, the same content hash."""
    snap = take_snapshot(_as_pydantic_era_collectors_saw_it(scenario))
    expected = GOLDEN[scenario]
    assert snap.to_json() == expected["json"]
    assert snap.to_json(indent=None) == expected["compact"]
    assert compute_content_hash(snap) == expected["hash"] == snap.content_hash


@pytest.mark.parametrize("case", READ_BACK)
def test_read_back_snapshot_prints_what_pydantic_printed(case: str, tmp_path: Path) -> None:
    """A stored snapshot read back (other taken_at forms, a schema-1 file without later fields) prints the same."""
    scenario, variant = case.split("@")
    expected = GOLDEN[case]
    if variant == "legacy":
        data = expected["input"]
    else:
        data = json.loads(GOLDEN[scenario].get("stored_json", GOLDEN[scenario]["json"]))
        data["taken_at"] = expected["taken_at"]
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(data))
    snap = load_snapshot(str(path))
    assert snap.to_json() == expected["json"]
    assert compute_content_hash(snap) == expected["hash"]


def test_golden_covers_every_fixture_root() -> None:
    """Every fixture root has its golden serialization."""
    assert sorted(case for case in GOLDEN if "@" not in case) == SCENARIOS
