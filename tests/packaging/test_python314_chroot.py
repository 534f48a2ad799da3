"""The Ubuntu 26.04 packages' Python, 3.14, for real: a Debian sid debootstrap chroot, whose python3 is the same
3.14 that Ubuntu 26.04 ships (no Ubuntu archive is reachable here), with the ubuntu2604 .deb installed by apt and
the ubuntu2404 .deb's cp314 tree (what keeps the guard alive after 24.04 -> 26.04) unpacked beside it.

The chroot is the packaging tests' (tests/packaging/chroots.py) with a sid base (cached as a tarball outside CI);
proc and devpts are mounted and always unmounted. No systemd runs there. What this does not show: Ubuntu's own
archive, its python3 package and ``do-release-upgrade`` (docs/packaging.md, "Ubuntu 24.04 -> 26.04").
About 70 s with the cached base on a 2-core machine (three minutes with the sid debootstrap): marked slow.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Dict, Iterator, List

import pytest

from tests.guard.apt.chroot.harness import (
    AMDGPU_62,
    AMDGPU_63,
    BASELINE,
    ROCM_62,
    ROCM_63,
    TEST_POLICY,
    Chroot,
)
from tests.guard.apt.chroot.test_nvidia_stack import NVIDIA_POLICY, STACK, _nvidia_packages
from tests.packaging.chroots import ok, packaging_chroot, refused

pytestmark = [pytest.mark.chroot, pytest.mark.slow, pytest.mark.timeout(900)]

LIB = "/usr/lib/gpuguard"
UNPACKED = "/opt/ubuntu2404"  # where the ubuntu2404 .deb is unpacked (dpkg-deb -x), not installed
PAIRED = (f"amdgpu-dkms={AMDGPU_63}", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
PAIRED_BACK = (f"amdgpu-dkms={AMDGPU_62}", f"rocm-core={ROCM_62}", f"rocm-hip-runtime={ROCM_62}")


@pytest.fixture(scope="module")
def sid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chroot]:
    with packaging_chroot(tmp_path_factory, "sid", suite="sid", download=("procps",),
                          packages=_nvidia_packages) as chroot:
        yield chroot


def pythons(chroot: Chroot) -> List[str]:
    """The chroot's Python interpreters (python3.X executables under /usr/bin)."""
    return sorted(p.name for p in (chroot.root / "usr/bin").glob("python3.*") if p.name[len("python3."):].isdigit())


def extension_origin(output: str, module: str) -> str:
    """Where ``python -v`` says the compiled extension ``module`` was loaded from."""
    prefix = f"extension module '{module}' loaded from '"
    lines = [line for line in output.splitlines() if prefix in line]
    assert lines, f"{module} was not loaded:\n{output[-3000:]}"
    return lines[0].split(prefix, 1)[1].rstrip("'")


def baseline(chroot: Chroot) -> Dict[str, str]:
    """The paired baseline (AMD 6.2, the r580/CUDA 13.0 stack) installed with no hook; the installed set."""
    ok(chroot.apt("install", "--allow-downgrades", *(f"{n}={v}" for n, v in {**BASELINE, **STACK}.items()),
                  hook=False))
    return chroot.installed()


