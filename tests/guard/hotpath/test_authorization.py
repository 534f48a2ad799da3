"""The rollback authorization opens the guard for exactly the known-good set, root-only and briefly, nothing else."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from agent.guard.hotpath.authorization import authorizing, render

NOW = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.timezone.utc)
TARGET = {"amdgpu-dkms": "1:6.8.5.60202-2041575.24.04", "rocm-core": "6.2.2.60202-116~24.04"}
GUARDED = ["amdgpu-dkms*", "rocm-core"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the file must be root-owned to be honoured")


def _write(tmp_path: Path, mode: int = 0o600, minutes: int = 15, target: dict = TARGET) -> str:
    path = tmp_path / "rollback-authorization.json"
    path.write_text(render(target, "frozen", NOW, NOW + dt.timedelta(minutes=minutes), "abc123"))
    path.chmod(mode)
    return str(path)


def test_exact_resulting_set_is_authorized_and_unguarded_packages_do_not_matter(tmp_path: Path) -> None:
    """The guarded part of the resulting set equals the target: honoured."""
    grant = authorizing(_write(tmp_path), NOW, {**TARGET, "vim": "2:9.1"}, GUARDED)
    assert grant is not None and grant["id"] == "abc123"


@pytest.mark.parametrize("after", [
    {**TARGET, "rocm-core": "6.3.0.60300-39~24.04"},  # another version
    {"amdgpu-dkms": TARGET["amdgpu-dkms"]},  # a package missing
    {**TARGET, "amdgpu-dkms-firmware": "1:6.10.5"},  # a guarded package more
])
def test_any_other_resulting_set_is_not_authorized(tmp_path: Path, after: dict) -> None:
    """The authorization names one set; every other transaction is decided as always."""
    assert authorizing(_write(tmp_path), NOW, after, GUARDED) is None


def test_expired_group_readable_linked_or_malformed_files_are_ignored(tmp_path: Path) -> None:
    """Past its expiry, with any group/other bit, through a symlink, or not our JSON: no authorization."""
    assert authorizing(_write(tmp_path, minutes=0), NOW, TARGET, GUARDED) is None
    assert authorizing(_write(tmp_path, mode=0o640), NOW, TARGET, GUARDED) is None
    real = _write(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert authorizing(str(link), NOW, TARGET, GUARDED) is None
    Path(real).write_text("{not json")
    assert authorizing(real, NOW, TARGET, GUARDED) is None
    assert authorizing(str(tmp_path / "missing.json"), NOW, TARGET, GUARDED) is None
