"""A dnf4 ``--installroot`` under a temp dir with a local repository of small fake rpms, for the dnf guard tests.

How to use it (the rpm rollback tests reuse it; the API only grows, nothing is renamed)::

    repo = build_repo(tmp / "repo", tmp / "rpmbuild")        # fake rpms (rpmbuild) + createrepo_c, once a session
    root = Installroot(tmp / "root", repo, tmp / "work")      # writes dnf.conf, the repo file, the plugin conf
    root.install_gpuguard(TEST_POLICY)                        # checker launcher + /etc/gpuguard/policy.d in the root
    root.dnf("install", "rocm-core-6.2.2.60202", plugin=False, check=True)
    root.dnf("upgrade", "rocm-core")                          # the gpuguard dnf plugin runs (CompletedProcess)
    root.installed()      # {"rocm-core": "6.2.2.60202-116.el9", "kernel-core@5.14.0-427.el9": "5.14.0-427.el9"}
    root.rpmdb_bytes()    # {relative path: bytes} of the rpm database, to prove "nothing changed"
    root.rpm("-U", "--nodeps", root.rpm_path("rocm-core", ROCM_63))   # plain rpm, bypassing dnf and the plugin
    root.save(tmp / "baseline"); root.restore(tmp / "baseline")       # reset the whole root between tests

Everything runs on this machine's /usr/bin/dnf and /usr/bin/rpm (Debian's dnf 4 and rpm 4.18) with a private
HOME whose ``.rpmmacros`` sets ``%_dbpath /var/lib/rpm`` (Debian's default is ``~/.rpmdb``), so the rpm database
sits where RHEL puts it: ``<root>/var/lib/rpm``. Nothing outside the temp dirs is touched. dnf loads plugins only
from packaging/dnf (``pluginpath``; ``Installroot(..., plugin_dir=)`` names another, e.g. a built package's) with
the plugin config from ``<work>/pluginconf`` (``pluginconfpath``), whose ``checker=`` points
at a launcher that runs this checkout's agent under /usr/bin/python3 -IS.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[4]
SYSTEM_PYTHON = "/usr/bin/python3"
TOOLS = ("/usr/bin/dnf", "/usr/bin/rpm", "/usr/bin/rpmbuild", "/usr/bin/createrepo_c")
DBPATH = "/var/lib/rpm"

AMDGPU_62 = "1:6.8.5.60202-2041575.el9"
AMDGPU_63 = "1:6.10.5.60300-2084815.el9"
ROCM_62 = "6.2.2.60202-116.el9"
ROCM_63 = "6.3.0.60300-39.el9"
KERNEL_427, KERNEL_503, KERNEL_570 = "5.14.0-427.el9", "5.14.0-503.el9", "5.14.0-570.el9"
HELLO_10, HELLO_11 = "1.0-1", "1.1-1"
INSTALLONLY_NAMES = ("kernel", "kernel-core", "kernel-modules")
# What the session installs before each test (name -> EVR; kernels are installed side by side by dnf).
BASELINE = {"amdgpu-dkms": AMDGPU_62, "rocm-core": ROCM_62, "kernel": KERNEL_427, "kernel-core": KERNEL_427,
            "hello-fake": HELLO_10}

TEST_POLICY = """\
[policy]
name = "installroot-test"
action = "block"

[amd]
action = "rollback"

[[amd.pairing]]
name = "rocm-6.2"
amdgpu = "6.2.*"
rocm = "6.2.*"
kernels = ["5.14.0-427.*", "5.14.0-503.*"]

