"""The packaging tests' Debian chroots: one set-up for the package's life on Debian 12, on Debian 13, on sid's
Python 3.14 (Ubuntu 26.04's) and across the release upgrade (the guard tests' harness,
tests/guard/apt/chroot/harness.py, underneath).

A chroot here is a cached minbase of ``suite`` with python3 and the harness's local repository of fake GPU packages
(plus the packages given), a fake ``systemctl`` on apt's PATH that records what the maintainer scripts ask of it
(minbase has no systemd, so /usr/bin/systemctl is free), and proc and devpts mounted: always unmounted again, and
checked to leave no mount behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Callable, Iterator, Sequence

import pytest

from tests import needs
from tests.guard.apt.chroot.harness import SUITE, Chroot, FakePackage, build_base, build_deb, missing_tools
from tests.packaging.conftest import unavailable

FAKE_SYSTEMCTL = "#!/bin/sh\necho \"$*\" >> /var/log/fake-systemctl.log\nexit 0\n"


@contextlib.contextmanager
def packaging_chroot(tmp_path_factory: pytest.TempPathFactory, name: str, suite: str = SUITE,
                     download: Sequence[str] = (),
                     packages: Callable[[str], Sequence[FakePackage]] = lambda arch: ()) -> Iterator[Chroot]:
    """A mounted chroot of ``suite`` whose only source is the local repository: the harness's fake GPU packages,
    ``packages(arch)`` (built here for the chroot's architecture) and ``download`` (fetched from the mirror into it
    first, so that apt later resolves the package's dependencies without the network)."""
    if os.geteuid() != 0:
        unavailable("the chroot test must run as root (debootstrap, chroot, mount)")
    missing = missing_tools()
    if missing:
        unavailable(f"missing tools: {', '.join(missing)}")
    base = tmp_path_factory.mktemp(name)
    build_base(base / "root", use_cache=not needs.IN_CI, suite=suite)
    chroot = Chroot(base / "root")
    try:
        chroot.mount()
        chroot.pool.mkdir(parents=True, exist_ok=True)
        if download:
            # sid's Release file on the mirror may have expired (Valid-Until); what is fetched is still signed.
            chroot.run("apt-get", "update", "-q", "-o", "Acquire::Check-Valid-Until=false", check=True,
                       timeout_seconds=600)
            chroot.run("apt-get", "install", "-y", "-q", "--download-only", "--no-install-recommends", *download,
                       check=True, timeout_seconds=600)
            for deb in (chroot.root / "var/cache/apt/archives").glob("*.deb"):
                shutil.move(str(deb), str(chroot.pool / deb.name))
        for pkg in packages(chroot.native_arch):
            build_deb(pkg, chroot.pool, base / "debs")
        chroot.build_repo(base / "debs")
        fake = chroot.root / "usr/bin/systemctl"  # apt runs dpkg with PATH=/usr/sbin:/usr/bin:/sbin:/bin
        fake.write_text(FAKE_SYSTEMCTL)
        fake.chmod(0o755)
        yield chroot
    finally:
        chroot.release(base)


def ok(result: subprocess.CompletedProcess, tail_chars: int = 4000) -> str:
    """A command's output, asserting it succeeded (its last ``tail_chars`` shown when it did not)."""
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-tail_chars:]
    return output


def refused(chroot: Chroot, *args: str) -> str:
    """apt-get ARGS refused by the installed hook before dpkg ran: exit 100, dpkg's status unchanged."""
    before = chroot.status_bytes()
    result = chroot.apt(*args)
    assert result.returncode == 100, result.stdout + result.stderr
    assert chroot.status_bytes() == before, "dpkg ran although the hook refused"
    return result.stdout + result.stderr
