"""The zypper rollback tool's pure parts: rollback lines as zypper install arguments, zypper's XML plan."""

from __future__ import annotations

import pytest

from agent.errors import InputFileError
from agent.guard.rollback.backend import PlannedStep
from agent.guard.zypper.tool import install_args, parse_install_summary

PLAN = """<?xml version='1.0'?>
<stream>
<message type="info">Resolving package dependencies...</message>
<install-summary download-size="6490" packages-to-change="2">
<to-downgrade>
<solvable type="package" name="amdgpu-dkms" edition="1:6.8.5-1" arch="noarch" edition-old="1:6.10.5-1"/>
</to-downgrade>
<to-remove>
<solvable type="package" name="kernel-default" edition="6.4.0-150700.53.3" arch="x86_64"/>
</to-remove>
</install-summary>
</stream>
"""


def test_lines_become_files_builds_and_bang_removals() -> None:
    """A kept file stays a path, a build becomes name=EVR, a removal !NEVRA (zypper's remove-in-install mark)."""
    lines = ["install /var/lib/gpuguard/rpms/amdgpu-dkms-6.8.5-1.noarch.rpm",
             "install rocm-core-6.2.2-116.sles15.x86_64", "remove kernel-default-6.4.0-150700.53.3.x86_64"]
    assert install_args(lines) == ["/var/lib/gpuguard/rpms/amdgpu-dkms-6.8.5-1.noarch.rpm",
                                   "rocm-core=6.2.2-116.sles15", "!kernel-default-6.4.0-150700.53.3.x86_64"]


def test_the_install_summary_is_the_plan() -> None:
    """to-downgrade and to-remove solvables become planned steps with their old and new editions."""
    assert parse_install_summary(PLAN) == [PlannedStep("downgrade", "amdgpu-dkms", "1:6.10.5-1", "1:6.8.5-1"),
                                           PlannedStep("remove", "kernel-default", "6.4.0-150700.53.3", "")]


def test_output_that_is_not_xml_is_named() -> None:
    """A cut or foreign answer is an InputFileError naming zypper's command, never a traceback."""
    with pytest.raises(InputFileError, match="zypper --xmlout install --dry-run"):
        parse_install_summary("<stream><install-summary>")
