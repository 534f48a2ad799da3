"""A SLES-like host for the zypper guard tests: this machine's / under an overlay, entered with chroot.

How to use it::

    repo = build_repo(tmp / "repo", tmp / "rpmbuild", packages)   # fake rpms (rpmbuild) + createrepo_c
    host = ZypperHost(tmp / "host", repo)       # an overlay upper dir: gpuguard installed at its packaged paths
    package = unpacked_sles_package(tmp / "pkg")   # build.sh --target sles15: the .rpm, unpacked
    host.install_gpuguard(POLICY, package)      # its rpm plugin, macros, hook, commit plugin; the policy
    host.zypper("install", "rocm-core-6.2.2.60202")   # real zypper on "/" (CompletedProcess)
    host.installed()                            # {"rocm-core": "6.2.2.60202-116.sles15", ...}
    host.save(tmp / "baseline"); host.restore(tmp / "baseline")

Every command runs in a private mount namespace (``unshare --mount``) where an overlay of this machine's root
(lower: ``/``, upper: the host dir) is mounted and entered with ``chroot``: zypper and libzypp work on ``/`` as on a
real SLES host (commit plugins load only there), and everything they write (rpm database, payload files, zypp's
caches and logs, gpuguard's state) lands in the upper dir. This machine's own files and package state are never
changed. gpuguard's zypper guard is the one the sles15 .rpm ships (packaging/build.sh builds it, rpm2cpio unpacks
it): its gpuguard.so, macros and launchers are installed inside at their packaged paths, the launchers' GPUGUARD_LIB
pointing at this checkout (visible through the overlay). Needs root (mount namespaces), libzypp, rpm, rpmbuild,
createrepo_c, rpm2cpio, cpio, and gcc with librpm's headers (the package build compiles the plugin); zypper itself
is unpacked from its .debs into the overlay (zypper_debs: Debian's dnf-plugins-core, which the dnf tests need,
Breaks: zypper).
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from tests.guard.dnf.installroot.harness import INSTALLONLY_NAMES, REPO_ROOT, run
from tests.packaging.conftest import build, by_name
from tests.packaging.test_build import unpack_rpm

TOOLS = ("/usr/bin/rpm", "/usr/bin/rpmbuild", "/usr/bin/createrepo_c", "/usr/bin/gcc", "/usr/bin/unshare",
         "/usr/sbin/chroot", "/usr/bin/apt-get", "/usr/bin/dpkg-deb", "/usr/bin/rpm2cpio", "/usr/bin/cpio")
# Debian's dnf-plugins-core (the dnf tests need it) Breaks: zypper, so zypper is not installed on this machine: its
# two .debs are fetched once with apt-get download (kept here between runs) and unpacked into each overlay only.
ZYPPER_DEBS = ("zypper", "zypper-common")
DEB_CACHE = Path("/var/tmp/gpuguard-test-cache/zypper-debs")
# The zypper guard's files as the sles15 .rpm installs them (packaging/build.py ZYPPER_FILES, RPM_PLUGIN_PATH).
# Debian's rpm puts %__plugindir at %{_libdir}/rpm-plugins = /usr/lib64/rpm-plugins, as SLES does.
PLUGIN = "/usr/lib64/rpm-plugins/gpuguard.so"
MACROS = "/usr/lib/rpm/macros.d/macros.transaction_gpuguard"
HOOK_LAUNCHER = "/usr/lib/gpuguard/gpuguard-zypper-hook"
COMMIT_LAUNCHER = "/usr/lib/zypp/plugins/commit/gpuguard"
VENV_PYTHON = REPO_ROOT / ".venv/bin/python"
OPAQUE_DIRS = ("/var/lib/gpuguard", "/etc/gpuguard", "/run/gpuguard", "/var/lib/rpm", "/usr/lib/sysimage/rpm",
               "/var/cache/zypp", "/etc/zypp/repos.d", "/etc/zypp/services.d", "/usr/lib/zypp/plugins",
               "/var/lib/zypp", "/var/log/zypp")
SLES_OS_RELEASE = """NAME="SLES"
VERSION="15-SP7"
VERSION_ID="15.7"
PRETTY_NAME="SUSE Linux Enterprise Server 15 SP7"
ID="sles"
ID_LIKE="suse"
ANSI_COLOR="0;32"
CPE_NAME="cpe:/o:suse:sles:15:sp7"
"""


def missing_tools() -> List[str]:
    """What these tests need that this machine lacks."""
    missing = [t for t in TOOLS if not os.access(t, os.X_OK)]
    if not Path("/usr/include/rpm/rpmts.h").is_file():
        missing.append("librpm-dev (/usr/include/rpm/rpmts.h)")
    if not list(Path("/usr/lib/x86_64-linux-gnu").glob("libzypp.so.*")) and not list(Path("/usr/lib").glob(
            "*/libzypp.so.*")):
        missing.append("libzypp (apt-get install libzypp-bin)")
    if os.geteuid() != 0:
        missing.append("root (mount namespaces for the overlay)")
    return missing


def zypper_debs(cache: Path = DEB_CACHE) -> List[Path]:
    """zypper's .debs (this machine's candidate version), downloaded with apt-get download once into ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    found = [sorted(cache.glob(f"{name}_*.deb")) for name in ZYPPER_DEBS]
    if not all(found):
        run(["apt-get", "download", *ZYPPER_DEBS], {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, timeout_seconds=300,
            cwd=str(cache))
        found = [sorted(cache.glob(f"{name}_*.deb")) for name in ZYPPER_DEBS]
    if not all(found):
        raise RuntimeError(f"apt-get download {' '.join(ZYPPER_DEBS)} left no .deb in {cache}")
    return [files[-1] for files in found]


def unpacked_sles_package(work: Path) -> Path:
    """The sles15 gpuguard .rpm, built by packaging/build.sh (--no-hub) and unpacked with rpm2cpio under
    ``work/root``: the zypper guard these tests install is the shipped one, its gpuguard.so compiled by the build."""
    package = by_name(build("sles15", work / "dist", "--no-hub"))["gpuguard"]
    root = work / "root"
    root.mkdir(parents=True)
    unpack_rpm(package, root)
    return root


def launcher(source: Path) -> str:
    """A packaged launcher with its GPUGUARD_LIB pointed at this checkout (its interpreter stays the package's)."""
    text = source.read_text()
    marker = 'GPUGUARD_LIB = "/usr/lib/gpuguard"'
    if marker not in text:
        raise RuntimeError(f"{source} does not set {marker}")
    return text.replace(marker, f'GPUGUARD_LIB = "{REPO_ROOT}"')


@functools.lru_cache(maxsize=None)
def propagation() -> str:
    """How the private mount namespace treats mounts: ``private`` where the root is a mount point (a machine, a
    container); ``unchanged`` inside a chroot, whose root is a plain directory that unshare cannot make private (it
    fails with "cannot change root filesystem propagation"): there the overlay's mounts stay in the namespace because
    nothing above the chroot shares them (no systemd made the mounts shared)."""
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True,
                           timeout=30, check=False)
    return "private" if probe.returncode == 0 else "unchanged"


