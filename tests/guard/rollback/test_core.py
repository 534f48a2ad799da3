"""The after-the-fact guard over a fake root with recorded apt output: known-good state, plans, lock, bad state."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Tuple

import pytest

from agent.cli import main
from agent.config import Settings
from agent.errors import CommandTimeout, InputFileError
from agent.guard.apt.tool import AptTool, parse_simulation
from agent.guard.rollback.core import load_known_good
from agent.host import Host
from agent.policy.load import compiled_from, load_policy
from agent.statepaths import StatePaths
from tests.conftest import fill_disk, fixed_clock
from tests.fakes.runner import FakeRunner
from tests.guard.wiring import check

POLICY = """
[policy]
name = "rb"
[amd]
action = "rollback"
[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
"""
D62, D63, R62 = "1:6.8.5.60202-2041575", "1:6.10.5.60300-2084815", "6.2.2.60202-116~12"
SIMULATION = """NOTE: This is only a simulation!
Inst amdgpu-dkms [1:6.10.5.60300-2084815] (1:6.8.5.60202-2041575 localhost [all])
Conf amdgpu-dkms (1:6.8.5.60202-2041575 localhost [all])
"""


def _status(driver: str) -> str:
    return (f"Package: amdgpu-dkms\nStatus: install ok installed\nArchitecture: all\nVersion: {driver}\n\n"
            f"Package: rocm-core\nStatus: install ok installed\nArchitecture: amd64\nVersion: {R62}\n\n")


@pytest.fixture
def setup(tmp_path: Path):
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(_status(D62))
    policy_file = tmp_path / "p.toml"
    policy_file.write_text(POLICY)
    policy = compiled_from(load_policy(str(policy_file)))
    runner = FakeRunner()
    host = Host(root=root, runner=runner, clock=fixed_clock)
    tool = AptTool(host, lock_timeout_seconds=1)
    _consistent(runner, tool)
    return root, host, tool, runner, policy, policy_file


def _consistent(runner: FakeRunner, tool: AptTool, audit: str = "") -> None:
    """Record the database check (dpkg --audit, apt-get check) run before a set is recorded as known-good."""
    runner.add(tool.argv("dpkg", "--audit"), stdout=audit)
    runner.add(tool.argv("apt-get", "-q", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check"),
               stdout="Reading package lists...\n")


def test_a_compliant_but_broken_database_is_not_recorded_as_known_good(tmp_path: Path) -> None:
    """dpkg --audit reports an unconfigured package: the set is not recorded (a rollback would restore it)."""
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(_status(D62))
    policy_file = tmp_path / "p.toml"
    policy_file.write_text(POLICY)
    runner = FakeRunner()
    host = Host(root=root, runner=runner, clock=fixed_clock)
    tool = AptTool(host, lock_timeout_seconds=1)
    _consistent(runner, tool, audit="The following packages are only half configured ...\n amdgpu-dkms\n")
    result = check(host, Settings(), policy=compiled_from(load_policy(str(policy_file))), tool=tool)
    assert result.status == "inconsistent" and "dpkg --audit" in result.detail
    assert load_known_good(host, StatePaths()) is None


def test_parse_simulation() -> None:
    """An apt-get -s simulation is parsed into its install steps with old and new versions."""
    (step,) = parse_simulation(SIMULATION)
    assert (step.action, step.package, step.old_version, step.new_version) == ("install", "amdgpu-dkms", D63, D62)


def test_first_compliant_check_records_known_good_then_plans_a_rollback(setup) -> None:
    """The first compliant check records the known-good set; after a forced driver change a dry run plans the way
    back."""
    root, host, tool, runner, policy, _ = setup
    for name, version in (("amdgpu-dkms", D62), ("rocm-core", R62)):
        runner.add(tool._download_argv(name, version, "/var/lib/gpuguard/debs"), returncode=100,
                   stderr="E: Version not found")
    result = check(host, Settings(), policy=policy, tool=tool)
    assert result.status == "recorded"
    assert load_known_good(host, StatePaths())["amdgpu-dkms"].version == D62
    (root / "var/lib/dpkg/status").write_text(_status(D63))
    runner.add(tool.argv("apt-get", "-s", "-y", "--allow-downgrades", "--allow-change-held-packages",
                         *tool._apt_options(), "install", f"amdgpu-dkms={D62}"), stdout=SIMULATION)
    planned = check(host, Settings(), policy=policy, tool=tool, dry_run=True)
    assert planned.status == "planned" and planned.targets == [f"amdgpu-dkms={D62}"]
    assert planned.reboot_required and planned.to_versions == {"amdgpu-dkms": D62}
    assert "plan: install amdgpu-dkms" in planned.summary()


def test_versions_no_repository_offers_are_named_when_recorded_and_when_planning_fails(setup) -> None:
    """As on the H200 (no repository reachable): the operator learns at record time, and the failed plan says
    which package file is missing and where to put it."""
    root, host, tool, runner, policy, _ = setup
    for name, version in (("amdgpu-dkms", D62), ("rocm-core", R62)):
        runner.add(tool._download_argv(name, version, "/var/lib/gpuguard/debs"), returncode=100,
                   stderr=f"E: Can't find a source to download version '{version}' of '{name}:amd64'")
    recorded = check(host, Settings(), policy=policy, tool=tool)
    assert recorded.status == "recorded"
    assert "no package file could be kept for 2 of them (amdgpu-dkms, rocm-core)" in recorded.detail
    assert "; 0/2 guarded packages restorable;" in recorded.detail  # the coverage, as status shows it
    (root / "var/lib/dpkg/status").write_text(_status(D63))
    runner.add(tool.argv("apt-get", "-s", "-y", "--allow-downgrades", "--allow-change-held-packages",
                         *tool._apt_options(), "install", f"amdgpu-dkms={D62}"), returncode=100,
               stderr="E: Version '1:6.8.5.60202-2041575' for 'amdgpu-dkms' was not found\n")
    planned = check(host, Settings(), policy=policy, tool=tool, dry_run=True)
    assert planned.status == "failed"
    assert "apt-get -s could not plan the rollback: E: Version" in planned.detail
    assert f"no kept package file for amdgpu-dkms {D62}: put it in /var/lib/gpuguard/debs" in planned.detail
    assert "rocm-core" not in planned.detail.split("no kept package file", 1)[1]  # it did not move


@pytest.mark.parametrize("content", [b'{"format": 1, "packages": [1, 2]}', b"[" * 100000 + b"]" * 100000,
                                     b'{"format": 1, "packages": {"\xff": {"version": "1"}}}'],
                         ids=["wrong-shape", "deeply-nested", "not-utf8"])
def test_corrupt_known_good_state_is_exit_4_in_one_line(setup, capsys, content: bytes) -> None:
    """A known-good file of the wrong shape, too deeply nested or not UTF-8 makes guard rollback exit 4 with one
    line."""
    root, host, tool, runner, policy, policy_file = setup
    state = root / "var/lib/gpuguard"
    state.mkdir(parents=True)
    (state / "known-good.json").write_bytes(content)
    with pytest.raises(InputFileError, match="corrupt known-good state"):
        load_known_good(host, StatePaths())
    code = main(["guard", "rollback", "--root", str(root), "--policy", str(policy_file), "--config",
                 str(root / "none.toml")], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 4 and err.startswith("gpuguard: error: ") and "corrupt known-good state" in err
    assert len(err.strip().splitlines()) == 1


def test_waits_for_the_dpkg_lock_and_gives_up_after_the_timeout(setup, tmp_path: Path) -> None:
    """The rollback waits for dpkg's frontend lock held by another process and gives up with CommandTimeout after the
    timeout."""
    root, host, tool, *_ = setup
    lock = root / "var/lib/dpkg/lock-frontend"
    lock.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR); "
                               "fcntl.lockf(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(CommandTimeout):
            tool.wait_for_dpkg_lock()
        assert 0.9 < time.monotonic() - started < 60  # its timeout, not the holder's 120 s: load-proof
    finally:
        holder.kill()
        holder.wait()
    slept: List[float] = []
    tool.sleep = slept.append  # the lock is free at the first look: no poll, however slow the machine
    tool.wait_for_dpkg_lock()
    assert slept == []


LOCAL_ONLY = ["-o", "Dir::Etc::SourceList=/dev/null", "-o", "Dir::Etc::SourceParts=/dev/null"]


def _kept_deb(root: Path) -> str:
    debs = root / "var/lib/gpuguard/debs"
    debs.mkdir(parents=True, exist_ok=True)
    name = f"amdgpu-dkms_{D62.replace(':', '%3a')}_all.deb"
    (debs / name).write_bytes(b"!<arch>\n")
    return f"/var/lib/gpuguard/debs/{name}"


def _simulate_argv(tool: AptTool, target: str, local_only: bool) -> list:
    return tool.argv("apt-get", "-s", "-y", "--allow-downgrades", "--allow-change-held-packages", *tool._apt_options(),
                     *(LOCAL_ONLY if local_only else []), "install", target)


def test_kept_files_are_planned_and_installed_without_the_repositories(setup) -> None:
    """Every target a kept .deb: apt runs with no sources, so a stale index cannot send it to a lost file."""
    from agent.guard.apt.backend import AptBackend

    root, host, tool, runner, *_ = setup
    path = _kept_deb(root)
    backend = AptBackend(host, tool, "/var/lib/gpuguard/debs")
    runner.add(_simulate_argv(tool, path, local_only=True), stdout=SIMULATION.replace("localhost", "local-deb"))
    install = tool.argv("apt-get", "-y", "-q", "--allow-downgrades", "--allow-change-held-packages",
                        "--no-install-recommends", *tool._apt_options(), *LOCAL_ONLY, "install", path)
    runner.add(install)
    plan, error = backend.simulate([path])
    assert error is None and [s.package for s in plan] == ["amdgpu-dkms"]
    assert backend.apply([path]) is None
    assert runner.calls == [tuple(_simulate_argv(tool, path, local_only=True)), tuple(install)]


def test_a_local_plan_that_needs_a_repository_falls_back_to_the_repositories(setup) -> None:
    """A rollback from kept .debs that apt cannot plan locally is planned and applied with the repositories too."""
    from agent.guard.apt.backend import AptBackend

    root, host, tool, runner, *_ = setup
    path = _kept_deb(root)
    backend = AptBackend(host, tool, "/var/lib/gpuguard/debs")
    runner.add(_simulate_argv(tool, path, local_only=True), returncode=100,
               stderr="E: Unable to correct problems, you have held broken packages.\n")
    runner.add(_simulate_argv(tool, path, local_only=False), stdout=SIMULATION)
    install = tool.argv("apt-get", "-y", "-q", "--allow-downgrades", "--allow-change-held-packages",
                        "--no-install-recommends", *tool._apt_options(), "install", path)
    runner.add(install)
    plan, error = backend.simulate([path])
    assert error is None and plan
    assert backend.apply([path]) is None
    assert runner.calls[-1] == tuple(install)


def test_repository_targets_are_planned_with_the_repositories(setup) -> None:
    """Rollback targets given as name=version are simulated once, with the repositories."""
    from agent.guard.apt.backend import AptBackend

    _, host, tool, runner, *_ = setup
    backend = AptBackend(host, tool, "/var/lib/gpuguard/debs")
    runner.add(_simulate_argv(tool, f"amdgpu-dkms={D62}", local_only=False), stdout=SIMULATION)
    plan, error = backend.simulate([f"amdgpu-dkms={D62}"])
    assert error is None and runner.calls == [tuple(_simulate_argv(tool, f"amdgpu-dkms={D62}", local_only=False))]


def _recorded_then_changed(setup, small_disk) -> bytes:
    """The known-good set recorded on the small state disk, then rocm-core moved past it: the recorded bytes."""
    root, host, tool, runner, policy, _ = setup
    (root / "var/lib/gpuguard").symlink_to(small_disk)
    for name, version in (("amdgpu-dkms", D62), ("rocm-core", R62)):
        runner.add(tool._download_argv(name, version, "/var/lib/gpuguard/debs"), returncode=100,
                   stderr="E: Version not found")
    assert check(host, Settings(), policy=policy, tool=tool).status == "recorded"
    before = (small_disk / "known-good.json").read_bytes()
    (root / "var/lib/dpkg/status").write_text(_status(D62).replace(R62, "6.2.4.60204-139~12"))
    return before


def _rollback_on_a_full_disk(setup, small_disk, capsys) -> Tuple[int, str]:
    """``guard rollback`` run with the state disk filled: its exit code and what it wrote to stderr."""
    root, host, _, _, _, policy_file = setup
    fill_disk(small_disk / "filler")
    code = main(["guard", "rollback", "--root", str(root), "--policy", str(policy_file), "--config",
                 str(root / "none.toml")], make_host=lambda _root: host, out=io.StringIO())
    return code, capsys.readouterr().err


def test_a_full_disk_while_the_known_good_set_is_written_is_exit_16_and_keeps_it(setup, capsys, small_disk) -> None:
    """A compliant change recorded on a full state disk: guard rollback exits 16 with one line, and the old
    known-good set (and no half-written file) stays."""
    root = setup[0]
    before = _recorded_then_changed(setup, small_disk)
    code, err = _rollback_on_a_full_disk(setup, small_disk, capsys)
    assert code == 16, err
    assert err.splitlines() == [f"gpuguard: error: {root}/var/lib/gpuguard/known-good.before-change.json: cannot be "
                                f"written (No space left on device): the old file is kept"]
    assert (small_disk / "known-good.json").read_bytes() == before
    assert sorted(p.name for p in small_disk.iterdir() if p.name.startswith(".")) == []


def test_a_database_check_failing_on_a_full_disk_is_exit_16_not_inconsistent(setup, capsys, small_disk) -> None:
    """apt-get check failing while the state disk is full proves nothing of the database: guard rollback exits 16
    naming the state directory (not 10, 'inconsistent ... repair it'), and the old known-good set stays."""
    root, _, tool, runner, *_ = setup
    before = _recorded_then_changed(setup, small_disk)
    runner.add(tool.argv("apt-get", "-q", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=", "check"),
               returncode=100, stderr="E: Write error - write (28: No space left on device)\n")
    code, err = _rollback_on_a_full_disk(setup, small_disk, capsys)
    assert code == 16, err
    (line,) = err.splitlines()
    assert line.startswith(f"gpuguard: error: {root}/var/lib/gpuguard: cannot be written (the disk is full; the "
                           "package database could not be verified (apt-get check: "), line
    assert (small_disk / "known-good.json").read_bytes() == before
