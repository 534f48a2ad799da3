"""The el10 .rpm's dnf guard under the machine's real dnf4 ``--installroot``, on a real Python 3.12 (EL10's): the
plugin file from the package loaded by dnf, the package's checker launcher and CLI run by Python 3.12 with
GPUGUARD_LIB pointed at the package's tree, refusing a mispaired amdgpu/ROCm and driver/CUDA transaction (installed
set unchanged) and allowing the paired one."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import pytest

from tests import needs
from tests.guard.dnf.installroot.harness import (
    AMDGPU_62,
    AMDGPU_63,
    BASELINE,
    ROCM_62,
    ROCM_63,
    TEST_POLICY,
    Installroot,
    build_repo,
    fake_rpms,
    install_specs,
    missing_tools,
)
from tests.guard.dnf.installroot.test_nvidia_stack_rpm import (
    CUDA,
    NV,
    NVIDIA_BASELINE,
    NVIDIA_POLICY,
    cuda_rpms,
    driver_rpms,
)
from tests.packaging.conftest import need_tools, run
from tests.packaging.test_build import unpack_rpm
from tests.packaging.test_release_upgrade_el9 import installed_launcher, pyenv_python

pytestmark = pytest.mark.timeout(600)

PLUGIN_DIR = "usr/lib/python3.12/site-packages/dnf-plugins"
# The installroot harness's AMD pairings with the NVIDIA stack test's section; before each transaction the AMD
# pair 6.2 with its kernel and NVIDIA's r580 with CUDA 13.0 are installed.
POLICY = TEST_POLICY + NVIDIA_POLICY
START = {**BASELINE, **NVIDIA_BASELINE}


@dataclass(frozen=True)
class El10:
    """The el10 package unpacked, the installroot whose dnf loads its plugin, the Python 3.12 running its checker
    and that checker's bytecode directory (``-X pycache_prefix``: which modules it imported, on which CPython)."""

    package: Path
    root: Installroot
    python: Path
    pycache: Path


