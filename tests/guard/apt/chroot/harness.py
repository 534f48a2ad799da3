"""A debootstrap'd Debian 12 chroot with a local file: repository of fake GPU packages and the gpuguard apt hook.

Built once per test session under a temp dir (never touching this machine's own package state); the debootstrap
result is cached as a tarball under /var/tmp/gpuguard-test-cache keyed by a hash of its inputs, except in CI
(CI=true), which always builds from scratch. proc and devpts are mounted inside and always unmounted.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from tests.mountedroot import MountedRoot

REPO_ROOT = Path(__file__).resolve().parents[4]
SUITE = "bookworm"
INCLUDE = ("python3",)
HARNESS_VERSION = 1  # bump when the chroot build steps change
CACHE_DIR = Path(os.environ.get("GPUGUARD_TEST_CACHE", "/var/tmp/gpuguard-test-cache"))
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "LANG": "C",
       "DEBIAN_FRONTEND": "noninteractive"}

AMDGPU_62 = "1:6.8.5.60202-2041575"
AMDGPU_63 = "1:6.10.5.60300-2084815"
ROCM_62 = "6.2.2.60202-116~12"
ROCM_63 = "6.3.0.60300-39~12"
# AMD's Ubuntu 24.04 builds: the driver needs its firmware package at exactly the same version.
AMDGPU_62_U = "1:6.8.5.60202-2041575.24.04"
AMDGPU_63_U = "1:6.10.5.60300-2084815.24.04"
FIRMWARE = "amdgpu-dkms-firmware"
KERNEL_26, KERNEL_27, KERNEL_28 = "linux-image-6.1.0-26-amd64", "linux-image-6.1.0-27-amd64", \
    "linux-image-6.1.0-28-amd64"
BASELINE = {"amdgpu-dkms": AMDGPU_62, "rocm-core": ROCM_62, "rocm-hip-runtime": ROCM_62, KERNEL_26: "6.1.112-1"}


@dataclass(frozen=True)
class FakePackage:
    name: str
    version: str
    arch: str = "all"
    depends: Optional[str] = None
    multi_arch: Optional[str] = None
    files: Tuple[Tuple[str, str], ...] = ()  # (absolute path, content) shipped besides the VERSION marker
    scripts: Tuple[Tuple[str, str], ...] = ()  # (maintainer script: postinst, prerm, ..., its shell body)

    @property
    def file_name(self) -> str:
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.arch}.deb"


def fake_packages(native_arch: str) -> List[FakePackage]:
    return [
        FakePackage("amdgpu-dkms", AMDGPU_62),
        FakePackage("amdgpu-dkms", AMDGPU_63),
        FakePackage(FIRMWARE, AMDGPU_62_U),
        FakePackage(FIRMWARE, AMDGPU_63_U),
        FakePackage("amdgpu-dkms", AMDGPU_62_U, depends=f"{FIRMWARE} (= {AMDGPU_62_U})"),
        FakePackage("amdgpu-dkms", AMDGPU_63_U, depends=f"{FIRMWARE} (= {AMDGPU_63_U})"),
        FakePackage("rocm-core", ROCM_62, native_arch),
        FakePackage("rocm-core", ROCM_63, native_arch),
        FakePackage("rocm-hip-runtime", ROCM_62, native_arch, f"rocm-core (= {ROCM_62})"),
        FakePackage("rocm-hip-runtime", ROCM_63, native_arch, f"rocm-core (= {ROCM_63})"),
        FakePackage(KERNEL_26, "6.1.112-1", native_arch),
        FakePackage(KERNEL_27, "6.1.115-1", native_arch),
        FakePackage(KERNEL_28, "6.1.119-1", native_arch),
        FakePackage("hello-fake", "1.0-1"),
    ]


TEST_POLICY = """\
[policy]
name = "chroot-test"
action = "block"

[amd]
action = "rollback"

