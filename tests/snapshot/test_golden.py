"""Golden output of `gpuguard snapshot --root FIXTURE --json` for every fixture host.

Regenerate after an intended change with: UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/snapshot/test_golden.py
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from agent.cli import main
from tests.conftest import ROOTS, make_fixture_host

GOLDEN = Path(__file__).parent.parent / "golden"
SCENARIOS = sorted(p.name for p in ROOTS.iterdir() if p.is_dir())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_snapshot_matches_golden(scenario: str) -> None:
    """The canonical JSON snapshot of a fixture host equals its golden file byte for byte."""
    hosts = []

    def make_host(root: str):
        assert Path(root) == ROOTS / scenario
        host = make_fixture_host(scenario)
        hosts.append(host)
        return host

    out = io.StringIO()
    assert main(["snapshot", "--root", str(ROOTS / scenario), "--json"], make_host=make_host, out=out) == 0
    unrecorded = [c for c in hosts[0].runner.calls if c not in hosts[0].runner._by_argv]
    assert unrecorded == []
    golden = GOLDEN / f"{scenario}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(out.getvalue())
    assert golden.exists(), f"no golden file for {scenario}: run with UPDATE_GOLDEN=1"
    assert json.loads(out.getvalue()) == json.loads(golden.read_text())
    assert out.getvalue() == golden.read_text()


def test_every_golden_file_has_a_fixture() -> None:
    """No stale golden file outlives its fixture."""
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == SCENARIOS
