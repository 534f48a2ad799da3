"""The .rpm installed, upgraded and erased in an rpm root (``rpm --root``), with its scriptlets really run.

The root holds only a /bin/sh (this machine's dash and the two libraries it needs), so the scriptlets run as they
would in a bare container: no python3, no systemctl, no systemd. They must warn and exit 0, never fail.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Dict, List

import pytest

from tests.packaging.conftest import UPGRADE_VERSION, rpm, run


def files_of(root: Path, name: str) -> List[str]:
    return rpm(root, "-ql", name).stdout.splitlines()


@pytest.mark.timeout(300)
def test_rpm_install_upgrade_erase_in_an_rpm_root(rpm_root: Path, el9: Dict[str, Path], el9_upgrade: Path) -> None:
    """Files land as `rpm -qlp` lists them, scriptlets exit 0 without python/systemd, config and state survive."""
    root = rpm_root
    agent, hub = el9["gpuguard"], el9["gpuguard-hub"]
    result = rpm(root, "-i", "--nodeps", str(agent), str(hub))
    assert "no policy in /etc/gpuguard/policy.d yet" in result.stderr  # %post ran, in the root
    assert "could not byte-compile" in result.stderr                   # ... and warned: no python3 there
    listed = run(["rpm", "-qlp", str(agent)]).stdout.splitlines()
    assert listed, "rpm -qlp listed no file"
    assert files_of(root, "gpuguard") == listed
    for path in listed:
        assert os.path.lexists(root / path.lstrip("/")), path
    assert stat.S_IMODE((root / "var/lib/gpuguard").stat().st_mode) == 0o750
    assert rpm(root, "-V", "--nodeps", "gpuguard", "gpuguard-hub", check=False).stdout == ""
    assert set(rpm(root, "-qc", "gpuguard").stdout.split()) >= {"/etc/gpuguard/agent.toml",
                                                               "/etc/gpuguard/example-policy.toml"}
    assert "/etc/gpuguard/hub.toml" in rpm(root, "-qc", "gpuguard-hub").stdout.split()

    config = root / "etc/gpuguard/agent.toml"
    config.write_text(config.read_text().replace('# log_level = "info"', 'log_level = "warning"'))
    edited = config.read_text()
    (root / "var/lib/gpuguard/operator-note").write_text("kept\n")
    rpm(root, "-e", "gpuguard-hub")
    assert not (root / "usr/lib/gpuguard/vendor-hub").exists()

    rpm(root, "-U", "--nodeps", str(el9_upgrade))
    assert rpm(root, "-q", "--qf", "%{VERSION}", "gpuguard").stdout == UPGRADE_VERSION
    assert config.read_text() == edited and not (root / "etc/gpuguard/agent.toml.rpmnew").exists()
    assert (root / "var/lib/gpuguard/operator-note").read_text() == "kept\n"

    rpm(root, "-e", "gpuguard")
    assert rpm(root, "-qa").stdout.strip() == ""
    assert not (root / "usr/lib/gpuguard").exists() and not (root / "usr/bin/gpuguard").exists()
    assert (root / "etc/gpuguard/agent.toml.rpmsave").read_text() == edited  # rpm keeps an edited config
    assert (root / "var/lib/gpuguard/operator-note").is_file()               # rpm has no purge: state stays