class ZypperHost:
    """An overlay of this machine's root with gpuguard installed: zypper, rpm and gpuguard run inside it."""

    def __init__(self, base: Path, repo_dir: Path, debs: Sequence[Path] = ()) -> None:
        self.base = base
        self.upper = base / "upper"
        self.work = base / "work"
        self.merged = base / "merged"
        self.repo_dir = repo_dir
        for path in (self.upper, self.work, self.merged):
            path.mkdir(parents=True, exist_ok=True)
        # This machine's own gpuguard state, rpm database and zypp caches must not show through the overlay:
        # opaque directories (overlayfs's trusted.overlay.opaque) start empty whatever the lower / holds.
        for opaque in OPAQUE_DIRS:
            target = self.path(opaque)
            target.mkdir(parents=True, exist_ok=True)
            os.setxattr(target, "trusted.overlay.opaque", b"y")
        for deb in debs or zypper_debs():  # zypper itself, in the overlay only (etc/ and usr/ files)
            run(["dpkg-deb", "-x", str(deb), str(self.upper)], {"PATH": "/usr/bin:/bin"})
        self.write("/etc/zypp/systemCheck", "")  # Debian's says requires:glibc, which no rpm here provides
        self.write("/etc/rpm/macros.zz-gpuguard-tests", "%_dbpath /var/lib/rpm\n")
        self.write("/etc/zypp/repos.d/fake.repo",
                   f"[fake]\nname=gpuguard fake SLES packages\nbaseurl=file://{repo_dir}\nenabled=1\n"
                   "autorefresh=1\ngpgcheck=0\ntype=rpm-md\n")
        self.write("/var/lib/rpm/.keep", "")
        # A SLES host has no dpkg database and no dnf: hidden (overlay whiteouts), so gpuguard sees an rpm host
        # whose front end is zypper.
        self.write("/etc/os-release", SLES_OS_RELEASE)
        for hidden in ("/var/lib/dpkg/status", "/usr/bin/dnf", "/usr/bin/dnf-3", "/usr/bin/dnf5"):
            self.hide(hidden)

    def hide(self, inside: str) -> None:
        """Hide a file of this machine inside the overlay (a whiteout: a 0/0 character device in the upper dir)."""
        target = self.path(inside)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))

    def path(self, inside: str) -> Path:
        """Where a path of the overlay's root is in the upper dir (to write before a command runs)."""
        return self.upper / inside.lstrip("/")

    def write(self, inside: str, text: str, mode: int = 0o644) -> None:
        target = self.path(inside)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)

    def read(self, inside: str) -> Optional[str]:
        target = self.path(inside)
        return target.read_text() if target.is_file() else None

    # --- commands ----------------------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], check: bool = False, timeout_seconds: float = 180,
            env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Run ``argv`` chrooted into the overlay (a fresh mount namespace each time)."""
        m = str(self.merged)
        script = (f"mount -t overlay overlay -o lowerdir=/,upperdir={self.upper},workdir={self.work} {m} && "
                  f"mount --bind /proc {m}/proc && mount --bind /dev {m}/dev && exec chroot {m} \"$@\"")
        environment = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
                       "HOME": "/root", **(env or {})}
        return run(["unshare", "--mount", "--propagation", propagation(), "--", "/bin/sh", "-c", script, "sh",
                    *argv], environment, timeout_seconds=timeout_seconds, check=check)

    def zypper(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        """``zypper --non-interactive --no-gpg-checks ARGS`` on the overlay's root."""
        return self.run(["/usr/bin/zypper", "--non-interactive", "--no-gpg-checks", *args], check=check)

    def rpm(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        return self.run(["/usr/bin/rpm", *args], check=check)

    def gpuguard(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        """This checkout's gpuguard CLI inside the overlay."""
        return self.run([str(VENV_PYTHON), "-m", "agent", *args, "--config", "/nonexistent/agent.toml"],
                        check=check)

    # --- gpuguard ----------------------------------------------------------------------------------------------

    def install_gpuguard(self, policy_text: str, package_root: Path, commit_plugin: bool = True) -> None:
        """The zypper guard from an unpacked sles .rpm (unpacked_sles_package) at its packaged paths, and the
        policy."""
        target = self.path(PLUGIN)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(package_root / PLUGIN.lstrip("/"), target)
        self.write(MACROS, (package_root / MACROS.lstrip("/")).read_text())
        self.write(HOOK_LAUNCHER, launcher(package_root / HOOK_LAUNCHER.lstrip("/")), 0o755)
        if commit_plugin:
            self.write(COMMIT_LAUNCHER, launcher(package_root / COMMIT_LAUNCHER.lstrip("/")), 0o755)
        self.write("/etc/gpuguard/policy.d/10-test.toml", policy_text)

    def compile_policy(self) -> None:
        result = self.gpuguard("policy", "compile")
        assert result.returncode == 0, result.stdout + result.stderr

    # --- state -------------------------------------------------------------------------------------------------

    def installed(self) -> Dict[str, str]:
        """Installed packages as the guard keys them: ``name`` -> EVR (``name@EVR`` for kernels)."""
        result = self.rpm("-qa", "--qf", "%{NAME}\\t%|EPOCH?{%{EPOCH}:}|%{VERSION}-%{RELEASE}\\n", check=True)
        out: Dict[str, str] = {}
        for line in result.stdout.splitlines():
            name, _, evr = line.partition("\t")
            if name and not name.startswith("gpg-pubkey"):
                out[f"{name}@{evr}" if name in INSTALLONLY_NAMES else name] = evr
        return out

    def save(self, target: Path) -> None:
        """Copy the upper dir (overlay whiteouts included) to ``target``."""
        if target.exists():
            shutil.rmtree(target)
        subprocess.run(["cp", "-a", str(self.upper), str(target)], check=True, timeout=120)

    def restore(self, source: Path) -> None:
        shutil.rmtree(self.upper)
        subprocess.run(["cp", "-a", str(source), str(self.upper)], check=True, timeout=120)