[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
kernels = ["6.1.0-26-amd64", "6.1.0-27-amd64"]

[[amd.pairing]]
name = "rocm-6.3"
amdgpu = "6.3.*"
rocm = "6.3.*"
kernels = ["6.1.0-26-amd64", "6.1.0-27-amd64"]
"""


def run(argv: Sequence[str], timeout_seconds: float = 300, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_seconds, env=ENV,
                            stdin=subprocess.DEVNULL, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result


def debian_mirror() -> str:
    """The Debian mirror this machine uses (deb822 sources first), as the reference setup did."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        uris = suites = None
        for stanza in path.read_text().split("\n\n"):
            for line in stanza.splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "URIs":
                    uris = value.split()
                elif key.strip() == "Suites":
                    suites = value.split()
            if uris and suites and SUITE in suites:
                return uris[0]
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                return parts[1]
    return "http://deb.debian.org/debian"


def missing_tools() -> List[str]:
    return [tool for tool in ("debootstrap", "dpkg-deb", "apt-ftparchive", "chroot", "mount", "umount")
            if shutil.which(tool) is None]


def _cache_key(mirror: str, suite: str = SUITE) -> str:
    blob = json.dumps({"suite": suite, "mirror": mirror, "include": INCLUDE, "variant": "minbase",
                       "harness": HARNESS_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_PROCESS_TARBALLS: Dict[str, Path] = {}


def _forget_process_tarballs() -> None:
    for tarball in _PROCESS_TARBALLS.values():
        shutil.rmtree(tarball.parent, ignore_errors=True)
    _PROCESS_TARBALLS.clear()


atexit.register(_forget_process_tarballs)


def build_base(target: Path, use_cache: bool, suite: str = SUITE) -> Dict[str, float]:
    """debootstrap (or unpack the cached tarball of) a minbase ``suite`` (bookworm; trixie for the Debian 13
    package tests; sid for the Python 3.14 ones) with python3 into ``target``; the mirror is the one this machine's
    bookworm sources name.

    Without the on-disk cache (CI, where each run must really debootstrap), the first base built in this test
    process is still kept as a tarball in a private temp dir until the process exits, so the apt guard's chroot
    and the packaging chroot share one debootstrap instead of paying for two.
    """
    timings: Dict[str, float] = {}
    mirror = debian_mirror()
    key = _cache_key(mirror, suite)
    tarball = CACHE_DIR / f"{suite}-minbase-{key}.tar"
    started = time.monotonic()
    if not use_cache and key in _PROCESS_TARBALLS:
        target.mkdir(parents=True, exist_ok=True)
        run(["tar", "-xf", str(_PROCESS_TARBALLS[key]), "-C", str(target), "--numeric-owner"], timeout_seconds=600)
        timings["unpack_process_copy_seconds"] = time.monotonic() - started
        return timings
    if use_cache and tarball.is_file():
        target.mkdir(parents=True, exist_ok=True)
        run(["tar", "-xf", str(tarball), "-C", str(target), "--numeric-owner"], timeout_seconds=600)
        timings["unpack_cached_seconds"] = time.monotonic() - started
        return timings
    run(["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", suite, str(target), mirror],
        timeout_seconds=1200)
    timings["debootstrap_seconds"] = time.monotonic() - started
    if use_cache:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".tar.partial")
        run(["tar", "-cf", str(partial), "-C", str(target), "--numeric-owner", "."], timeout_seconds=600)
        partial.replace(tarball)
    else:
        keep = Path(tempfile.mkdtemp(prefix="gpuguard-base-"))
        run(["tar", "-cf", str(keep / "base.tar"), "-C", str(target), "--numeric-owner", "."], timeout_seconds=600)
        _PROCESS_TARBALLS[key] = keep / "base.tar"
    return timings


def build_deb(pkg: FakePackage, out_dir: Path, work: Path) -> Path:
    """A tiny real .deb (one file under /usr/share/gpuguard-fake) built with dpkg-deb --root-owner-group."""
    tree = work / f"{pkg.name}-{pkg.version.replace(':', '_')}"
    (tree / "DEBIAN").mkdir(parents=True)
    payload = tree / "usr/share/gpuguard-fake" / pkg.name
    payload.mkdir(parents=True)
    (payload / "VERSION").write_text(pkg.version + "\n")
    for path, content in pkg.files:
        target = tree / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    control = [f"Package: {pkg.name}", f"Version: {pkg.version}", f"Architecture: {pkg.arch}",
               "Maintainer: gpuguard tests <tests@example.invalid>", "Section: misc", "Priority: optional"]
    if pkg.depends:
        control.append(f"Depends: {pkg.depends}")
    if pkg.multi_arch:
        control.append(f"Multi-Arch: {pkg.multi_arch}")
    control.append(f"Description: fake {pkg.name} for gpuguard's chroot tests")
    (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
    for script, body in pkg.scripts:
        path = tree / "DEBIAN" / script
        path.write_text("#!/bin/sh\nset -e\n" + body + "\n")
        path.chmod(0o755)
    out = out_dir / pkg.file_name
    run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", str(tree), str(out)])
    return out


class Chroot(MountedRoot):
    """The test chroot: commands inside it, the fake repository, the gpuguard install."""

    def __init__(self, root: Path) -> None:
        MountedRoot.__init__(self, root)
        self.native_arch = run(["dpkg", "--print-architecture"]).stdout.strip()
        self.pool = root / "srv/repo/pool"
        self.attic = root / "srv/attic"  # .debs "dropped from the repository"

    def mount(self) -> None:
        """/proc and the host's /dev/pts (apt and dpkg want a pty)."""
        self.mount_at("proc", "proc", "-t", "proc")
        self.mount_at("dev/pts", "/dev/pts", "--bind")

    # --- commands ----------------------------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = False, timeout_seconds: float = 300) -> subprocess.CompletedProcess:
        return run(["chroot", str(self.root), *argv], timeout_seconds=timeout_seconds, check=check)

    def apt(self, *args: str, hook: bool = True, check: bool = False) -> subprocess.CompletedProcess:
        options = [] if hook else ["-o", "DPkg::Pre-Install-Pkgs::gpuguard="]
        return self.run("apt-get", "-y", "-q", "-o", "Dpkg::Use-Pty=0", *options, *args, check=check)

    def status_bytes(self) -> bytes:
        return (self.root / "var/lib/dpkg/status").read_bytes()

    def installed(self) -> Dict[str, str]:
        """Package -> version of what dpkg has fully installed (``ii``)."""
        return {name: version for name, (version, status) in self._dpkg_rows().items() if status.startswith("ii")}

    def present(self) -> Dict[str, str]:
        """Package -> version of what dpkg has in any state but not-installed or config-files (half-installed,
        unpacked, half-configured count: what a forced or broken change leaves)."""
        return {name: version for name, (version, status) in self._dpkg_rows().items() if status[1] not in "nc"}

    def _dpkg_rows(self) -> Dict[str, Tuple[str, str]]:
        result = self.run("dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n", check=True)
        rows = [line.split() for line in result.stdout.splitlines()]
        return {r[0]: (r[1], r[2]) for r in rows if len(r) >= 3}

    # --- repository --------------------------------------------------------------------------------------------

    def build_repo(self, work: Path) -> None:
        self.pool.mkdir(parents=True, exist_ok=True)
        self.attic.mkdir(parents=True, exist_ok=True)
        for pkg in fake_packages(self.native_arch):
            build_deb(pkg, self.pool, work)
        sources = self.root / "etc/apt/sources.list"
        sources.write_text("deb [trusted=yes] file:/srv/repo ./\n")
        for extra in (self.root / "etc/apt/sources.list.d").glob("*"):
            extra.unlink()
        (self.root / "etc/apt/apt.conf.d/90gpuguard-tests").write_text(
            'APT::Install-Recommends "false";\nAcquire::Languages "none";\n')
        self.index_repo()

    def index_repo(self) -> None:
        """Regenerate Packages from the pool (apt-ftparchive keeps every version, unlike dpkg-scanpackages)."""
        repo = self.root / "srv/repo"
        packages = run(["apt-ftparchive", "packages", "pool"], cwd=str(repo)).stdout
        (repo / "Packages").write_text(packages)
        self.run("apt-get", "update", "-q", check=True)

    @contextlib.contextmanager
    def packages_in_repo(self, packages: Sequence[FakePackage], work: Path) -> Iterator[List[Path]]:
        """``packages`` built into the repository (indexed) for the duration; taken out again after, from the pool
        and the attic (a test may have dropped one), and the index rebuilt."""
        debs = [build_deb(p, self.pool, work) for p in packages]
        self.index_repo()
        try:
            yield debs
        finally:
            for deb in debs:
                deb.unlink(missing_ok=True)
                (self.attic / deb.name).unlink(missing_ok=True)
            self.index_repo()

    def drop_from_repo(self, pkg_file: str) -> None:
        shutil.move(str(self.pool / pkg_file), str(self.attic / pkg_file))
        self.index_repo()

    def lose_from_pool(self, pkg_file: str) -> None:
        """The file disappears but the index still lists it: stale lists, or a mirror that lost the file."""
        shutil.move(str(self.pool / pkg_file), str(self.attic / pkg_file))

    def restore_repo(self) -> None:
        moved = list(self.attic.glob("*.deb"))
        for deb in moved:
            shutil.move(str(deb), str(self.pool / deb.name))
        if moved:
            self.index_repo()

    def deb(self, name: str, version: str) -> str:
        """Chroot path of a fake package's .deb in the repository pool."""
        for pkg in fake_packages(self.native_arch):
            if pkg.name == name and pkg.version == version:
                return f"/srv/repo/pool/{pkg.file_name}"
        raise KeyError((name, version))

    # --- gpuguard ----------------------------------------------------------------------------------------------

    def install_gpuguard(self) -> None:
        """The hook as the package would install it: code under /usr/lib/gpuguard, launcher, apt.conf.d snippet."""
        lib = self.root / "usr/lib/gpuguard"
        if lib.exists():
            shutil.rmtree(lib)
        shutil.copytree(REPO_ROOT / "agent", lib / "agent", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        launcher = lib / "gpuguard-apt-hook"
        shutil.copy2(REPO_ROOT / "packaging/apt/gpuguard-apt-hook", launcher)
        launcher.chmod(0o755)
        shutil.copy2(REPO_ROOT / "packaging/apt/50gpuguard", self.root / "etc/apt/apt.conf.d/50gpuguard")
        policy_dir = self.root / "etc/gpuguard/policy.d"
        policy_dir.mkdir(parents=True, exist_ok=True)
        (policy_dir / "10-test.toml").write_text(TEST_POLICY)

    @property
    def state_dir(self) -> Path:
        return self.root / "var/lib/gpuguard"
