"""EL9 -> EL10 (leapp) as rpm sees it: the system Python moves from python(abi) 3.9 to 3.12 under an installed el9
gpuguard, which stays installed, verifies clean, and runs from its cp312 tree on Python 3.12 (docs/packaging.md,
"Surviving the release upgrade")."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Dict, List

import pytest

from tests.guard.dnf.installroot.harness import FakeRpm, build_rpm
from tests.packaging.conftest import REPO, need_tools, rpm, run

pytestmark = pytest.mark.timeout(600)

# The providers an EL9 and an EL10 root have for what the el9 package requires (rpm -qp --requires): the system
# Python (python(abi)), glibc, and /bin/sh for the scriptlets.
PYTHON_EL9 = FakeRpm("python3", "3.9.21-1.el9", "x86_64", provides="python(abi) = 3.9")
PYTHON_EL10 = FakeRpm("python3", "3.12.9-1.el10", "x86_64", provides="python(abi) = 3.12")
BASE = (FakeRpm("glibc", "2.34-125.el9", "x86_64"), FakeRpm("bash", "5.1.8-9.el9", "x86_64", provides="/bin/sh"))


def python_abis(root: Path) -> List[str]:
    """The python(abi) versions the root's rpm database provides."""
    found = rpm(root, "-q", "--whatprovides", "python(abi)", "--provides", check=False).stdout
    return sorted(set(re.findall(r"^python\(abi\) = (\S+)$", found, flags=re.M)))


def pyenv_python(version: str) -> Path:
    """A real interpreter of ``version`` on this machine (pyenv), or this one."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return Path(sys.executable)
    found = sorted((Path.home() / ".pyenv/versions").glob(f"{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no Python {version} interpreter on this machine (pyenv)")
    return found[-1]


def installed_launcher(root: Path, dest: Path) -> Path:
    """The root's installed /usr/bin/gpuguard, its GPUGUARD_LIB pointed at the root's /usr/lib/gpuguard."""
    text = (root / "usr/bin/gpuguard").read_text()
    marker = 'GPUGUARD_LIB = "/usr/lib/gpuguard"'
    assert marker in text
    dest.write_text(text.replace(marker, f'GPUGUARD_LIB = "{root / "usr/lib/gpuguard"}"'))
    return dest


def check_policy_with_root_python(root: Path, tmp_path: Path) -> str:
    """``gpuguard policy check`` of the example policy, run by a real interpreter of the root's python(abi)."""
    (abi,) = python_abis(root)
    launcher = installed_launcher(root, tmp_path / f"gpuguard-{abi}")
    result = run([str(pyenv_python(abi)), "-IS", str(launcher), "policy", "check",
                  str(REPO / "policies/example.toml"), "--matrix",
                  str(root / "usr/share/gpuguard/amd-compat-matrix.toml")], check=False)
    assert result.returncode == 0, result.stderr
    assert ": ok: policy 'mi300x-rocm-6.2'" in result.stdout
    return abi


def test_the_el9_package_stays_when_the_root_moves_from_python_3_9_to_3_12(
        rpm_root: Path, built: Callable[[str], Dict[str, Path]], tmp_path: Path) -> None:
    """rpm -U of python3 from python(abi) 3.9 to 3.12 with the el9 gpuguard installed (dependencies checked): the
    upgrade goes through, gpuguard stays installed and verifies clean, and its launcher runs from vendor/cp312."""
    need_tools("rpmbuild", "rpm")
    agent = built("el9")["gpuguard"]
    providers: Dict[str, Path] = {}
    for package in (*BASE, PYTHON_EL9, PYTHON_EL10):
        work = tmp_path / f"work-{package.spec}"
        work.mkdir(parents=True)
        (tmp_path / "rpms").mkdir(exist_ok=True)
        providers[package.spec] = build_rpm(package, tmp_path / "rpms", work)
    rpm(rpm_root, "-i", *(str(providers[p.spec]) for p in BASE), str(providers[PYTHON_EL9.spec]))
    rpm(rpm_root, "-i", str(agent))  # no --nodeps: its Requires are met by the EL9 root
    assert python_abis(rpm_root) == ["3.9"]
    assert check_policy_with_root_python(rpm_root, tmp_path) == "3.9"

    upgrade = rpm(rpm_root, "-U", str(providers[PYTHON_EL10.spec]), check=False)
    assert upgrade.returncode == 0, upgrade.stderr  # no "python(abi) = 3.9 is needed by gpuguard"
    assert python_abis(rpm_root) == ["3.12"]
    assert rpm(rpm_root, "-q", "gpuguard").stdout.startswith("gpuguard-")
    assert rpm(rpm_root, "-V", "gpuguard", check=False).stdout == ""
    assert rpm(rpm_root, "-q", "--whatrequires", "python(abi)").stdout.startswith("gpuguard-")
    assert check_policy_with_root_python(rpm_root, tmp_path) == "3.12"
    assert (rpm_root / "usr/lib/gpuguard/vendor/cp312/pydantic_core").is_dir()
