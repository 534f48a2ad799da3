"""dnf5 for real: an installroot ``/ir`` inside the Debian sid root (tests/sidroot.py), with gpuguard's dnf5 action.

How to use it::

    root = Dnf5Root(SidRoot(path))             # the sid root, mounted
    root.build_repo()                          # fake AMD/kernel rpms (sid's rpmbuild) + createrepo_c, in /srv/repo
    root.install_gpuguard(TEST_POLICY)         # as the package installs it (packaging/build.py stage_dnf)
    root.dnf5("install", "rocm-core-6.2.2.60202")         # chroot SID dnf5 -y --installroot=/ir ... (CompletedProcess)
    root.installed()      # {"amdgpu-dkms": "1:6.8.5.60202-2041575.el9", "kernel-core@5.14.0-427.el9": ...}
    root.rpm("-U", "--force", "--nodeps", root.rpm_path("amdgpu-dkms", AMDGPU_63))
    root.gpuguard("guard", "rollback")     # the agent's CLI inside the sid root, against /ir (CompletedProcess)
    root.save(); root.restore()               # the whole /ir, between tests

Everything runs inside the sid root (``chroot``): dnf5 5.4 with the actions plugin of libdnf5-2, rpm 6 and
createrepo_c. gpuguard is installed as its rpm installs it: this checkout's agent/ under /usr/lib/gpuguard, the
packaged launcher /usr/lib/gpuguard/gpuguard-dnf5-action and the packaged actions file in
/etc/dnf/libdnf5-plugins/actions.d/. dnf5 reads that host config (``--use-host-config``), so the action runs on
sid's /usr/bin/python3 -IS and decides against ``/ir``'s compiled policy and state. Each dnf5 command gets a
fresh cache directory: dnf5 caches ``file://`` metadata and ``--refresh`` does not see a ``createrepo_c --update``.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

from tests.guard.dnf.installroot.harness import (
    AMDGPU_62,
    AMDGPU_63,
    HELLO_10,
    HELLO_11,
    KERNEL_427,
    ROCM_62,
    ROCM_63,
    SPEC,
    TEST_POLICY,
    FakeRpm,
    kernel_rpms,
)
from tests.sidroot import SidRoot

REPO_ROOT = Path(__file__).resolve().parents[4]
IR = "/ir"
REPO = "/srv/repo"
LIB = "/usr/lib/gpuguard"
ACTIONS_FILE = "/etc/dnf/libdnf5-plugins/actions.d/gpuguard.actions"
FIRMWARE = "amdgpu-dkms-firmware"
# AMD's el9 builds (the installroot harness's AMDGPU_62/63) need their firmware package at exactly the same EVR.
INSTALLONLY_NAMES = ("kernel", "kernel-core")
BASELINE = {"amdgpu-dkms": AMDGPU_62, FIRMWARE: AMDGPU_62, "rocm-core": ROCM_62, "kernel": KERNEL_427,
            "kernel-core": KERNEL_427, "hello-fake": HELLO_10}


def fake_rpms() -> List[FakeRpm]:
    """The installroot harness's repository, the driver requiring its firmware at the same EVR."""
    return [
        FakeRpm(FIRMWARE, AMDGPU_62),
        FakeRpm(FIRMWARE, AMDGPU_63),
        FakeRpm("amdgpu-dkms", AMDGPU_62, requires=f"{FIRMWARE} = {AMDGPU_62}"),
        FakeRpm("amdgpu-dkms", AMDGPU_63, requires=f"{FIRMWARE} = {AMDGPU_63}"),
        FakeRpm("rocm-core", ROCM_62, "x86_64"),
        FakeRpm("rocm-core", ROCM_63, "x86_64"),
        *kernel_rpms(),
        FakeRpm("hello-fake", HELLO_10),
        FakeRpm("hello-fake", HELLO_11),
    ]


