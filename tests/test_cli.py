"""The gpuguard command line: output, exit codes and one-line errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from agent.cli import main
from agent.snapshot.io import parse_snapshot_json
from tests.conftest import ROOTS, make_fixture_host

REPO = Path(__file__).resolve().parent.parent


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def test_real_cli_snapshots_a_fixture_root(tmp_path: Path) -> None:
    """The installed entry point snapshots a foreign root as valid JSON and writes it with -o."""
    out_file = tmp_path / "snap.json"
    proc = _run_cli("snapshot", "--root", str(ROOTS / "gpuless-debian12"), "--json", "-o", str(out_file))
    assert proc.returncode == 0, proc.stderr
    snap = parse_snapshot_json(proc.stdout)
    assert snap.os.data.id == "debian" and snap.kernel.data.running_release == "6.1.0-26-amd64"
    assert parse_snapshot_json(out_file.read_text()).content_hash == snap.content_hash


def test_text_summary_names_kernel_and_findings() -> None:
    """The default output is a readable summary with the pending reboot."""
    out = io.StringIO()
    assert main(["snapshot", "--root", str(ROOTS / "gpuless-debian12")],
                make_host=lambda root: make_fixture_host("gpuless-debian12"), out=out) == 0
    text = out.getvalue()
    assert "kernel   6.1.0-26-amd64  next boot 6.1.0-27-amd64 (REBOOT PENDING)" in text
    assert "[info] reboot_pending" in text


def test_diff_of_two_files(tmp_path: Path) -> None:
    """--diff OLD NEW prints the changes between two stored snapshots, and JSON with --json."""
    host = make_fixture_host("gpuless-debian12")
    out = io.StringIO()
    main(["snapshot", "--json"], make_host=lambda root: host, out=out)
    old = json.loads(out.getvalue())
    new = json.loads(out.getvalue())
    new["dpkg"]["data"]["packages"]["runc"]["version"] = "1.1.12-1"
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    text = io.StringIO()
    assert main(["snapshot", "--diff", str(tmp_path / "old.json"), str(tmp_path / "new.json")], out=text) == 0
    assert "~ dpkg.packages.runc.version: 1.1.5+ds1-1+deb12u1 -> 1.1.12-1" in text.getvalue()
    as_json = io.StringIO()
    main(["snapshot", "--json", "--diff", str(tmp_path / "old.json"), str(tmp_path / "new.json")], out=as_json)
    assert json.loads(as_json.getvalue())["changes"][0]["path"] == "packages.runc.version"


def test_bad_snapshot_files_give_one_line_errors(tmp_path: Path) -> None:
    """Missing, non-JSON and wrong-shape files each give one stderr line naming the file, exit 4, no traceback."""
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "wrong.json").write_text('{"schema_version": 1, "hostname": 5}')
    good = tmp_path / "good.json"
    good.write_text(_run_cli("snapshot", "--root", str(ROOTS / "gpuless-debian12"), "--json").stdout)
    for bad, needle in (("missing.json", "no such file"), ("garbage.json", "not valid JSON"),
                        ("wrong.json", "not a gpuguard snapshot")):
        proc = _run_cli("snapshot", "--diff", str(tmp_path / bad), str(good))
        assert proc.returncode == 4
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(tmp_path / bad) in lines[0] and needle in lines[0]
        assert "Traceback" not in proc.stderr


def test_usage_error_exit_code() -> None:
    """An unknown subcommand exits 2 like any argparse usage error."""
    assert _run_cli("no-such-command").returncode == 2


def test_snapshot_honours_extra_watched_packages_from_config(tmp_path: Path) -> None:
    """A package added to the watchlist in agent.toml appears in the snapshot."""
    config = tmp_path / "agent.toml"
    config.write_text('[snapshot]\nextra_watched_packages = ["python3"]\n')
    out = io.StringIO()
    assert main(["snapshot", "--json", "--config", str(config)],
                make_host=lambda root: make_fixture_host("gpuless-debian12"), out=out) == 0
    assert "python3" in json.loads(out.getvalue())["dpkg"]["data"]["packages"]


def test_invalid_config_is_one_line_exit_3(tmp_path: Path) -> None:
    """A config with several mistakes reports all of them on one line and exits 3."""
    config = tmp_path / "agent.toml"
    config.write_text('[snapshot]\ninterval_seconds = -5\nbogus = 1\n')
    proc = _run_cli("snapshot", "--config", str(config), "--root", str(ROOTS / "gpuless-debian12"))
    assert proc.returncode == 3
    line = proc.stderr.strip()
    assert "\n" not in line and "snapshot -> interval_seconds" in line and "snapshot -> bogus" in line
