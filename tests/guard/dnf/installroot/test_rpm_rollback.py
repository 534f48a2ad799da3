"""Real dnf4 and rpm in an installroot: a forced rpm violation is rolled back, versionlock pins hold, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from agent.config import Settings
from agent.guard.dnf.versionlock import BEGIN, END
from tests.guard.dnf.installroot.harness import (
    AMDGPU_62,
    AMDGPU_63,
    KERNEL_427,
    KERNEL_570,
    ROCM_62,
    ROCM_63,
    TEST_POLICY,
    Installroot,
)
from tests.guard.dnf.installroot.rollback_support import (
    agent_config,
    backend_for_root,
    cached_rpms,
    cli,
    dnf_vl,
    drop_from_repo,
    enable_versionlock,
    events,
    restore_repo,
)
from tests.guard.wiring import check

pytestmark = pytest.mark.timeout(120)


def _check(root: Installroot, **kwargs):
    backend = backend_for_root(root)
    kwargs.setdefault("snapshot", lambda host: None)
    return check(backend.host, Settings(), backend=backend, **kwargs)


@pytest.fixture(scope="session")
def rpm_baseline(installroot_session: Installroot) -> Path:
    """The session baseline plus a recorded known-good set (and its cached .rpm files), saved once."""
    root = installroot_session
    root.restore(root.root.parent / "baseline")
    root.write_plugin_conf()
    root.install_gpuguard(TEST_POLICY)
    result = _check(root)
    assert result.status == "recorded", result.summary()
    saved = root.root.parent / "rpm-baseline"
    root.save(saved)
    return saved


@pytest.fixture
def root(installroot_session: Installroot, rpm_baseline: Path, tmp_path: Path) -> Iterator[Installroot]:
    """The installroot at the baseline with gpuguard's known-good set recorded; the repository restored after."""
    r = installroot_session
    r.restore(rpm_baseline)
    r.write_plugin_conf()
    r.install_gpuguard(TEST_POLICY)
    try:
        yield r
    finally:
        restore_repo(r, tmp_path / "dropped")
        (r.plugin_conf_dir / "versionlock.conf").unlink(missing_ok=True)


def _force(root: Installroot, *args: str) -> None:
    result = root.rpm(*args)
    assert result.returncode == 0, result.stderr


def test_known_good_set_keys_kernels_by_version_and_caches_every_rpm(root: Installroot) -> None:
    """The recorded set keys install-only kernels name@version and keeps one .rpm per package."""
    known_good = json.loads((root.state_dir / "known-good.json").read_text())["packages"]
    assert known_good["rocm-core"]["version"] == ROCM_62 and known_good["amdgpu-dkms"]["version"] == AMDGPU_62
    assert f"kernel-core@{KERNEL_427}" in known_good and f"kernel@{KERNEL_427}" in known_good
    assert all(entry["rpm"] for entry in known_good.values())
    assert len(cached_rpms(root)) == len(known_good)


def test_forced_rpm_upgrade_is_rolled_back_to_the_exact_previous_versions(root: Installroot) -> None:
    """rpm -U --force of ROCm 6.3 under driver 6.2: one dnf transaction restores every previous build."""
    before = root.nevras()
    _force(root, "-U", "--force", root.rpm_path("rocm-core", ROCM_63))
    assert root.installed()["rocm-core"] == ROCM_63
    result = _check(root, snapshot=None)
    assert result.status == "rolled_back", result.summary()
    assert root.nevras() == before
    assert [(s.action, s.package, s.new_version) for s in result.plan] == [("downgrade", "rocm-core", ROCM_62)]
    rollback = [e for e in events(root) if e["kind"] == "rollback"][-1]
    assert rollback["succeeded"] is True and rollback["to_versions"] == {"rocm-core": ROCM_62}
    assert rollback["from_versions"] == {"rocm-core": ROCM_63}
    assert "snapshot after rollback" in rollback["detail"]
    assert any(e["kind"] == "policy_violation" and e["rule"] == "amd.pairing" for e in events(root))
    assert _check(root).status == "compliant"


