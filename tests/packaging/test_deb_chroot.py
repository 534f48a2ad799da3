"""The .deb's whole life in a debootstrap'd Debian 12 chroot: install, snapshot, apt hook, upgrade, remove, purge.

The chroot comes from the guard tests' harness (tests/guard/apt/chroot/harness.py: a cached minbase bookworm with
python3, a local repository of fake GPU packages); proc and devpts are mounted and always unmounted. No systemd
runs there: a fake ``systemctl`` on PATH records what the maintainer scripts ask of it, and /run/systemd/system is
created for the steps that play "systemd is running" (minbase has no systemd, so /usr/bin/systemctl is free).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.guard.apt.chroot.harness import AMDGPU_62, BASELINE, ROCM_63, TEST_POLICY, Chroot
from tests.packaging.chroots import ok, packaging_chroot
from tests.packaging.conftest import UPGRADE_VERSION

HOOK_CONF = "etc/apt/apt.conf.d/50gpuguard"


@pytest.fixture(scope="module")
def deb_chroot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    with packaging_chroot(tmp_path_factory, "pkgchroot", download=("procps",)) as chroot:
        yield chroot


def systemctl_calls(chroot: Chroot) -> List[str]:
    """What the maintainer scripts asked systemctl since the last call (the log is emptied)."""
    log = chroot.root / "var/log/fake-systemctl.log"
    if not log.exists():
        return []
    calls = log.read_text().splitlines()
    log.unlink()
    return calls


def stage(chroot: Chroot, deb: Path) -> str:
    (chroot.root / "srv/pkgs").mkdir(parents=True, exist_ok=True)
    shutil.copy2(deb, chroot.root / "srv/pkgs" / deb.name)
    return f"/srv/pkgs/{deb.name}"


def refused_rocm_upgrade(chroot: Chroot) -> str:
    """apt-get install rocm-core 6.3 with driver 6.2: the policy's pairing is broken, so the hook must refuse."""
    before = chroot.status_bytes()
    result = chroot.apt("install", f"rocm-core={ROCM_63}")
    assert result.returncode == 100, result.stdout + result.stderr
    assert chroot.status_bytes() == before, "dpkg ran although the hook refused"
    return result.stdout + result.stderr


