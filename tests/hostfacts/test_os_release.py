"""os-release under a root: /etc first, /usr/lib as os-release(5) says, None when neither is readable."""

from __future__ import annotations

from pathlib import Path

from agent.hostfacts.os_release import read_os_release


def test_etc_os_release_wins(tmp_path: Path) -> None:
    """/etc/os-release is read when present; quotes are stripped."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text('ID=ubuntu\nVERSION_ID="24.04"\n')
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/os-release").write_text("ID=debian\n")
    assert read_os_release(str(tmp_path)) == {"ID": "ubuntu", "VERSION_ID": "24.04"}


def test_usr_lib_fallback_and_missing(tmp_path: Path) -> None:
    """Without /etc/os-release the /usr/lib copy is read; without either the answer is None."""
    assert read_os_release(str(tmp_path)) is None
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/os-release").write_bytes(b"ID=rhel\nNAME=\xff\n")
    assert read_os_release(str(tmp_path)) == {"ID": "rhel", "NAME": "\ufffd"}