def test_rollback_works_after_the_repository_dropped_the_old_build(root: Installroot, tmp_path: Path) -> None:
    """The known-good .rpm comes from gpuguard's cache when no repository offers the old build any more."""
    before = root.nevras()
    drop_from_repo(root, Path(root.rpm_path("amdgpu-dkms", AMDGPU_62)).name, tmp_path / "dropped")
    drop_from_repo(root, Path(root.rpm_path("rocm-core", ROCM_62)).name, tmp_path / "dropped")
    offered = root.dnf("repoquery", "--qf", "%{name}-%{evr}", "amdgpu-dkms", "rocm-core", plugin=False).stdout
    assert "6.8.5.60202" not in offered and "6.2.2.60202" not in offered and "6.3.0.60300" in offered
    # driver and ROCm 6.3 together are an allowed pairing, but not with the 570 kernel forced in beside them
    _force(root, "-U", "--force", root.rpm_path("amdgpu-dkms", AMDGPU_63), root.rpm_path("rocm-core", ROCM_63))
    _force(root, "-i", "--force", root.rpm_path("kernel-core", KERNEL_570), root.rpm_path("kernel", KERNEL_570))
    result = _check(root)
    assert result.status == "rolled_back", result.summary()
    assert {v.rule for v in result.violations} == {"amd.pairing.kernels"}
    files = [t for t in result.targets if t.startswith("install /")]
    assert len(files) == 2 and all("/var/lib/gpuguard/rpms/" in t and t.endswith(".rpm") for t in files)
    assert root.nevras() == before


def test_forced_unsupported_kernel_is_removed_and_a_reboot_flagged(root: Installroot) -> None:
    """rpm -i --force of a kernel the pinned pairing does not support: that kernel goes, the old one stays."""
    before = root.nevras()
    _force(root, "-i", "--force", root.rpm_path("kernel-core", KERNEL_570), root.rpm_path("kernel", KERNEL_570))
    assert f"kernel@{KERNEL_570}" in root.installed()
    result = _check(root)
    assert result.status == "rolled_back", result.summary()
    assert sorted(result.targets) == [f"remove kernel-{KERNEL_570}.x86_64", f"remove kernel-core-{KERNEL_570}.x86_64"]
    assert root.nevras() == before
    assert result.reboot_required
    assert "kernel" in (root.state_dir / "reboot-required.pkgs").read_text().split()


def test_dry_run_plans_with_assumeno_and_changes_nothing(root: Installroot) -> None:
    """A dry run resolves the rollback (dnf --assumeno) and leaves the rpm database byte-identical."""
    _force(root, "-U", "--force", root.rpm_path("rocm-core", ROCM_63))
    rpmdb = root.rpmdb_bytes()
    result = _check(root, dry_run=True)
    assert result.status == "planned", result.summary()
    assert "plan: downgrade rocm-core" in result.summary()
    assert root.rpmdb_bytes() == rpmdb


def test_the_gpuguard_dnf_plugin_checks_the_rollback_transaction(root: Installroot) -> None:
    """The rollback runs through the gpuguard dnf plugin: with a checker that fails, nothing is run (fail-closed)."""
    _force(root, "-U", "--force", root.rpm_path("rocm-core", ROCM_63))
    rpmdb = root.rpmdb_bytes()
    root.write_plugin_conf(checker="/bin/false")
    result = _check(root)
    assert result.status == "failed" and "dnf could not plan the rollback" in result.detail, result.summary()
    assert root.rpmdb_bytes() == rpmdb
    assert [e for e in events(root) if e["kind"] == "rollback"][-1]["succeeded"] is False


def test_cli_rollback_with_dnf_options_from_the_config(root: Installroot) -> None:
    """gpuguard guard rollback --root rolls back with [guard] dnf_options and exits 0."""
    before = root.nevras()
    _force(root, "-U", "--force", root.rpm_path("rocm-core", ROCM_63))
    code, out = cli(root, "guard", "rollback", config=agent_config(root))
    assert code == 0, out
    assert "guard: rolled_back" in out and root.nevras() == before


def test_a_violation_without_a_known_good_set_is_reported_not_recorded(root: Installroot) -> None:
    """No known-good set yet and the host violates the policy: exit 10, nothing recorded, as on apt."""
    (root.state_dir / "known-good.json").unlink()
    _force(root, "-U", "--force", root.rpm_path("rocm-core", ROCM_63))
    code, out = cli(root, "guard", "rollback", config=agent_config(root))
    assert code == 10 and "guard: no_known_good" in out
    assert not (root.state_dir / "known-good.json").exists() and root.installed()["rocm-core"] == ROCM_63


