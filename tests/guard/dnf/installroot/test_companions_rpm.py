"""Companion pairings under real dnf4 and rpm: NVIDIA's RHEL 9 driver with fabric manager and NSCQ (which require
nothing of the driver's build), and DCGM 4's split packages; the plugin refuses the transactions that split them."""

from __future__ import annotations

from typing import Dict, Iterator, List

import pytest

from tests.guard.dnf.installroot.conftest import compile_policy
from tests.guard.dnf.installroot.harness import FakeRpm, Installroot, install_specs
from tests.guard.dnf.installroot.rollback_support import back_to_baseline, own_installroot

pytestmark = pytest.mark.timeout(600)

NV, NV_NEW = "3:580.95.05-1.el9", "3:580.105.08-1.el9"
FM, FM_NEW = "580.95.05-1", "580.105.08-1"
DCGM, DCGM_NEW = "1:4.7.0-1", "1:4.7.1-1"
POLICY = """\
[policy]
name = "rhel9-companions"
[companions]
"""


def _packages() -> List[FakeRpm]:
    out: List[FakeRpm] = []
    for evr, fm, dcgm in ((NV, FM, DCGM), (NV_NEW, FM_NEW, DCGM_NEW)):
        out += [
            FakeRpm("nvidia-kmod-common", evr),
            FakeRpm("nvidia-driver-libs", evr, "x86_64"),
            FakeRpm("nvidia-driver", evr, "x86_64", requires=f"nvidia-driver-libs = {evr}, nvidia-kmod-common = {evr}"),
            FakeRpm("nvidia-fabricmanager-580", fm, "x86_64"),
            FakeRpm("libnvidia-nscq-580", fm, "x86_64"),
            FakeRpm("datacenter-gpu-manager-4-core", dcgm, "x86_64"),
            FakeRpm("datacenter-gpu-manager-4-cuda13", dcgm, "x86_64", requires="datacenter-gpu-manager-4-core"),
        ]
    return out


BASELINE = {p.name: p.evr for p in _packages() if p.evr in (NV, FM, DCGM)}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installroot]:
    with own_installroot(tmp_path_factory, "rhel9-companions", _packages(), POLICY) as root:
        compile_policy(root)
        root.dnf("install", *install_specs(BASELINE), plugin=False, check=True)
        root.save(root.root.parent / "baseline")
        yield root


@pytest.fixture
def root(session: Installroot) -> Installroot:
    return back_to_baseline(session)


def _versions(root: Installroot) -> Dict[str, str]:
    return {k: v for k, v in root.installed().items() if k in BASELINE}


def _refused(root: Installroot, *args: str) -> str:
    before = root.rpmdb_bytes()
    result = root.dnf(*args)
    assert result.returncode == 1, result.stdout + result.stderr
    assert _versions(root) == BASELINE and root.rpmdb_bytes() == before
    return result.stderr


def test_driver_upgrade_leaving_fabric_manager_behind_is_refused(root: Installroot) -> None:
    """``dnf upgrade nvidia-driver`` moves the driver's parts (their ``=`` requires) and not fabric manager: the
    plugin refuses, naming both builds, and the rpm database is untouched."""
    out = _refused(root, "upgrade", "nvidia-driver")
    assert "REFUSED (companion.fabricmanager)" in out, out
    assert "nvidia-fabricmanager-580 580.95.05 needs driver 580.95.05; the transaction leaves driver 580.105.08" in out


def test_half_a_dcgm_upgrade_is_refused(root: Installroot) -> None:
    """``dnf upgrade datacenter-gpu-manager-4-core`` without -cuda13: DCGM 4.7.1 beside 4.7.0, refused."""
    out = _refused(root, "upgrade", "datacenter-gpu-manager-4-core")
    assert "REFUSED (companion.dcgm)" in out, out
    assert "4.7.0 (datacenter-gpu-manager-4-cuda13), 4.7.1 (datacenter-gpu-manager-4-core)" in out, out


def test_the_driver_with_fabric_manager_and_dcgm_whole_pass(root: Installroot) -> None:
    """Everything moving together to the new builds goes through."""
    result = root.dnf("upgrade", "nvidia-driver", "nvidia-fabricmanager-580", "libnvidia-nscq-580",
                      "datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda13")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _versions(root) == {p.name: p.evr for p in _packages() if p.evr in (NV_NEW, FM_NEW, DCGM_NEW)}
