"""Rollback on a zypper host: what bypassed zypper (rpm --noplugins -U --nodeps) goes back through one zypper
install of the kept .rpm, fetched with zypper download or rebuilt from the rpm database."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.guard.dnf.installroot.harness import index_repo
from tests.guard.zypper.conftest import AMDGPU_62, BASELINE
from tests.guard.zypper.harness import ZypperHost

pytestmark = pytest.mark.timeout(600)
AMD_63_FILE = "amdgpu-dkms-6.10.5.60300-2084815.sles15.noarch.rpm"
AMD_62_FILE = "amdgpu-dkms-6.8.5.60202-2041575.sles15.noarch.rpm"


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def bypass(host: ZypperHost, repo: Path) -> None:
    """The bypass the rpm plugin cannot see: rpm --noplugins -U --nodeps of amdgpu 6.3 beside ROCm 6.2."""
    result = host.rpm("--noplugins", "-U", "--nodeps", str(repo / AMD_63_FILE))
    assert result.returncode == 0, output(result)
    assert host.installed()["amdgpu-dkms"] != AMDGPU_62


def test_a_bypass_is_rolled_back_through_zypper_from_the_kept_rpm(host: ZypperHost) -> None:
    """guard rollback records the known-good set (kept with zypper download), then takes the bypass back."""
    first = host.gpuguard("guard", "rollback")
    assert first.returncode == 0 and "recorded" in first.stdout, output(first)
    assert host.path(f"/var/lib/gpuguard/rpms/{AMD_62_FILE}").is_file()
    bypass(host, host.repo_dir)
    second = host.gpuguard("guard", "rollback")
    assert second.returncode == 0, output(second)
    assert "rolled_back (via zypper install)" in second.stdout
    assert host.installed() == BASELINE


def test_a_build_no_repository_offers_is_rebuilt_and_rolled_back(host: ZypperHost, tmp_path: Path) -> None:
    """With amdgpu 6.2 gone from the repository, its .rpm is rebuilt from the rpm database and the bypass still
    goes back to it."""
    repo = tmp_path / "repo"
    shutil.copytree(host.repo_dir, repo)
    (repo / AMD_62_FILE).unlink()
    shutil.rmtree(repo / "repodata")
    index_repo(repo, tmp_path / "work")
    host.write("/etc/zypp/repos.d/fake.repo", (host.read("/etc/zypp/repos.d/fake.repo") or "")
               .replace(f"file://{host.repo_dir}", f"file://{repo}"))
    assert host.zypper("refresh").returncode == 0
    first = host.gpuguard("guard", "rollback")
    assert first.returncode == 0 and "rebuilt" in first.stdout, output(first)
    bypass(host, repo)
    second = host.gpuguard("guard", "rollback")
    assert second.returncode == 0 and "rolled_back" in second.stdout, output(second)
    assert host.installed() == BASELINE
