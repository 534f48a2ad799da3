"""os-release parsing and the OS family."""

from __future__ import annotations

import pytest

from agent.collectors.os_release import OsReleaseCollector, parse_os_release
from agent.errors import CollectorUnavailable
from agent.host import Host


@pytest.mark.parametrize("text,expected_id,version_id,family", [
    ('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\n', "ubuntu", "22.04", "debian"),
    ('ID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.6"\n', "rhel", "9.6", "rhel"),
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n', "rocky", "9.4", "rhel"),
    ('ID="sles"\nVERSION_ID="15.6"\n', "sles", "15.6", "suse"),
    ("# no ID at all\nNAME=Linux\n", "linux", None, "linux"),
])
def test_parse_os_release(text: str, expected_id: str, version_id, family: str) -> None:
    """IDs, versions and families come out of real-world os-release files."""
    parsed = parse_os_release(text)
    assert parsed.id == expected_id
    assert parsed.version_id == version_id
    assert parsed.family == family


def test_falls_back_to_usr_lib_os_release(tmp_path) -> None:
    """/usr/lib/os-release is read when /etc/os-release is missing."""
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/os-release").write_text("ID=fedora\nVERSION_ID=41\n")
    assert OsReleaseCollector().collect(Host(root=tmp_path)).id == "fedora"


def test_absent_without_any_os_release(tmp_path) -> None:
    """No os-release at all is absent, not an error."""
    with pytest.raises(CollectorUnavailable):
        OsReleaseCollector().collect(Host(root=tmp_path))
