"""The rpm database: finding its files, and the one row format gpuguard asks rpm for."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.hostfacts.rpmdb import RPM_QUERY_FORMAT, parse_rpm_rows, rpm_database_files, rpm_query_argv


def test_rows_with_and_without_provides() -> None:
    """Four fields (provides comma-separated) or three; short and empty lines are skipped."""
    text = ("kernel-core\t5.14.0-570.el9\tx86_64\tkernel-core,installonlypkg(kernel),\n"
            "amdgpu-dkms\t1:6.8.5.60202-2041575.el9\tnoarch\n"
            "broken\tline\n\n"
            "gpg-pubkey\tfd431d51-4ae0493b\t(none)\t\n")
    assert list(parse_rpm_rows(text)) == [
        ("kernel-core", "5.14.0-570.el9", "x86_64", ("kernel-core", "installonlypkg(kernel)")),
        ("amdgpu-dkms", "1:6.8.5.60202-2041575.el9", "noarch", ()),
        ("gpg-pubkey", "fd431d51-4ae0493b", "(none)", ()),
    ]


def test_query_argv_uses_the_root_and_the_one_format() -> None:
    """The collector and the dnf tool ask rpm the same question."""
    assert rpm_query_argv("/r") == ["rpm", "--root", "/r", "-qa", "--qf", RPM_QUERY_FORMAT]


@pytest.mark.parametrize("directory,names,expected", [
    ("var/lib/rpm", ["rpmdb.sqlite", "rpmdb.sqlite-wal", ".rpm.lock"],
     ["/var/lib/rpm/rpmdb.sqlite", "/var/lib/rpm/rpmdb.sqlite-wal"]),
    ("usr/lib/sysimage/rpm", ["Packages"], ["/usr/lib/sysimage/rpm/Packages"]),
    ("var/lib/rpm", [".rpm.lock"], []),
])
def test_database_files(tmp_path: Path, directory: str, names: list, expected: list) -> None:
    """Only the database's own files count: a directory holding just a lock file is no database."""
    (tmp_path / directory).mkdir(parents=True)
    for name in names:
        (tmp_path / directory / name).write_text("")
    assert rpm_database_files(str(tmp_path)) == expected
