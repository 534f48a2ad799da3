"""Damaged config and state files on the command line: one stderr line naming the file, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Tuple

import pytest

from agent.errors import PolicyError
from agent.policy.load import load_policy
from tests.conftest import ROOTS

REPO = Path(__file__).resolve().parent.parent
DEEP_TOML = "a = " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_JSON = "[" * 100000 + "]" * 100000


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, env=env,
                          timeout=30, check=False)  # a reader blocked on a FIFO fails the test


def _one_line_error(proc: subprocess.CompletedProcess, path: Path, needle: str, exit_code: int) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == exit_code, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpuguard: error: ") and str(path) in lines[0] and needle in lines[0], lines[0]


BAD_CONFIGS: Tuple[Tuple[str, bytes, str], ...] = (
    ("not_utf8", b'[agent]\nhost_id = "\xff\xfe"\n', "not UTF-8 text"),
    ("deep", DEEP_TOML.encode(), "nested"),
    ("inf", b"[snapshot]\ninterval_seconds = inf\n", "snapshot -> interval_seconds: Input should be a finite number"),
    ("nan", b"[daemon]\nhealth_interval_seconds = nan\n", "daemon -> health_interval_seconds"),
    ("neg_inf", b"[report]\nheartbeat_interval_seconds = -inf\n", "report -> heartbeat_interval_seconds"),
)


@pytest.mark.parametrize("name,content,needle", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
@pytest.mark.parametrize("command", ["snapshot", "run", "policy compile"])
def test_bad_agent_toml_is_one_line_exit_3(tmp_path: Path, name: str, content: bytes, needle: str,
                                           command: str) -> None:
    """A non-UTF-8, deeply nested or non-finite agent.toml stops snapshot, run and policy compile with one line."""
    config = tmp_path / "agent.toml"
    config.write_bytes(content)
    extra = ["--policy", str(REPO / "policies" / "example.toml"), "-o", str(tmp_path / "out.json")] \
        if command == "policy compile" else []
    proc = _run_cli(*command.split(), "--config", str(config), "--root", str(ROOTS / "gpuless-debian12"), *extra)
    if command == "snapshot" and name in ("nan", "neg_inf"):
        # The snapshot command validates only [snapshot] (issue #17: it loads no other area's settings model);
        # the daemon and the policy commands report the other sections.
        assert proc.returncode == 0, proc.stderr
        return
    _one_line_error(proc, config, needle, 3)


@pytest.mark.parametrize("content,needle", [(b'x = "\xff"\n', "not valid TOML"),
                                            (DEEP_TOML.encode(), "not valid TOML: nested")], ids=["not_utf8", "deep"])
def test_bad_policy_file_is_one_line_exit_3(tmp_path: Path, content: bytes, needle: str) -> None:
    """policy check lists a non-UTF-8 or deeply nested file in policy.d as a problem of that file, exit 3."""
    policy_dir = tmp_path / "policy.d"
    policy_dir.mkdir()
    (policy_dir / "bad.toml").write_bytes(content)
    proc = _run_cli("policy", "check", str(policy_dir))
    assert "Traceback" not in proc.stderr and proc.returncode == 3, proc.stderr
    assert f"{policy_dir}/bad.toml: {needle}" in proc.stdout, proc.stdout


def test_unreadable_policy_dir_is_a_policy_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy.d that cannot be listed (permission denied) is a PolicyError naming it, not an OSError."""
    policy_dir = tmp_path / "policy.d"
    policy_dir.mkdir()

    def denied(self: Path) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(PolicyError) as caught:
        load_policy(str(policy_dir))
    assert str(caught.value) == f"{policy_dir}: cannot list the directory: Permission denied"


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists a mode-000 directory anyway")
def test_unreadable_policy_dir_on_the_cli(tmp_path: Path) -> None:
    """The real CLI on a mode-000 policy.d prints one line naming it."""
    policy_dir = tmp_path / "policy.d"
    policy_dir.mkdir(mode=0o000)
    try:
        proc = _run_cli("policy", "check", str(policy_dir))
    finally:
        policy_dir.chmod(0o755)
    _one_line_error(proc, policy_dir, "cannot list the directory", 3)


