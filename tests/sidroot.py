"""One Debian sid root for the tests that need what only sid carries: dnf5 with its actions plugin, rpm 6 and
createrepo_c (tests/guard/dnf/dnf5/), and AMD's and NVIDIA's real management libraries on a host without their
drivers (tests/collectors/sid/).

How to use it::

    base = build_base(tmp / "root", use_cache=not needs.IN_CI)   # debootstrap + apt-get install, or unpack a copy
    root = SidRoot(tmp / "root")
    root.mount()                                                  # /proc (dnf5, apt and python need it)
    root.run("python3", "-c", "import amdsmi")                    # chroot ROOT ...; CompletedProcess
    root.unmount()

The root is ``debootstrap --variant=minbase sid`` followed by ``apt-get install --no-install-recommends`` of
:data:`PACKAGES` inside it (debootstrap alone cannot order sid's pre-dependencies: python3-minimal and the nvidia
alternatives failed to unpack with ``--include``). Sources are main, contrib (glx-alternative-nvidia, which
libnvidia-ml1 needs) and non-free (libnvidia-ml1); ``Acquire::Check-Valid-Until=false`` because the mirror's sid
Release file may have expired. Both suites share one root so CI pays for one sid bootstrap, not two.

It is built once per test process: the finished root is kept as a tarball, under /var/tmp/gpuguard-test-cache
(keyed by a hash of its inputs) locally, and in a private temp dir for the life of the process in CI (CI=true),
where each run must really bootstrap. Each suite unpacks its own copy (a few seconds) and owns it.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from tests.mountedroot import MountedRoot

SUITE = "sid"
COMPONENTS = ("main", "contrib", "non-free")
PACKAGES = (
    # dnf5 tests: dnf5 (libdnf5-2 carries the actions plugin), rpm 6 with rpmbuild, createrepo_c
    "dnf5", "createrepo-c", "rpm", "file",
    # the agent itself, run inside the root: the hook needs only python3; the CLI needs pydantic and structlog
    "python3", "python3-pydantic", "python3-structlog",
    # real GPU libraries without a driver
    "amd-smi", "libamd-smi27", "libnvidia-ml1",
)
HARNESS_VERSION = 1  # bump when the build steps change
CACHE_DIR = Path(os.environ.get("GPUGUARD_TEST_CACHE", "/var/tmp/gpuguard-test-cache"))
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8",
       "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root"}
APT_OPTIONS = ("-o", "Acquire::Check-Valid-Until=false", "-o", "Acquire::Languages=none", "-q")


def run(argv: Sequence[str], timeout_seconds: float = 300, check: bool = True,
        env: Optional[Mapping[str, str]] = None, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_seconds,
                            env=dict(env if env is not None else ENV), stdin=subprocess.DEVNULL, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: "
                           f"{(result.stdout + result.stderr).strip()[-2000:]}")
    return result


def missing_tools() -> List[str]:
    return [tool for tool in ("debootstrap", "chroot", "mount", "umount", "tar") if shutil.which(tool) is None]


def debian_mirror() -> str:
    """The Debian archive this machine's apt uses (the same archive serves sid)."""
    from tests.guard.apt.chroot.harness import debian_mirror as bookworm_mirror

    return bookworm_mirror()


def _cache_key(mirror: str) -> str:
    blob = json.dumps({"suite": SUITE, "mirror": mirror, "components": COMPONENTS, "packages": PACKAGES,
                       "variant": "minbase", "harness": HARNESS_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_PROCESS_TARBALLS: Dict[str, Path] = {}


def _forget_process_tarballs() -> None:
    for tarball in _PROCESS_TARBALLS.values():
        shutil.rmtree(tarball.parent, ignore_errors=True)
    _PROCESS_TARBALLS.clear()


atexit.register(_forget_process_tarballs)


def _unpack(tarball: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    run(["tar", "-xf", str(tarball), "-C", str(target), "--numeric-owner"], timeout_seconds=600)


def _bootstrap(target: Path, mirror: str) -> Dict[str, float]:
    timings: Dict[str, float] = {}
    started = time.monotonic()
    run(["debootstrap", "--variant=minbase", SUITE, str(target), mirror], timeout_seconds=1200)
    timings["debootstrap_seconds"] = round(time.monotonic() - started, 1)
    (target / "etc/apt/sources.list").write_text(f"deb {mirror} {SUITE} {' '.join(COMPONENTS)}\n")
    root = SidRoot(target)
    root.mount()
    try:
        started = time.monotonic()
        root.run("apt-get", *APT_OPTIONS, "update", check=True, timeout_seconds=600)
        root.run("apt-get", *APT_OPTIONS, "install", "-y", "--no-install-recommends", *PACKAGES, check=True,
                 timeout_seconds=1200)
        root.run("apt-get", "clean", check=True)
        timings["apt_install_seconds"] = round(time.monotonic() - started, 1)
    finally:
        root.unmount()
    return timings


def build_base(target: Path, use_cache: bool) -> Dict[str, float]:
    """Make ``target`` a sid root with :data:`PACKAGES`: unpack a kept tarball, or bootstrap one and keep it."""
    mirror = debian_mirror()
    key = _cache_key(mirror)
    tarball = CACHE_DIR / f"sid-minbase-{key}.tar"
    started = time.monotonic()
    kept = _PROCESS_TARBALLS.get(key) or (tarball if use_cache and tarball.is_file() else None)
    if kept is not None:
        _unpack(kept, target)
        return {"unpack_seconds": round(time.monotonic() - started, 1)}
    timings = _bootstrap(target, mirror)
    if use_cache:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".tar.partial")
        run(["tar", "-cf", str(partial), "-C", str(target), "--numeric-owner", "."], timeout_seconds=600)
        partial.replace(tarball)
        _PROCESS_TARBALLS[key] = tarball
    else:
        keep = Path(tempfile.mkdtemp(prefix="gpuguard-sid-"))
        run(["tar", "-cf", str(keep / "sid.tar"), "-C", str(target), "--numeric-owner", "."], timeout_seconds=600)
        _PROCESS_TARBALLS[key] = keep / "sid.tar"
    return timings


class SidRoot(MountedRoot):
    """A sid root: commands inside it (chroot), its mounts."""

    def mount(self) -> None:
        """/proc."""
        self.mount_at("proc", "proc", "-t", "proc")

    def run(self, *argv: str, check: bool = False, timeout_seconds: float = 300,
            env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
        """``chroot ROOT argv`` with a fixed environment (plus ``env``)."""
        return run(["chroot", str(self.root), *argv], timeout_seconds=timeout_seconds, check=check,
                   env={**ENV, **(env or {})})

    def path(self, inside: str) -> Path:
        """Where a path inside the root lives on this machine."""
        return self.root / inside.lstrip("/")

    def install_agent(self, lib: str = "/usr/lib/gpuguard") -> Path:
        """This checkout's agent/ tree at ``lib`` inside the root, with gpuguard's knowledge tables at
        /usr/share/gpuguard/knowledge, as the package installs them; the agent's host path."""
        repo = Path(__file__).resolve().parents[1]
        target = self.path(lib)
        shutil.rmtree(target / "agent", ignore_errors=True)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copytree(repo / "agent", target / "agent", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copytree(repo / "policies/knowledge", self.path("/usr/share/gpuguard/knowledge"), dirs_exist_ok=True)
        return target