def test_rollback_is_refused_while_an_override_window_is_open(root: Installroot) -> None:
    """An open maintenance window: the violation is reported (exit 10), the packages stay."""
    code, _ = cli(root, "override", "start", "--minutes", "10", "--reason", "driver test")
    assert code == 0
    _force(root, "-U", "--force", root.rpm_path("rocm-core", ROCM_63))
    code, out = cli(root, "guard", "rollback", config=agent_config(root))
    assert code == 10 and "override" in out
    assert root.installed()["rocm-core"] == ROCM_63


def test_pin_apply_writes_versionlock_and_dnf_keeps_the_pinned_build(root: Installroot) -> None:
    """pin apply locks the frozen package and excludes the unsupported kernel; dnf itself then refuses both;
    the operator's entries stay and gpuguard's stale one goes."""
    policy = TEST_POLICY + '\n[frozen]\npackages = ["rocm-core"]\n'
    root.install_gpuguard(policy)
    conf = enable_versionlock(root)
    locklist = root.root / "etc/dnf/plugins/versionlock.list"
    operator = "# the operator's own lock\nhello-fake-0:1.0-1.*\n"
    locklist.write_text(operator + f"\n{BEGIN}\n!stale-package-0:1-1.*\n{END}\n")
    code, out = cli(root, "pin", "apply", config=agent_config(root))
    assert code == 0, out
    text = locklist.read_text()
    assert text.startswith(operator) and "stale-package" not in text and "- !stale-package-0:1-1.*" in out
    assert f"rocm-core-0:{ROCM_62}.*" in text
    assert f"!kernel-core-0:{KERNEL_570}.*" in text and f"!kernel-0:{KERNEL_570}.*" in text
    assert "5.14.0-503" not in text  # allowed by the policy: not excluded
    # the 6.3 driver is in an allowed pairing, but not beside the ROCm 6.2 installed now: the hook would refuse it
    assert f"!amdgpu-dkms-{AMDGPU_63}.*" in text
    upgrade = dnf_vl(root, conf, "-y", "upgrade", "rocm-core")
    assert upgrade.returncode == 0 and "Nothing to do" in upgrade.stdout, upgrade.stdout + upgrade.stderr
    kernel = dnf_vl(root, conf, "-y", "install", f"kernel-{KERNEL_570}")
    assert kernel.returncode != 0 and "filtered out by exclude filtering" in kernel.stdout + kernel.stderr
    assert root.installed()["rocm-core"] == ROCM_62 and f"kernel@{KERNEL_570}" not in root.installed()
    unlocked = dnf_vl(root, conf, "--assumeno", "--disableplugin=versionlock", "upgrade", "rocm-core")
    assert ROCM_63.split(":")[-1] in unlocked.stdout  # the lock, not an empty repository, held it
    code, out = cli(root, "pin", "apply", config=agent_config(root))
    assert code == 0 and out.startswith("unchanged") and locklist.read_text() == text


def test_rollback_removes_a_forced_kernel_that_versionlock_excludes(root: Installroot) -> None:
    """With gpuguard's versionlock entries active, the rollback transaction still removes the excluded kernel."""
    conf = enable_versionlock(root)
    code, out = cli(root, "pin", "apply", config=agent_config(root))
    assert code == 0 and f"kernel-core-0:{KERNEL_570}" in out
    before = root.nevras()
    _force(root, "-i", "--force", root.rpm_path("kernel-core", KERNEL_570), root.rpm_path("kernel", KERNEL_570))
    backend = backend_for_root(root)
    backend.tool.options = ["-c", str(conf), "--releasever=9"]
    result = check(backend.host, Settings(), backend=backend, snapshot=lambda host: None)
    assert result.status == "rolled_back", result.summary()
    assert root.nevras() == before


# --- bad input behaves exactly as on apt ---------------------------------------------------------------------