@pytest.mark.parametrize("content,needle", [
    (b'{"a": "\xff"}', "not UTF-8 text (byte 7)"), (DEEP_JSON.encode(), "nested deeper than 64 levels"),
    (b'{"a": NaN}', "non-finite number NaN"), (b'{"a": 1e999}', "non-finite number 1e999"),
], ids=["not_utf8", "deep", "nan", "overflow"])
def test_bad_snapshot_json_is_one_line_exit_4(tmp_path: Path, content: bytes, needle: str) -> None:
    """snapshot --diff on a non-UTF-8, deep or non-finite JSON file prints one line naming it."""
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    proc = _run_cli("snapshot", "--diff", str(bad), str(bad))
    _one_line_error(proc, bad, needle, 4)


@pytest.mark.parametrize("name,content,needle", [
    ("not_utf8", b'listen_host = "\xff"\n', "not UTF-8 text (byte 15)"),
    ("deep", DEEP_TOML.encode(), "not valid TOML: nested"),
    ("inf", b"write_timeout_seconds = inf\n", "write_timeout_seconds: Input should be a finite number"),
], ids=["not_utf8", "deep", "inf"])
def test_bad_hub_toml_is_one_line_exit_3(tmp_path: Path, name: str, content: bytes, needle: str) -> None:
    """hub serve on a non-UTF-8, deeply nested or non-finite hub.toml prints one line naming it."""
    config = tmp_path / "hub.toml"
    config.write_bytes(content)
    proc = _run_cli("hub", "serve", "--config", str(config))
    _one_line_error(proc, config, needle, 3)


def _fifo_setup(tmp_path: Path, state_file: str, under_root: bool) -> Tuple[Path, Path, Path]:
    """A copy of a fixture root, a config whose state_dir is in tmp_path, and a FIFO at ``state_file`` (host-side
    state under the root for the guard commands, the plain state directory for status); (root, config, fifo)."""
    import shutil

    root = tmp_path / "root"
    shutil.copytree(ROOTS / "gpuless-debian12", root, symlinks=True)
    state = tmp_path / "state"
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nstate_dir = "{state}"\n')
    fifo = (root / str(state).lstrip("/") if under_root else state) / state_file
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    return root, config, fifo


FIFO_CASES = (
    ("guard rollback --dry-run", "policy.compiled.json", True, 4),
    ("guard rollback --dry-run --policy policies/example.toml", "known-good.json", True, 4),
    ("policy explain", "policy.compiled.json", True, 4),
)


@pytest.mark.parametrize("command,state_file,under_root,exit_code", FIFO_CASES, ids=[f"{c[0].split(' --')[0]}:{c[1]}"
                                                                                    for c in FIFO_CASES])
def test_a_fifo_at_a_state_file_is_one_line_and_never_hangs(tmp_path: Path, command: str, state_file: str,
                                                            under_root: bool, exit_code: int) -> None:
    """guard rollback and policy explain stop with one line naming a FIFO put at a state file they read, within
    the subprocess timeout instead of waiting for a writer."""
    root, config, fifo = _fifo_setup(tmp_path, state_file, under_root)
    argv = [str(REPO / a) if a.startswith("policies/") else a for a in command.split()]
    proc = _run_cli(*argv, "--root", str(root), "--config", str(config))
    _one_line_error(proc, fifo, "not a regular file", exit_code)


@pytest.mark.parametrize("state_file,check", [("health/last.json", "health"), ("outbox.sqlite3", "outbox")])
def test_a_fifo_at_a_state_file_is_named_on_its_status_line(tmp_path: Path, state_file: str, check: str) -> None:
    """status reports a FIFO at the health result or the outbox on that check's FAIL line, naming the file, and
    does not wait for a writer."""
    root, config, fifo = _fifo_setup(tmp_path, state_file, under_root=False)
    proc = _run_cli("status", "--offline", "--root", str(root), "--config", str(config))
    assert "Traceback" not in proc.stderr and proc.returncode == 31, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.split()[1:2] == [check])
    assert line.startswith("FAIL") and f"{fifo}: not a regular file" in line, line