@pytest.mark.chroot
@pytest.mark.timeout(600)
def test_deb_install_snapshot_hook_upgrade_remove_purge(deb_chroot: Chroot, debian12: Dict[str, Path],
                                                         debian12_upgrade: Path) -> None:
    """The .deb installs without systemd, works from its own files, upgrades keeping config and state, and goes."""
    c = deb_chroot
    root = c.root
    first, second = stage(c, debian12["gpuguard"]), stage(c, debian12_upgrade)

    # --- install in a chroot without systemd: enabled (offline), nothing started ------------------------------
    out = ok(c.apt("install", first))
    assert "no policy in /etc/gpuguard/policy.d yet" in out
    assert "warning" not in out, out
    assert systemctl_calls(c) == ["--no-reload enable gpuguard.service"]
    state = root / "var/lib/gpuguard"
    assert stat.S_IMODE(state.stat().st_mode) == 0o750
    assert list((root / "usr/lib/gpuguard/agent").glob("__pycache__/cli.cpython-311.pyc")), "postinst compiled nothing"
    assert (root / HOOK_CONF).is_file()

    # --- the installed command: a snapshot of the chroot from inside it ---------------------------------------
    result = c.run("gpuguard", "snapshot", "--json")
    ok(result)
    snap = json.loads(result.stdout)
    assert snap["os"]["data"]["id"] == "debian" and snap["os"]["data"]["version_id"] == "12"
    assert snap["agent_version"] == "0.1.0"

    # --- a policy, then apt through the installed hook: allowed baseline, refused violation -------------------
    (root / "etc/gpuguard/policy.d/10-test.toml").write_text(TEST_POLICY)
    ok(c.run("gpuguard", "policy", "compile"))
    ok(c.apt("install", *(f"{n}={v}" for n, v in BASELINE.items())))
    assert "REFUSED" in refused_rocm_upgrade(c)

    # --- the operator edits the config; state accumulates; then an upgrade while "systemd runs" ---------------
    config = root / "etc/gpuguard/agent.toml"
    config.write_text(config.read_text().replace('# log_level = "info"', 'log_level = "warning"'))
    edited = config.read_text()
    (state / "operator-note").write_text("kept\n")
    (root / "run/systemd/system").mkdir(parents=True)
    out = ok(c.apt("install", second))
    assert "gpuguard: warning" not in out, out  # policy compiled and pinned by postinst, bytecode built
    assert config.read_text() == edited, "the upgrade overwrote the operator's config"
    assert (state / "operator-note").read_text() == "kept\n"
    assert (state / "policy.compiled.json").is_file()
    calls = systemctl_calls(c)
    assert "try-restart gpuguard.service" in calls and not any("enable" in call for call in calls), calls
    assert "daemon-reload" not in calls, calls  # the same unit: no reload (docs/packaging.md)
    assert ok(c.run("gpuguard", "--version")).strip() == f"gpuguard {UPGRADE_VERSION}"
    assert "REFUSED" in refused_rocm_upgrade(c)

    # --- remove: refused as gpuguard's own removal until the operator opens a window that allows it -------------
    before = c.status_bytes()
    ok(c.run("gpuguard", "override", "start", "--minutes", "30", "--reason", "new kernel"))
    result = c.apt("remove", "gpuguard")
    assert result.returncode == 100 and c.status_bytes() == before, result.stdout + result.stderr
    assert "REFUSED (self-protection): this transaction removes gpuguard itself" in result.stderr
    assert "does not cover removing gpuguard" in result.stderr  # the kernel's window lets nothing of it through
    ok(c.run("gpuguard", "override", "start", "--minutes", "30", "--allow-self-removal", "--reason", "decommission"))

    # --- remove: unit stopped and disabled, hook config set aside, apt keeps working ---------------------------
    out = ok(c.apt("remove", "gpuguard"))
    assert "opened with --allow-self-removal" in out, out
    audit = (state / "audit.log").read_text()
    assert '"rule":"self-protection"' in audit.replace(" ", "") and '"allow_self_removal":true' in audit.replace(
        " ", ""), audit[-2000:]
    calls = systemctl_calls(c)
    assert "stop gpuguard.service" in calls and "--no-reload disable gpuguard.service" in calls, calls
    assert "daemon-reload" not in calls, calls
    assert not (root / "usr/lib/gpuguard").exists(), "files (bytecode?) left in /usr/lib/gpuguard"
    assert not (root / HOOK_CONF).exists() and (root / (HOOK_CONF + ".dpkg-remove")).is_file()
    assert config.read_text() == edited and (state / "operator-note").is_file()
    out = ok(c.apt("install", "hello-fake"))
    assert "gpuguard" not in out, out
    assert c.installed()["hello-fake"] == "1.0-1"

    # --- reinstall: the hook config comes back and guards again; the unit is enabled again ---------------------
    ok(c.apt("install", second))
    ok(c.run("gpuguard", "override", "end"))  # the windows opened for the removal (state outlives the package)
    assert (root / HOOK_CONF).is_file() and not (root / (HOOK_CONF + ".dpkg-remove")).exists()
    assert {"--no-reload enable gpuguard.service", "start gpuguard.service"} <= set(systemctl_calls(c))
    assert "REFUSED" in refused_rocm_upgrade(c)

    # --- purge: state, config and hook config gone; apt still works ---------------------------------------------
    ok(c.run("gpuguard", "override", "start", "--minutes", "15", "--allow-self-removal", "--reason", "purge"))
    ok(c.apt("purge", "gpuguard"))
    for gone in ("var/lib/gpuguard", "etc/gpuguard", HOOK_CONF, HOOK_CONF + ".dpkg-remove", "usr/bin/gpuguard"):
        assert not (root / gone).exists(), gone
    ok(c.apt("install", f"rocm-core={ROCM_63}", f"amdgpu-dkms={AMDGPU_62}"))
    assert c.installed()["rocm-core"] == ROCM_63


@pytest.mark.chroot
@pytest.mark.timeout(300)
def test_hub_deb_serves_from_its_vendored_packages(deb_chroot: Chroot, debian12: Dict[str, Path]) -> None:
    """gpuguard-hub installs beside gpuguard and `gpuguard hub serve` answers /healthz from the installed files."""
    c = deb_chroot
    shutil.rmtree(c.root / "run/systemd", ignore_errors=True)  # no systemd running in this test
    systemctl_calls(c)
    ok(c.apt("install", stage(c, debian12["gpuguard"]), stage(c, debian12["gpuguard-hub"])))
    calls = systemctl_calls(c)
    assert "--no-reload enable gpuguard-hub.service" in calls, calls
    assert not any(call.startswith("start") for call in calls), calls
    (c.root / "etc/gpuguard/hub-test.toml").write_text(
        'listen_port = 0\ndatabase_url = "sqlite:////var/lib/gpuguard/hub-test.db"\n')
    token = ok(c.run("gpuguard", "hub", "add-host", "node-1", "--config", "/etc/gpuguard/hub-test.toml")).split()[0]
    assert len(token) >= 20

    hub = subprocess.Popen(["chroot", str(c.root), "gpuguard", "hub", "serve", "--config",
                            "/etc/gpuguard/hub-test.toml"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True,
                           env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
    lines: List[str] = []
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = hub.stderr.readline()
            if not line:
                break
            lines.append(line)
            if '"hub_listening"' in line:
                port = json.loads(line)["port"]
        assert port, "".join(lines[-20:])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
            assert response.status == 200 and json.loads(response.read())["status"] == "ok"
    finally:
        if hub.poll() is None:
            os.kill(hub.pid, signal.SIGTERM)
            try:
                hub.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(hub.pid, signal.SIGKILL)
                hub.wait(10)
    assert hub.returncode == 0, "".join(lines[-20:])
    ok(c.run("gpuguard", "override", "start", "--minutes", "15", "--allow-self-removal", "--reason", "test"))
    ok(c.apt("purge", "gpuguard-hub", "gpuguard"))
    assert not (c.root / "usr/lib/gpuguard").exists() and not (c.root / "var/lib/gpuguard").exists()
