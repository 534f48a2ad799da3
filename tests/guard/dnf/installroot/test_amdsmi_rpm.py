"""amdsmi by its real versions under real dnf4 and rpm: on a TheRock 7.14 host (``amdrocm-amdsmi7.14``), the
packaged binding built for 7.14 (``python3-amdsmi 27.0.0.71400``: amdsmi 27.0.0 with the ROCm release folded in)
installs and a 7.1 build (``26.1.0.70100``) is refused by the plugin naming both releases."""

from __future__ import annotations

from typing import Iterator, List

import pytest

from tests.guard.dnf.installroot.conftest import compile_policy
from tests.guard.dnf.installroot.harness import FakeRpm, Installroot
from tests.guard.dnf.installroot.rollback_support import back_to_baseline, own_installroot

pytestmark = pytest.mark.timeout(600)

V714 = "7.14.0-1.el9"  # TheRock's rpm X.Y.Z with an assumed release
BINDING_714, BINDING_71 = "27.0.0.71400-1.el9", "26.1.0.70100-1.el9"
POLICY = """\
[policy]
name = "rhel9-amdsmi"
[companions]
amdsmi = true
fabricmanager = false
dcgm = false
dcgm_exporter = false
"""


def _packages() -> List[FakeRpm]:
    return [FakeRpm("amdrocm-base7.14", V714, "x86_64"),
            FakeRpm("amdrocm-amdsmi7.14", V714, "x86_64", requires=f"amdrocm-base7.14 = {V714}"),
            FakeRpm("python3-amdsmi", BINDING_71, "x86_64"),
            FakeRpm("python3-amdsmi", BINDING_714, "x86_64")]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installroot]:
    with own_installroot(tmp_path_factory, "rhel9-amdsmi", _packages(), POLICY) as root:
        compile_policy(root)
        root.dnf("install", "amdrocm-amdsmi7.14", plugin=False, check=True)
        root.save(root.root.parent / "baseline")
        yield root


@pytest.fixture
def root(session: Installroot) -> Installroot:
    return back_to_baseline(session)


def test_a_7_1_binding_is_refused_naming_both_releases(root: Installroot) -> None:
    """``dnf install python3-amdsmi-26.1.0.70100`` beside TheRock 7.14's library: refused as ROCm 7.1 against
    7.14.0, the rpm database untouched (before, the binding read as "ROCm 26.1")."""
    before = root.rpmdb_bytes()
    result = root.dnf("install", "python3-amdsmi-26.1.0.70100")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "REFUSED (companion.amdsmi)" in result.stderr, result.stderr
    assert ("python3-amdsmi 26.1.0.70100-1.el9 (amdsmi 26.1.0 for ROCm 7.1.0) needs libamd_smi of ROCm 7.1; the "
            "transaction leaves libamd_smi of ROCm 7.14.0 (amdrocm-amdsmi7.14)") in result.stderr, result.stderr
    assert root.rpmdb_bytes() == before and "python3-amdsmi" not in root.installed()


def test_the_7_14_binding_installs(root: Installroot) -> None:
    """``dnf install python3-amdsmi-27.0.0.71400`` beside TheRock 7.14's library goes through (before, it read as
    "ROCm 27.0" and was refused)."""
    result = root.dnf("install", "python3-amdsmi-27.0.0.71400")
    assert result.returncode == 0, result.stdout + result.stderr
    assert root.installed()["python3-amdsmi"].endswith("27.0.0.71400-1.el9")