class Dnf5Root:
    """The installroot /ir inside a mounted sid root, and the commands that act on it."""

    def __init__(self, sid: SidRoot) -> None:
        self.sid = sid
        self.root = sid.path(IR)
        self.root.mkdir(parents=True, exist_ok=True)
        self.saved = sid.root.parent / "ir-baseline"
        self._caches = itertools.count()

    # --- repository ----------------------------------------------------------------------------------------------

    def build_repo(self) -> None:
        """Build every fake rpm with sid's rpmbuild into /srv/repo and index it with createrepo_c."""
        self.sid.path(REPO).mkdir(parents=True, exist_ok=True)
        work = self.sid.path("/tmp/rpmbuild")
        work.mkdir(parents=True, exist_ok=True)
        (work / "fake.spec").write_text(SPEC)
        for pkg in fake_rpms():
            defines = {"_topdir": "/tmp/rpmbuild/top", "_rpmdir": REPO,
                       "_build_name_fmt": "%{NAME}-%{VERSION}-%{RELEASE}.%{ARCH}.rpm",
                       "pkgname": pkg.name, "pkgver": pkg.version, "pkgrel": pkg.release, "pkgarch": pkg.arch}
            for key, value in (("pkgepoch", pkg.epoch), ("pkgprovides", pkg.provides),
                               ("pkgrequires", pkg.requires)):
                if value:
                    defines[key] = value
            argv = ["rpmbuild", "-bb", "--quiet", "--target", pkg.arch]
            for key, value in defines.items():
                argv += ["--define", f"{key} {value}"]
            self.sid.run(*argv, "/tmp/rpmbuild/fake.spec", check=True)
        self.sid.run("createrepo_c", "--quiet", REPO, check=True)

    def rpm_path(self, name: str, evr: str) -> str:
        """Path inside the sid root of a fake package's rpm in the repository."""
        for pkg in fake_rpms():
            if pkg.name == name and pkg.evr == evr:
                return f"{REPO}/{pkg.file_name}"
        raise KeyError((name, evr))

    # --- gpuguard ------------------------------------------------------------------------------------------------

    def install_gpuguard(self, policy_text: str = TEST_POLICY) -> None:
        """The agent, the dnf5 action launcher and the actions file as the rpm installs them; the policy in /ir."""
        lib = self.sid.install_agent(LIB)
        launcher = lib / "gpuguard-dnf5-action"
        shutil.copy2(REPO_ROOT / "packaging/dnf5/gpuguard-dnf5-action", launcher)
        launcher.chmod(0o755)
        actions = self.sid.path(ACTIONS_FILE)
        actions.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / "packaging/dnf5/gpuguard.actions", actions)
        policy_dir = self.root / "etc/gpuguard/policy.d"
        policy_dir.mkdir(parents=True, exist_ok=True)
        (policy_dir / "10-test.toml").write_text(policy_text)

    @property
    def state_dir(self) -> Path:
        return self.root / "var/lib/gpuguard"

    def dnf_options(self, cache: str) -> List[str]:
        """Options before every dnf5 argument: the host config (the actions plugin), the repository, a cache."""
        return ["--use-host-config", "--releasever=9", f"--repofrompath=fake,file://{REPO}", "--repo=fake",
                "--setopt=fake.gpgcheck=0", f"--setopt=cachedir={cache}", f"--setopt=system_cachedir={cache}",
                "--setopt=install_weak_deps=0", "--setopt=installonly_limit=3"]

    def write_agent_config(self) -> str:
        """/etc/gpuguard/agent.toml inside the sid root: [guard] dnf_options for dnf5 against the repository."""
        import json

        options = ", ".join(json.dumps(o) for o in self.dnf_options("/var/cache/gpuguard-tests/agent"))
        path = self.sid.path("/etc/gpuguard/agent.toml")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"[guard]\ndnf_options = [{options}]\nlock_timeout_seconds = 5\n")
        return "/etc/gpuguard/agent.toml"

    def gpuguard(self, *argv: str) -> subprocess.CompletedProcess:
        """This checkout's CLI on sid's python3 inside the sid root, against /ir (``--root /ir``)."""
        config = self.write_agent_config()
        shutil.rmtree(self.sid.path("/var/cache/gpuguard-tests/agent"), ignore_errors=True)
        return self.sid.run("python3", "-m", "agent", *argv, "--root", IR, "--config", config,
                            env={"PYTHONPATH": LIB}, timeout_seconds=300)

    # --- commands ------------------------------------------------------------------------------------------------

    def dnf5(self, *args: str, plugin: bool = True, check: bool = False) -> subprocess.CompletedProcess:
        """``dnf5 -y --installroot=/ir ...`` inside the sid root with a fresh cache; ``plugin=False`` adds
        ``--disable-plugin=actions`` (the documented bypass)."""
        cache = f"/var/cache/gpuguard-tests/{next(self._caches)}"
        argv = ["dnf5", "-y", f"--installroot={IR}", *self.dnf_options(cache)]
        if not plugin:
            argv.append("--disable-plugin=actions")
        try:
            return self.sid.run(*argv, *args, check=check, timeout_seconds=120)
        finally:
            shutil.rmtree(self.sid.path(cache), ignore_errors=True)

    def rpm(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        """Plain ``rpm --root /ir`` (no dnf5, no action)."""
        return self.sid.run("rpm", "--root", IR, *args, check=check)

    # --- state ---------------------------------------------------------------------------------------------------

    def nevras(self) -> List[str]:
        """Every installed package as ``name-[epoch:]version-release.arch``, sorted."""
        result = self.rpm("-qa", "--qf", "%{NAME}-%|EPOCH?{%{EPOCH}:}|%{VERSION}-%{RELEASE}.%{ARCH}\\n", check=True)
        return sorted(line for line in result.stdout.splitlines() if line and not line.startswith("gpg-pubkey"))

    def installed(self) -> Dict[str, str]:
        """Installed packages as the guard keys them: ``name`` -> EVR, ``name@EVR`` for install-only kernels."""
        result = self.rpm("-qa", "--qf", "%{NAME}\\t%|EPOCH?{%{EPOCH}:}|%{VERSION}-%{RELEASE}\\n", check=True)
        out: Dict[str, str] = {}
        for line in result.stdout.splitlines():
            name, _, evr = line.partition("\t")
            if name and not name.startswith("gpg-pubkey"):
                out[f"{name}@{evr}" if name in INSTALLONLY_NAMES else name] = evr
        return out

    def rpmdb_bytes(self) -> Dict[str, bytes]:
        """The rpm database files under /ir/var/lib/rpm, byte for byte (without SQLite's -shm index, which any
        dnf5 run rewrites)."""
        base = self.root / "var/lib/rpm"
        return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*"))
                if p.is_file() and not p.name.endswith("-shm")}

    def verify(self) -> subprocess.CompletedProcess:
        """``rpm -Va --nofiles``: exit 0 and no output when every dependency is met."""
        return self.rpm("-Va", "--nofiles", "--nodigest", "--nosignature")

    def save(self) -> None:
        if self.saved.exists():
            shutil.rmtree(self.saved)
        shutil.copytree(self.root, self.saved, symlinks=True)

    def restore(self) -> None:
        shutil.rmtree(self.root)
        shutil.copytree(self.saved, self.root, symlinks=True)