@pytest.fixture(scope="module")
def el10(built: Callable[[str], Dict[str, Path]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[El10]:
    missing = missing_tools()
    if missing:
        needs.unavailable("installroot tests", f"missing: {', '.join(missing)}")
    need_tools("rpm2cpio", "cpio")
    python = pyenv_python("3.12")
    base = tmp_path_factory.mktemp("el10-dnf")
    package = base / "package"
    package.mkdir()
    unpack_rpm(built("el10")["gpuguard"], package)
    packages = [*fake_rpms(), *driver_rpms(NV), *cuda_rpms()]
    repo = build_repo(base / "repo", base / "rpmbuild", packages)
    root = Installroot(base / "root", repo, base / "work", plugin_dir=package / PLUGIN_DIR)
    policy_dir = root.root / "etc/gpuguard/policy.d"
    policy_dir.mkdir(parents=True)
    (policy_dir / "10-el10.toml").write_text(POLICY)
    el10 = El10(package, root, python, base / "pycache")
    compiled = compile_with_package(el10, base)
    assert f"{package}/usr/lib/gpuguard/vendor/cp312/pydantic_core/" in compiled, compiled[-3000:]
    root.dnf("install", *install_specs(START), plugin=False, check=True)
    root.save(base / "baseline")
    try:
        yield el10
    finally:
        shutil.rmtree(base, ignore_errors=True)


def compile_with_package(el10: El10, work: Path) -> str:
    """``gpuguard policy compile`` by the package's own CLI launcher on Python 3.12 (-v: its imports, on stderr)."""
    launcher = installed_launcher(el10.package, work / "gpuguard-3.12")
    # Outside a chroot the package's /usr/share/gpuguard is not at /usr/share: its tables and matrix are linked
    # where the agent looks beside its own tree (policies/, as in a source checkout).
    shared = el10.package / "usr/share/gpuguard"
    policies = el10.package / "usr/lib/gpuguard/policies"
    policies.mkdir(exist_ok=True)
    for name in ("knowledge", "amd-compat-matrix.toml"):
        (policies / name).symlink_to(shared / name)
    result = run([str(el10.python), "-IS", "-v", str(launcher), "policy", "compile", "--root", str(el10.root.root),
                  "--config", "/nonexistent/agent.toml"], check=False)
    said = [line for line in result.stderr.splitlines() if not line.startswith(("#", "import "))]
    assert result.returncode == 0, result.stdout + "\n".join(said)
    return result.stderr


@pytest.fixture
def root(el10: El10) -> Installroot:
    """The installroot reset to START, its plugin config from the package with ``checker=`` on Python 3.12."""
    root = el10.root
    root.restore(root.root.parent / "baseline")
    text = (el10.package / "etc/dnf/plugins/gpuguard.conf").read_text()
    checker = el10.root.work / "gpuguard-dnf-check"
    launcher = (el10.package / "usr/lib/gpuguard/gpuguard-dnf-check").read_text()
    marker = 'GPUGUARD_LIB = "/usr/lib/gpuguard"'
    assert marker in launcher
    checker.write_text(launcher.replace(marker, f'GPUGUARD_LIB = "{el10.package / "usr/lib/gpuguard"}"'))
    root.plugin_conf_dir.mkdir(parents=True, exist_ok=True)
    (root.plugin_conf_dir / "gpuguard.conf").write_text(
        f"{text}\nchecker={el10.python} -IS -X pycache_prefix={el10.pycache} {checker}\n")
    shutil.rmtree(el10.pycache, ignore_errors=True)
    return root


def versions(root: Installroot) -> Dict[str, str]:
    return {k.split("@", 1)[0]: v for k, v in root.installed().items()}


def refused(root: Installroot, *args: str) -> List[str]:
    """dnf ARGS under the package's plugin: exit 1 with gpuguard's REFUSED line, rpm database and files unchanged."""
    before: Tuple[Dict[str, str], Dict[str, bytes], Dict[str, bytes]] = (
        root.installed(), root.rpmdb_bytes(), root.payload_bytes())
    result = root.dnf(*args)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("Error: gpuguard: REFUSED ("), result.stderr
    assert (root.installed(), root.rpmdb_bytes(), root.payload_bytes()) == before
    return result.stderr.splitlines()


def checker_pycs(el10: El10) -> List[str]:
    """The agent modules the checker imported, as CPython wrote their bytecode under its pycache_prefix."""
    lib = el10.package / "usr/lib/gpuguard"
    base = el10.pycache / str(lib).lstrip("/")
    return sorted(str(p.relative_to(base)) for p in base.rglob("*.pyc")) if base.is_dir() else []


def test_the_package_plugin_refuses_rocm_without_its_driver_on_python_3_12(el10: El10, root: Installroot) -> None:
    """dnf upgrade rocm-core alone (ROCm 6.3 under the 6.2 driver) is refused by the el10 plugin and checker."""
    lines = refused(root, "upgrade", "rocm-core")
    assert lines[0].startswith(f"Error: gpuguard: REFUSED (amd.pairing): amdgpu-dkms {AMDGPU_62}, rocm-core "
                               f"{ROCM_62} -> {ROCM_63}: breaks the pinned AMD pairing 'rocm-6.2'"), lines
    pycs = checker_pycs(el10)
    assert "agent/guard/dnf/check.cpython-312.pyc" in pycs, pycs
    assert not [p for p in pycs if "cpython-312" not in p], pycs


def test_the_package_plugin_refuses_a_second_cuda_release_on_python_3_12(el10: El10, root: Installroot) -> None:
    """dnf install cuda-toolkit-13-1 beside the r580/CUDA 13.0 pairing is refused, naming the NVIDIA pairing."""
    lines = refused(root, "install", "cuda-toolkit-13-1")
    assert "REFUSED (nvidia.pairing)" in lines[0] and "13.1.0 (cuda-toolkit-13-1)" in lines[0], lines
    assert "agent/guard/dnf/check.cpython-312.pyc" in checker_pycs(el10)


def test_the_package_plugin_allows_the_paired_move_on_python_3_12(el10: El10, root: Installroot) -> None:
    """dnf upgrade amdgpu-dkms rocm-core together (to the 6.3 pairing) passes the el10 checker and installs."""
    result = root.dnf("upgrade", "amdgpu-dkms", "rocm-core")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "REFUSED" not in result.stderr
    after = versions(root)
    assert (after["amdgpu-dkms"], after["rocm-core"]) == (AMDGPU_63, ROCM_63)
    assert after["cuda-toolkit-13-0"] == CUDA["cuda-toolkit-13-0"]
    assert "agent/guard/dnf/check.cpython-312.pyc" in checker_pycs(el10)