[[amd.pairing]]
name = "rocm-6.3"
amdgpu = "6.3.*"
rocm = "6.3.*"
kernels = ["5.14.0-427.*", "5.14.0-503.*"]
"""


@dataclass(frozen=True)
class FakeRpm:
    """One fake package: name, ``[epoch:]version-release``, arch, and optional Provides/Requires."""

    name: str
    evr: str
    arch: str = "noarch"
    provides: Optional[str] = None
    requires: Optional[str] = None

    @property
    def epoch(self) -> Optional[str]:
        return self.evr.split(":", 1)[0] if ":" in self.evr else None

    @property
    def version(self) -> str:
        return self.evr.split(":", 1)[-1].rsplit("-", 1)[0]

    @property
    def release(self) -> str:
        return self.evr.rsplit("-", 1)[1]

    @property
    def file_name(self) -> str:
        return f"{self.name}-{self.version}-{self.release}.{self.arch}.rpm"

    @property
    def spec(self) -> str:
        """``name-version-release`` as given on a dnf or dnf5 command line."""
        return f"{self.name}-{self.version}-{self.release}"


def install_specs(versions: Mapping[str, str]) -> List[str]:
    """dnf install arguments (``name-version-release``, as FakeRpm.spec) for name -> ``[epoch:]version-release``."""
    return [FakeRpm(name, evr).spec for name, evr in versions.items()]


def kernel_rpms() -> List[FakeRpm]:
    """kernel and kernel-core at three builds, installonly (dnf installs them side by side)."""
    kernels = []
    for evr in (KERNEL_427, KERNEL_503, KERNEL_570):
        kernels.append(FakeRpm("kernel-core", evr, "x86_64", provides="installonlypkg(kernel)"))
        kernels.append(FakeRpm("kernel", evr, "x86_64", provides="installonlypkg(kernel)",
                               requires=f"kernel-core = {evr}"))
    return kernels


def fake_rpms() -> List[FakeRpm]:
    """The repository: the AMD driver/ROCm pairs, three kernels (installonly) and a harmless package."""
    return [
        FakeRpm("amdgpu-dkms", AMDGPU_62),
        FakeRpm("amdgpu-dkms", AMDGPU_63),
        FakeRpm("rocm-core", ROCM_62, "x86_64"),
        FakeRpm("rocm-core", ROCM_63, "x86_64"),
        *kernel_rpms(),
        FakeRpm("hello-fake", HELLO_10),
        FakeRpm("hello-fake", HELLO_11),
    ]


SPEC = """\
Name: %{pkgname}
Version: %{pkgver}
Release: %{pkgrel}
%{?pkgepoch:Epoch: %{pkgepoch}}
Summary: fake %{pkgname} for gpuguard's dnf and dnf5 tests
License: MIT
BuildArch: %{pkgarch}
%{?pkgprovides:Provides: %{pkgprovides}}
%{?pkgrequires:Requires: %{pkgrequires}}
%description
A fake package with one small file, for gpuguard's dnf and dnf5 guard tests.
%install
mkdir -p %{buildroot}/usr/share/gpuguard-fake/%{name}-%{version}-%{release}
echo %{name}-%{version}-%{release} > %{buildroot}/usr/share/gpuguard-fake/%{name}-%{version}-%{release}/VERSION
%files
/usr/share/gpuguard-fake/%{name}-%{version}-%{release}
"""


def missing_tools() -> List[str]:
    """The tools these tests need that this machine lacks (the dnf module must import in /usr/bin/python3)."""
    missing = [t for t in TOOLS if not os.access(t, os.X_OK)]
    if os.access(SYSTEM_PYTHON, os.X_OK):
        probe = subprocess.run([SYSTEM_PYTHON, "-c", "import dnf, rpm"], capture_output=True, timeout=60)
        if probe.returncode != 0:
            missing.append("python3-dnf/python3-rpm (import dnf, rpm in /usr/bin/python3)")
    else:
        missing.append(SYSTEM_PYTHON)
    return missing


def rpm_home(work: Path) -> Path:
    """A private HOME whose .rpmmacros puts the rpm database at /var/lib/rpm under any --root."""
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / ".rpmmacros").write_text(f"%_dbpath {DBPATH}\n")
    return home


def tool_env(home: Path) -> Dict[str, str]:
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "HOME": str(home)}


def run(argv: Sequence[str], env: Dict[str, str], timeout_seconds: float = 120, check: bool = True,
        **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_seconds, env=env,
                            stdin=subprocess.DEVNULL, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: "
                           f"{(result.stdout + result.stderr).strip()[-2000:]}")
    return result


def build_rpm(pkg: FakeRpm, out_dir: Path, work: Path) -> Path:
    """Build one fake rpm with rpmbuild into ``out_dir`` (flat, named like a repository file)."""
    defines = {"_topdir": str(work / "top"), "_rpmdir": str(out_dir),
               "_build_name_fmt": "%{NAME}-%{VERSION}-%{RELEASE}.%{ARCH}.rpm",
               "pkgname": pkg.name, "pkgver": pkg.version, "pkgrel": pkg.release, "pkgarch": pkg.arch}
    if pkg.epoch:
        defines["pkgepoch"] = pkg.epoch
    if pkg.provides:
        defines["pkgprovides"] = pkg.provides
    if pkg.requires:
        defines["pkgrequires"] = pkg.requires
    spec = work / "fake.spec"
    spec.write_text(SPEC)
    argv = ["rpmbuild", "-bb", "--quiet", "--target", pkg.arch]
    for key, value in defines.items():
        argv += ["--define", f"{key} {value}"]
    run(argv + [str(spec)], tool_env(rpm_home(work)))
    out = out_dir / pkg.file_name
    if not out.is_file():
        raise RuntimeError(f"rpmbuild did not produce {out}")
    return out


def build_repo(repo_dir: Path, work: Path, packages: Optional[Iterable[FakeRpm]] = None) -> Path:
    """Build every fake rpm into ``repo_dir`` and index it with createrepo_c; returns ``repo_dir``."""
    repo_dir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    for pkg in packages if packages is not None else fake_rpms():
        build_rpm(pkg, repo_dir, work)
    index_repo(repo_dir, work)
    return repo_dir


def index_repo(repo_dir: Path, work: Path) -> None:
    run(["createrepo_c", "--quiet", "--no-database", str(repo_dir)], tool_env(rpm_home(work)))


CHECKER_LAUNCHER = REPO_ROOT / "packaging/dnf/gpuguard-dnf-check"


class Installroot:
    """One dnf installroot: dnf and rpm commands against it, its installed set and rpm database bytes."""

    def __init__(self, root: Path, repo_dir: Path, work: Path, plugin_dir: Optional[Path] = None) -> None:
        """``plugin_dir``: where dnf loads the plugin from (default this checkout's packaging/dnf)."""
        self.root = root
        self.plugin_dir = plugin_dir or REPO_ROOT / "packaging/dnf"
        self.repo_dir = repo_dir
        self.work = work
        self.home = rpm_home(work)
        self.env = tool_env(self.home)
        self.cache = work / "dnf-cache"
        self.plugin_conf_dir = work / "pluginconf"
        self.checker = work / "gpuguard-dnf-check"
        self.dnf_conf = work / "dnf.conf"
        root.mkdir(parents=True, exist_ok=True)
        self._write_config()

    def _write_config(self) -> None:
        repos = self.work / "repos.d"
        repos.mkdir(parents=True, exist_ok=True)
        (repos / "fake.repo").write_text(
            f"[fake]\nname=gpuguard fake packages\nbaseurl=file://{self.repo_dir}\ngpgcheck=0\nenabled=1\n"
            "metadata_expire=0\n")
        self.dnf_conf.write_text(
            "[main]\ngpgcheck=0\nrepo_gpgcheck=0\ninstallonly_limit=3\nclean_requirements_on_remove=0\n"
            f"install_weak_deps=0\nkeepcache=0\nreposdir={repos}\ncachedir={self.cache}\n"
            f"pluginpath={self.plugin_dir}\npluginconfpath={self.plugin_conf_dir}\n"
            "logdir=/var/log\nprotected_packages=\n")
        self.write_plugin_conf()

    def write_plugin_conf(self, checker: Optional[str] = None, enabled: bool = True,
                          extra: str = "") -> None:
        """The plugin's [main] config (``checker=`` defaults to this root's test launcher)."""
        self.plugin_conf_dir.mkdir(parents=True, exist_ok=True)
        (self.plugin_conf_dir / "gpuguard.conf").write_text(
            f"[main]\nenabled={1 if enabled else 0}\nchecker={checker or self.checker}\n{extra}")

    # --- commands ----------------------------------------------------------------------------------------------

    def dnf(self, *args: str, plugin: bool = True, check: bool = False,
            timeout_seconds: float = 120) -> subprocess.CompletedProcess:
        """Run /usr/bin/dnf -y against the root; ``plugin=False`` adds --disableplugin=gpuguard."""
        argv = ["/usr/bin/dnf", "-c", str(self.dnf_conf), f"--installroot={self.root}", "--releasever=9",
                "--setopt=tsflags=nodocs", "-y", "-q"]
        if not plugin:
            argv.append("--disableplugin=gpuguard")
        return run(argv + list(args), self.env, timeout_seconds=timeout_seconds, check=check)

    def rpm(self, *args: str, check: bool = False, timeout_seconds: float = 120) -> subprocess.CompletedProcess:
        """Run /usr/bin/rpm --root against the root (plain rpm: no dnf, no plugin)."""
        return run(["/usr/bin/rpm", "--root", str(self.root), *args], self.env, timeout_seconds=timeout_seconds,
                   check=check)

    def rpm_path(self, name: str, evr: str) -> str:
        """Host path of a fake package's rpm in the repository."""
        for pkg in fake_rpms():
            if pkg.name == name and pkg.evr == evr:
                return str(self.repo_dir / pkg.file_name)
        raise KeyError((name, evr))

    # --- state -------------------------------------------------------------------------------------------------

    def nevras(self) -> List[str]:
        """Every installed package as ``name-[epoch:]version-release.arch``, sorted."""
        result = self.rpm("-qa", "--qf", "%{NAME}-%|EPOCH?{%{EPOCH}:}|%{VERSION}-%{RELEASE}.%{ARCH}\\n",
                          check=True)
        return sorted(line for line in result.stdout.splitlines() if line and not line.startswith("gpg-pubkey"))

    def installed(self) -> Dict[str, str]:
        """Installed packages as the guard keys them: ``name`` -> EVR, ``name@EVR`` for installonly kernels."""
        result = self.rpm("-qa", "--qf", "%{NAME}\\t%|EPOCH?{%{EPOCH}:}|%{VERSION}-%{RELEASE}\\n", check=True)
        out: Dict[str, str] = {}
        for line in result.stdout.splitlines():
            name, _, evr = line.partition("\t")
            if not name or name.startswith("gpg-pubkey"):
                continue
            out[f"{name}@{evr}" if name in INSTALLONLY_NAMES else name] = evr
        return out

    def tree_bytes(self, relative: str) -> Dict[str, bytes]:
        """Every regular file under ``<root>/<relative>`` -> its bytes (paths relative to that directory)."""
        base = self.root / relative.lstrip("/")
        out: Dict[str, bytes] = {}
        if not base.exists():
            return out
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.is_symlink():
                out[str(path.relative_to(base))] = path.read_bytes()
        return out

    def rpmdb_bytes(self, include_shm: bool = False) -> Dict[str, bytes]:
        """The rpm database files (``<root>/var/lib/rpm``), byte for byte.

        ``rpmdb.sqlite-shm`` (SQLite's shared-memory WAL index, no package data) is left out unless asked for: the
        first dnf run after any write rewrites it, with or without the plugin, even when dnf then aborts
        (``--assumeno``), so it cannot show whether a refused transaction changed anything.
        """
        files = self.tree_bytes(DBPATH)
        return files if include_shm else {k: v for k, v in files.items() if not k.endswith("-shm")}

    def payload_bytes(self) -> Dict[str, bytes]:
        """The files the fake packages installed (``<root>/usr/share/gpuguard-fake``)."""
        return self.tree_bytes("/usr/share/gpuguard-fake")

    def save(self, target: Path) -> None:
        """Copy the whole root to ``target`` (to restore it between tests)."""
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(self.root, target, symlinks=True)

    def restore(self, source: Path) -> None:
        """Replace the root with a copy saved by :meth:`save`."""
        shutil.rmtree(self.root)
        shutil.copytree(source, self.root, symlinks=True)

    # --- gpuguard ----------------------------------------------------------------------------------------------

    def install_gpuguard(self, policy_text: str = TEST_POLICY) -> None:
        """The checker launcher (this checkout's agent on /usr/bin/python3 -IS) and the policy in the root.

        Compile the policy afterwards (``gpuguard policy compile --root <root>``; see conftest.compile_policy).
        """
        text = CHECKER_LAUNCHER.read_text()
        marker = 'GPUGUARD_LIB = "/usr/lib/gpuguard"'
        if marker not in text:
            raise RuntimeError(f"{CHECKER_LAUNCHER} does not set {marker}")
        self.checker.write_text(text.replace(marker, f'GPUGUARD_LIB = "{REPO_ROOT}"'))
        self.checker.chmod(0o755)
        policy_dir = self.root / "etc/gpuguard/policy.d"
        policy_dir.mkdir(parents=True, exist_ok=True)
        (policy_dir / "10-test.toml").write_text(policy_text)

    @property
    def state_dir(self) -> Path:
        return self.root / "var/lib/gpuguard"
