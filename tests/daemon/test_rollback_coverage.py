"""The daemon carries the rollback coverage the last recording wrote: in the heartbeat and in the NFD labels."""

from __future__ import annotations

import json
from pathlib import Path

from agent.config import Settings
from agent.daemon_jobs.heartbeat import HeartbeatJob
from agent.daemon_jobs.metrics import MetricsJob
from agent.daemon_jobs.nfd import NfdJob
from agent.host import Host
from agent.statepaths import StatePaths
from tests.conftest import fixed_clock
from tests.daemon.test_jobs import make_runtime
from tests.daemon.test_nfd import nfd_settings
from tests.integrations.features_format import parse_features


def _root_with_coverage(tmp_path: Path, kept: int, guarded: int) -> Path:
    """A host root whose state directory holds rollback-coverage.json: ``kept`` of ``guarded`` files present."""
    root = tmp_path / "root"
    debs = root / "var/lib/gpuguard/debs"
    debs.mkdir(parents=True)
    packages = {}
    for i in range(guarded):
        name = f"cuda-lib-{i:02d}"
        path = f"/var/lib/gpuguard/debs/{name}_13.0.96-1_amd64.deb"
        if i < kept:
            (root / path.lstrip("/")).write_bytes(b"!<arch>\n")
        packages[name] = {"version": "13.0.96-1", "arch": "amd64", "source": "rebuilt" if i else "archive cache",
                          "path": path, **({"inexact": ["changed since installation: /x"]} if i == 1 else {})}
    coverage = root / StatePaths().rollback_coverage.lstrip("/")
    coverage.write_text(json.dumps({"format": 1, "recorded_at": "2026-12-04T12:00:00+00:00", "packages": packages}))
    return root


def test_heartbeat_carries_the_rollback_coverage(tmp_path: Path) -> None:
    """The heartbeat names how many guarded packages are restorable, from what, and which are not or inexactly."""
    rt = make_runtime(tmp_path, Host(root=_root_with_coverage(tmp_path, 32, 33), clock=fixed_clock))
    HeartbeatJob(rt).run()
    coverage = rt.outbox.pending(10)[-1].payload.rollback_coverage
    assert coverage is not None and (coverage.guarded, coverage.restorable) == (33, 32)
    assert coverage.by_source == {"archive cache": 1, "rebuilt": 31}
    assert coverage.not_restorable == ["cuda-lib-32"] and coverage.inexact == ["cuda-lib-01"]


def test_heartbeat_without_a_recorded_set_has_no_coverage(tmp_path: Path) -> None:
    """Before any known-good set the heartbeat says nothing about coverage rather than a guess."""
    root = tmp_path / "root"
    root.mkdir()
    rt = make_runtime(tmp_path, Host(root=root, clock=fixed_clock))
    HeartbeatJob(rt).run()
    assert rt.outbox.pending(10)[-1].payload.rollback_coverage is None


def test_nfd_labels_say_whether_every_guarded_package_is_restorable(tmp_path: Path) -> None:
    """gpuguard.io/rollback-restorable is false with a file missing and gpuguard.io/rollback-coverage says how many."""
    features = tmp_path / "gpuguard"
    rt = make_runtime(tmp_path, Host(root=_root_with_coverage(tmp_path, 32, 33), clock=fixed_clock),
                      nfd_settings(features))
    NfdJob(rt).run()
    found = parse_features(features.read_text())[1]
    assert found["gpuguard.io/rollback-restorable"] == "false"
    assert found["gpuguard.io/rollback-coverage"] == "32-of-33"


def test_the_metrics_textfile_carries_the_rollback_coverage(tmp_path: Path) -> None:
    """gpuguard.prom says how many guarded packages there are, how many are restorable per source, and how many
    only inexactly."""
    settings = Settings.model_validate({"agent": {"state_dir": str(tmp_path / "state")}})
    root = _root_with_coverage(tmp_path, 32, 33)
    (root / str(tmp_path / "state").lstrip("/")).mkdir(parents=True)
    coverage = root / StatePaths().rollback_coverage.lstrip("/")
    coverage.rename(root / StatePaths(str(tmp_path / "state")).rollback_coverage.lstrip("/"))
    rt = make_runtime(tmp_path, Host(root=root, clock=fixed_clock), settings)
    MetricsJob(rt).run()
    text = (tmp_path / "state" / "metrics" / "gpuguard.prom").read_text()
    assert "gpuguard_rollback_guarded_packages 33" in text
    assert 'gpuguard_rollback_restorable_packages{source="rebuilt"} 31' in text
    assert 'gpuguard_rollback_restorable_packages{source="archive cache"} 1' in text
    assert "gpuguard_rollback_inexact_packages 1" in text
