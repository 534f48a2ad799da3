"""Packages built once per session with packaging/build.sh, for the content, lint, systemd and install tests.

Wheel downloads are cached under /var/tmp/gpuguard-test-cache/wheelhouse (the packages themselves are built
fresh every session). Locally a test skips (with the reason) when a tool is missing or it is not root; in CI
(CI=true) it fails instead, so a green CI means the packaging tests really ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, NoReturn, Optional, Sequence

import pytest

from tests import needs

REPO = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("GPUGUARD_TEST_CACHE", "/var/tmp/gpuguard-test-cache"))
WHEELHOUSE = CACHE_DIR / "wheelhouse"
UPGRADE_VERSION = "0.1.1"
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "LANG": "C"}


def unavailable(reason: str) -> NoReturn:
    needs.unavailable("packaging tests", reason)


def need_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t, path=ENV["PATH"]) is None]
    if missing:
        unavailable(f"missing tools: {', '.join(missing)} (scripts/test-packages.txt)")


def run(argv: Sequence[str], timeout_seconds: float = 300, check: bool = True, cwd: Optional[Path] = None,
        env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_seconds,
                            env={**ENV, **(env or {})}, cwd=cwd, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-3000:]}")
    return result


def build(target: str, out: Path, *extra: str) -> List[Path]:
    """packaging/build.sh --target TARGET, as a user runs it; the packages it reports having built."""
    before = set(out.glob("*")) if out.exists() else set()
    result = run([str(REPO / "packaging/build.sh"), "--target", target, "--out", str(out), "--wheelhouse",
                  str(WHEELHOUSE), *extra], timeout_seconds=900, env={"GPUGUARD_BUILD_PYTHON": sys.executable})
    built = sorted(set(out.glob("*")) - before)
    assert built, result.stderr
    return built


def rpm(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(["rpm", "--root", str(root), *args], check=check, timeout_seconds=120)


@pytest.fixture
def rpm_root(tmp_path: Path) -> Path:
    """An empty rpm database under a root whose only program is /bin/sh."""
    need_tools("rpm", "ldd")
    if os.geteuid() != 0:
        unavailable("rpm runs scriptlets in a chroot: root needed")
    root = tmp_path / "root"
    shell = Path("/bin/dash").resolve()
    libraries = [line.split()[-2] if "=>" in line else line.split()[0]
                 for line in run(["ldd", str(shell)]).stdout.splitlines() if "/" in line]
    for source in [str(shell), *libraries]:
        dest = root / source.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)
    (root / "bin").mkdir(exist_ok=True)
    if not (root / "bin/sh").exists():
        os.symlink(str(shell), root / "bin/sh")
    assert run(["chroot", str(root), "/bin/sh", "-c", "echo ok"]).stdout == "ok\n"
    rpm(root, "--initdb")
    return root


def by_name(paths: Sequence[Path]) -> Dict[str, Path]:
    """{"gpuguard": path, "gpuguard-hub": path} from package file names (name_version... or name-version...)."""
    out = {}
    for path in paths:
        stem = path.name
        name = stem.split("_")[0] if stem.endswith(".deb") else stem.rsplit("-", 2)[0]
        out[name] = path
    return out


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dist")


@pytest.fixture(scope="session")
def debian12(dist: Path) -> Dict[str, Path]:
    """gpuguard and gpuguard-hub .debs for Debian 12 (version from pyproject.toml)."""
    need_tools("dpkg-deb")
    return by_name(build("debian12", dist / "debian12"))


@pytest.fixture(scope="session")
def debian12_upgrade_all(dist: Path) -> Dict[str, Path]:
    """Newer gpuguard and gpuguard-hub .debs for Debian 12 (the upgrade tests)."""
    need_tools("dpkg-deb")
    return by_name(build("debian12", dist / "debian12-upgrade", "--version", UPGRADE_VERSION))


@pytest.fixture(scope="session")
def debian12_upgrade(debian12_upgrade_all: Dict[str, Path]) -> Path:
    """A newer gpuguard .deb for Debian 12 (the upgrade test)."""
    return debian12_upgrade_all["gpuguard"]


@pytest.fixture(scope="session")
def built(dist: Path) -> Callable[[str], Dict[str, Path]]:
    """``built(target)``: packaging/build.sh --target TARGET once per session, {package name: path}."""
    cache: Dict[str, Dict[str, Path]] = {}

    def get(target: str) -> Dict[str, Path]:
        if target not in cache:
            need_tools("dpkg-deb" if target.startswith(("debian", "ubuntu")) else "rpmbuild")
            cache[target] = by_name(build(target, dist / f"{target}-all"))
        return cache[target]

    return get


@pytest.fixture(scope="session")
def el9(dist: Path) -> Dict[str, Path]:
    """gpuguard and gpuguard-hub .rpms for RHEL 9."""
    need_tools("rpmbuild", "rpm")
    return by_name(build("el9", dist / "el9"))


@pytest.fixture(scope="session")
def el9_upgrade(dist: Path) -> Path:
    need_tools("rpmbuild", "rpm")
    return by_name(build("el9", dist / "el9-upgrade", "--version", UPGRADE_VERSION, "--no-hub"))["gpuguard"]


@pytest.fixture(scope="session")
def ubuntu2404(dist: Path) -> Path:
    """gpuguard .deb for Ubuntu 24.04 (Python 3.12): the build the H200 host gets."""
    need_tools("dpkg-deb")
    return by_name(build("ubuntu2404", dist / "ubuntu2404", "--no-hub"))["gpuguard"]
