"""StatePaths: every file of the state directory, named once, joined the way the hot path and the daemon join them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agent.defaults import DEFAULT_STATE_DIR
from agent.statepaths import StatePaths

AGENT_PARENT = Path(__file__).resolve().parents[1]


def every_path(paths: StatePaths) -> dict:
    """Each property of ``paths`` and the two per-name paths, by name."""
    found = {name: getattr(paths, name) for name, value in vars(StatePaths).items() if isinstance(value, property)}
    found["job_result"] = paths.job_result("snapshot", "4242.1")
    found["fact_cache"] = paths.fact_cache("tool-versions")
    return found


def test_every_file_lies_under_the_state_directory_and_none_twice() -> None:
    """Each name is a distinct path directly or one folder below the state directory, with no doubled slash."""
    found = every_path(StatePaths("/srv/state/"))
    assert len(found) > 20
    assert len(set(found.values())) == len(found)
    for name, path in found.items():
        assert path.startswith("/srv/state/") and "//" not in path, name
        assert path.count("/") - "/srv/state/".count("/") <= 1, name


def test_the_default_is_the_packaged_state_directory() -> None:
    """Without an argument the files are those of /var/lib/gpuguard, what the packages create."""
    assert StatePaths().state_dir == DEFAULT_STATE_DIR
    assert StatePaths().compiled_policy == DEFAULT_STATE_DIR + "/policy.compiled.json"
    assert StatePaths("relative").outbox == "relative/outbox.sqlite3"


def test_the_names_the_files_had_before_are_kept() -> None:
    """The file names are the ones earlier releases wrote (a renamed file would be lost on upgrade)."""
    paths = StatePaths("/s")
    assert (paths.guard_events, paths.audit_log, paths.overrides, paths.known_good, paths.known_good_before_change,
            paths.rollback_authorization, paths.health_rollback, paths.reboot_required_packages, paths.outbox,
            paths.last_snapshot, paths.health_deferral, paths.guard_events_position, paths.guard_events_quarantine,
            paths.health_last_result, paths.health_baselines, paths.metrics_textfile,
            paths.dnf_script, paths.fact_cache("rpm")) == (
        "/s/guard-events.jsonl", "/s/audit.log", "/s/overrides.json", "/s/known-good.json",
        "/s/known-good.before-change.json", "/s/rollback-authorization.json", "/s/health-rollback.json",
        "/s/reboot-required.pkgs", "/s/outbox.sqlite3", "/s/last-snapshot.json", "/s/health-deferral.json",
        "/s/guard-events.position.json", "/s/guard-events.quarantine.jsonl", "/s/health/last.json",
        "/s/health/baselines.json", "/s/metrics/gpuguard.prom", "/s/rollback.dnf",
        "/s/cache/rpm.json")


def test_each_job_child_run_has_its_own_result_file() -> None:
    """Two runs of one job name (the heartbeat's and delivery's lean children) never share a result file."""
    paths = StatePaths("/s")
    assert paths.job_result("lean", "7.1") == "/s/.job-lean.7.1.result.json"
    assert paths.job_result("lean", "7.1") != paths.job_result("lean", "7.2")


def test_statepaths_loads_on_a_bare_interpreter_with_nothing_else() -> None:
    """``python3 -I -S`` imports agent.statepaths with no module outside the standard library but agent.defaults."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); before = set(sys.modules)\n"
            "import agent.statepaths\n"
            "print(' '.join(sorted(m for m in set(sys.modules) - before if m.startswith('agent'))))")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(AGENT_PARENT)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["agent", "agent.defaults", "agent.statepaths"]
