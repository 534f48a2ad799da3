"""The Debian 12 -> 13 release upgrade of a host that gpuguard guards, with real apt as the Debian 13 release notes
describe it: the guard must still be installed, guarding and running on Python 3.13 afterwards.

A minbase bookworm chroot (the guard tests' harness) gets the debian12 .deb, the fake GPU stack and a frozen
policy with its pins; its sources then move to trixie (the Debian mirror, plus the local repository that offers a
Debian 13 kernel through a ``linux-image-amd64`` meta package), and the operator runs ``apt-get upgrade
--without-new-pkgs`` then ``full-upgrade`` (python3 moves to 3.13; the pins hold the GPU stack and the kernel),
then installs the new kernel: the hook refuses it, the operator opens an override window as the refusal says and
installs it. With the 0.1.0 package (``python3 (<< 3.12)``, one vendored Python) the full-upgrade removed gpuguard.
It downloads a release's worth of base packages from the mirror: marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, Iterator

import pytest

from tests.guard.apt.chroot.harness import (
    BASELINE,
    KERNEL_26,
    ROCM_63,
    Chroot,
    FakePackage,
    debian_mirror,
)
from tests.packaging.chroots import ok, packaging_chroot

pytestmark = [pytest.mark.chroot, pytest.mark.slow, pytest.mark.timeout(2400)]

NEW_KERNEL = "linux-image-6.12.48+deb13-amd64"
# The new meta has an epoch so that apt takes it, not the mirror's trixie linux-image-amd64 (a real kernel: 100 MB,
# and an initramfs built in the chroot); the old one is older than bookworm's.
META_OLD, META_NEW = "6.1.112-1", "1:6.12.48-1"


def kernel_packages(arch: str) -> list:
    """The kernel meta package of each release: bookworm's pulls the installed 6.1 kernel, trixie's a new 6.12."""
    return [FakePackage("linux-image-amd64", META_OLD, arch, f"{KERNEL_26} (>= 6.1.112-1)"),
            FakePackage(NEW_KERNEL, "6.12.48-1", arch),
            FakePackage("linux-image-amd64", META_NEW, arch, f"{NEW_KERNEL} (>= 6.12.48-1)")]


@pytest.fixture(scope="module")
def bookworm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    with packaging_chroot(tmp_path_factory, "upgrade", packages=kernel_packages) as chroot:  # the local repo only
        yield chroot


def sources(chroot: Chroot, suite: str) -> None:
    """The local repository and the Debian mirror's ``suite`` (main), as an operator's sources.list."""
    (chroot.root / "etc/apt/sources.list").write_text(
        f"deb [trusted=yes] file:/srv/repo ./\ndeb {debian_mirror()} {suite} main\n")
    ok(chroot.run("apt-get", "update", "-q", timeout_seconds=900))


def upgrade_step(chroot: Chroot, *args: str) -> subprocess.CompletedProcess:
    return chroot.run("apt-get", "-y", "-q", "-o", "Dpkg::Use-Pty=0", "-o", "Dpkg::Options::=--force-confdef",
                      "-o", "Dpkg::Options::=--force-confold", *args, timeout_seconds=1800)


def test_debian12_to_13_keeps_gpuguard_installed_guarding_and_running(
        bookworm: Chroot, built: Callable[[str], Dict[str, Path]]) -> None:
    """After the documented upgrade gpuguard is installed, snapshot and policy compile run on 3.13, the hook refuses
    a violating transaction, and `gpuguard run` starts."""
    c = bookworm
    root = c.root
    started = time.monotonic()
    deb = built("debian12")["gpuguard"]
    (root / "srv/pkgs").mkdir(parents=True, exist_ok=True)
    shutil.copy2(deb, root / "srv/pkgs" / deb.name)

    # --- Debian 12 with gpuguard, the GPU stack and a frozen policy ---------------------------------------------
    sources(c, "bookworm")
    ok(c.apt("install", f"/srv/pkgs/{deb.name}", *(f"{n}={v}" for n, v in BASELINE.items()),
             f"linux-image-amd64={META_OLD}"))
    ok(c.run("gpuguard", "policy", "freeze", "--output", "/etc/gpuguard/policy.d/50-freeze.toml"))
    ok(c.run("gpuguard", "policy", "compile"))
    ok(c.run("gpuguard", "pin", "apply"))  # as policy freeze says: the GPU stack held at its builds
    assert ok(c.run("python3", "--version")).startswith("Python 3.11")

    # --- the release notes' procedure: sources to trixie, upgrade --without-new-pkgs, full-upgrade --------------
    sources(c, "trixie")
    ok(upgrade_step(c, "upgrade", "--without-new-pkgs"))
    out = ok(upgrade_step(c, "full-upgrade"))  # the pins hold the GPU stack and the kernel meta package
    assert "REFUSED" not in out, out[-4000:]
    assert c.installed().get("gpuguard", "").startswith("0.1.0"), "the release upgrade removed gpuguard"
    # The operator moves the kernel deliberately: refused (not in the frozen kernels), then through a window.
    new_kernel = (f"linux-image-amd64={META_NEW}", f"{NEW_KERNEL}=6.12.48-1")  # named: the pins hold both back
    refused = upgrade_step(c, "install", *new_kernel)
    out = refused.stdout + refused.stderr
    assert refused.returncode == 100 and NEW_KERNEL in out and "REFUSED (kernel.allow)" in out, out[-4000:]
    assert "self-protection" not in out, out[-4000:]
    ok(c.run("gpuguard", "override", "start", "--minutes", "120", "--reason", "Debian 13 release upgrade"))
    out = ok(upgrade_step(c, "install", *new_kernel))
    assert "override window" in out
    assert ok(c.run("python3", "--version")).startswith("Python 3.13")
    assert (root / "etc/debian_version").read_text().startswith("13")
    assert c.installed().get("gpuguard", "").startswith("0.1.0"), "the release upgrade removed gpuguard"
    assert c.installed()[NEW_KERNEL] == "6.12.48-1"
    ok(c.run("gpuguard", "override", "end"))
    upgrade_minutes = (time.monotonic() - started) / 60

    # --- afterwards, on Python 3.13: snapshot, policy compile, the hook refusing, the daemon starting ------------
    result = c.run("gpuguard", "snapshot", "--json")
    ok(result)
    assert json.loads(result.stdout)["os"]["data"]["version_id"] == "13"
    ok(c.run("gpuguard", "policy", "compile"))
    before = c.status_bytes()
    refused = c.apt("install", f"rocm-core={ROCM_63}")
    assert refused.returncode == 100 and c.status_bytes() == before, refused.stdout + refused.stderr
    assert "REFUSED" in refused.stderr

    daemon = subprocess.Popen(["chroot", str(root), "gpuguard", "run"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = daemon.stderr.readline() if daemon.stderr else ""
            if not line:
                break
            lines.append(line)
            if '"daemon_started"' in line:
                break
        assert any('"daemon_started"' in x for x in lines), "".join(lines[-30:])
    finally:
        if daemon.poll() is None:
            os.kill(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(daemon.pid, signal.SIGKILL)
                daemon.wait(10)
    print(f"release upgrade took {upgrade_minutes:.1f} min")