def _dpkg_root(tmp_path: Path, root: Installroot) -> Path:
    """A dpkg host with the same policy and state files as the installroot, for side-by-side comparison."""
    dpkg = tmp_path / "dpkg-root"
    (dpkg / "var/lib/dpkg").mkdir(parents=True)
    (dpkg / "var/lib/dpkg/status").write_text(
        f"Package: rocm-core\nStatus: install ok installed\nArchitecture: amd64\nVersion: {ROCM_62}\n\n")
    shutil.copytree(root.root / "etc/gpuguard", dpkg / "etc/gpuguard")
    shutil.copytree(root.state_dir, dpkg / "var/lib/gpuguard")
    return dpkg


def _same_as_apt(root: Installroot, dpkg: Path, capsys, *argv: str) -> tuple:
    from agent.cli import main

    code, _ = cli(root, *argv)
    rpm_err = capsys.readouterr().err.replace(str(root.root), "<root>")
    apt_code = main([*argv, "--root", str(dpkg), "--config", "/nonexistent/agent.toml"])
    apt_err = capsys.readouterr().err.replace(str(dpkg), "<root>")
    assert (code, rpm_err) == (apt_code, apt_err)
    assert len(rpm_err.strip().splitlines()) == 1 and "Traceback" not in rpm_err
    return code, rpm_err


def test_corrupt_known_good_state_is_exit_4_in_one_line_as_on_apt(root: Installroot, tmp_path: Path,
                                                                    capsys) -> None:
    """A corrupt known-good file: the same one line and exit 4 on the rpm host as on a dpkg host."""
    (root.state_dir / "known-good.json").write_text('{"format": 1, "packages": [1, 2]}')
    code, err = _same_as_apt(root, _dpkg_root(tmp_path, root), capsys, "guard", "rollback")
    assert code == 4 and err.startswith("gpuguard: error: ") and "corrupt known-good state" in err


def test_missing_compiled_policy_is_the_same_error_as_on_apt(root: Installroot, tmp_path: Path, capsys) -> None:
    """No policy files and no compiled policy: the same one-line error and exit code as on apt."""
    shutil.rmtree(root.root / "etc/gpuguard/policy.d")
    (root.state_dir / "policy.compiled.json").unlink()
    code, err = _same_as_apt(root, _dpkg_root(tmp_path, root), capsys, "guard", "rollback")
    assert code == 4 and "policy.compiled.json" in err


def test_malformed_policy_is_the_same_error_as_on_apt(root: Installroot, tmp_path: Path, capsys) -> None:
    """A policy file that is not valid TOML: pin apply and rollback fail as on apt, before any dnf command."""
    (root.root / "etc/gpuguard/policy.d/10-test.toml").write_text("[policy\nname = 1\n")
    dpkg = _dpkg_root(tmp_path, root)
    for argv in (("guard", "rollback"), ("pin", "apply")):
        code, err = _same_as_apt(root, dpkg, capsys, *argv)
        assert code == 3 and "10-test.toml" in err


def test_one_daemon_guard_tick_rolls_back_rpm_u_and_queues_the_events(root: Installroot, tmp_path: Path) -> None:
    """The daemon's guard job on an rpm host (backend picked from the rpmdb) rolls back and queues the events."""
    from agent.config import Settings as AgentSettings
    from agent.daemon_jobs.guard import GuardJob
    from agent.daemon_jobs.guard_events import GuardEventForwarder
    from tests.daemon.test_jobs import make_runtime
    from tests.guard.dnf.installroot.rollback_support import host_for

    before = root.nevras()
    _force(root, "-U", "--force", root.rpm_path("rocm-core", ROCM_63))
    settings = AgentSettings.model_validate({"guard": {"dnf_options": ["-c", str(root.dnf_conf), "--releasever=9"],
                                                       "lock_timeout_seconds": 5}})
    rt = make_runtime(tmp_path, host_for(root), settings)
    job = GuardJob(rt, GuardEventForwarder(rt, str(root.state_dir / "guard-events.jsonl")).run)
    try:
        job.run("package_change")
        assert root.nevras() == before
        rollback = [e for e in rt.outbox.pending(1000) if e.kind == "rollback"][-1]
        assert rollback.payload.succeeded and rollback.payload.to_versions == {"rocm-core": ROCM_62}
    finally:
        rt.outbox.close()