def test_ubuntu2604_deb_installs_runs_on_python314_and_guards(sid: Chroot,
                                                              built: Callable[[str], Dict[str, Path]]) -> None:
    """apt installs the ubuntu2604 .deb on sid's python3 3.14; the CLI runs on 3.14 from the cp314 tree; the hook
    refuses a mispaired amdgpu/ROCm and a mispaired driver/CUDA transaction (installed set unchanged) and allows the
    paired ones."""
    c = sid
    root = c.root
    deb = built("ubuntu2604")["gpuguard"]
    (root / "srv/pkgs").mkdir(parents=True, exist_ok=True)
    shutil.copy2(deb, root / "srv/pkgs" / deb.name)
    assert pythons(c) == ["python3.14"]
    assert ok(c.run("python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])")).strip() == "3.14"

    out = ok(c.apt("install", f"/srv/pkgs/{deb.name}"))  # its Depends resolve on sid alone
    assert "gpuguard: warning" not in out, out
    assert sorted(p.name for p in (root / LIB.lstrip("/") / "vendor").iterdir()) == ["cp314"]
    assert list((root / LIB.lstrip("/") / "agent").glob("__pycache__/cli.cpython-314.pyc")), "postinst compiled nothing"
    version = ok(c.run("gpuguard", "--version")).strip()
    assert version == f"gpuguard {deb.name.split('_')[1].split('-')[0]}", version
    result = c.run("gpuguard", "snapshot", "--json")
    ok(result)
    snap = json.loads(result.stdout)
    assert snap["os"]["data"]["id"] == "debian"

    (root / "etc/gpuguard/policy.d/10-test.toml").write_text(TEST_POLICY + NVIDIA_POLICY)
    # The launcher as its shebang runs it (/usr/bin/python3 -IS), verbose: the compiled pydantic-core it imports is
    # 3.14's, from the cp314 tree.
    out = ok(c.run("python3", "-IS", "-v", "/usr/bin/gpuguard", "policy", "compile"))
    origin = extension_origin(out, "pydantic_core._pydantic_core")
    assert origin.startswith(f"{LIB}/vendor/cp314/pydantic_core/") and ".cpython-314-" in origin, origin
    ok(c.run("gpuguard", "policy", "compile"))
    installed = baseline(c)

    out = refused(c, "install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert "REFUSED (amd.pairing)" in out, out
    out = refused(c, "install", "cuda-toolkit-13-1")
    assert "REFUSED (nvidia.pairing)" in out and "13.1.0 (cuda-toolkit-13-1)" in out, out
    assert c.installed() == installed

    ok(c.apt("install", *PAIRED))
    assert c.installed()["rocm-core"] == ROCM_63 and c.installed()["amdgpu-dkms"] == AMDGPU_63
    ok(c.apt("install", "--allow-downgrades", *PAIRED_BACK))
    assert c.installed()["rocm-core"] == ROCM_62


def test_ubuntu2404_package_cp314_tree_runs_and_judges_on_python314(sid: Chroot, ubuntu2404: Path) -> None:
    """The ubuntu2404 .deb, unpacked (not installed) in the sid chroot, runs its launcher on python3.14 from its
    cp314 tree and its apt hook, driven by real apt, refuses mispaired transactions and allows the paired one.

    A stand-in for the real 24.04 -> 26.04 upgrade, which needs Ubuntu's archive: it shows that what the 24.04
    package ships for 3.14 works on a 3.14 interpreter, not that do-release-upgrade keeps the package installed."""
    c = sid
    root = c.root
    (root / "srv/pkgs").mkdir(parents=True, exist_ok=True)
    shutil.copy2(ubuntu2404, root / "srv/pkgs" / ubuntu2404.name)
    ok(c.run("dpkg-deb", "-x", f"/srv/pkgs/{ubuntu2404.name}", UNPACKED))
    lib = f"{UNPACKED}{LIB}"
    host_lib = root / lib.lstrip("/")
    assert sorted(p.name for p in (host_lib / "vendor").iterdir()) == ["cp312", "cp314"]
    for program in (f"{UNPACKED}/usr/bin/gpuguard", f"{lib}/gpuguard-apt-hook"):  # as tests/packaging does
        path = root / program.lstrip("/")
        text = path.read_text()
        assert f'GPUGUARD_LIB = "{LIB}"' in text, program
        path.write_text(text.replace(f'GPUGUARD_LIB = "{LIB}"', f'GPUGUARD_LIB = "{lib}"'))
    assert pythons(c) == ["python3.14"]

    assert ok(c.run(f"{UNPACKED}/usr/bin/gpuguard", "--version")).startswith("gpuguard ")
    state = root / "srv/u2404"
    state.mkdir(parents=True, exist_ok=True)
    (state / "policy.toml").write_text(TEST_POLICY + NVIDIA_POLICY)
    out = ok(c.run("python3", "-IS", "-v", f"{UNPACKED}/usr/bin/gpuguard", "policy", "compile",
                   "--policy", "/srv/u2404/policy.toml", "--output", "/srv/u2404/compiled-policy.json"))
    origin = extension_origin(out, "pydantic_core._pydantic_core")
    assert origin.startswith(f"{lib}/vendor/cp314/pydantic_core/") and ".cpython-314-" in origin, origin
    installed = baseline(c)

    hook = f"{lib}/gpuguard-apt-hook"
    hook_pyc = host_lib / "agent/guard/apt/__pycache__/hook.cpython-314.pyc"
    assert not hook_pyc.exists()  # the .deb ships no bytecode: the file appears only if this hook's code runs
    # The unpacked hook in place of the installed one (apt keys its options on the command up to its first space).
    with_hook = ("-o", f"DPkg::Pre-Install-Pkgs::gpuguard={hook} --policy-file /srv/u2404/compiled-policy.json",
                 "-o", f"DPkg::Tools::Options::{hook}::Version=3", "-o", f"DPkg::Tools::Options::{hook}::InfoFD=20")
    out = refused(c, *with_hook, "install", f"rocm-core={ROCM_63}", f"rocm-hip-runtime={ROCM_63}")
    assert "REFUSED (amd.pairing)" in out, out
    assert hook_pyc.exists(), "the unpacked ubuntu2404 hook did not run"
    out = refused(c, *with_hook, "install", "cuda-toolkit-13-1")
    assert "REFUSED (nvidia.pairing)" in out, out
    assert c.installed() == installed

    ok(c.apt(*with_hook, "install", *PAIRED))
    assert c.installed()["rocm-core"] == ROCM_63
    ok(c.apt(*with_hook, "install", "--allow-downgrades", *PAIRED_BACK))
    assert c.installed()["rocm-core"] == ROCM_62
