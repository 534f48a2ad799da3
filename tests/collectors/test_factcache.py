"""The on-disk fact cache: tool versions and the rpm listing, keyed on their files' identity, never an error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.collectors.containers import ContainersCollector
from agent.collectors.factcache import MISSING, FactCache, file_identity
from agent.collectors.rpm import RpmCollector, rpm_query_argv
from agent.errors import CollectorUnavailable
from agent.host import Host
from tests.fakes.runner import FakeRunner

DOCKER_OUTPUT = "Docker version 28.2.2, build e6534b4\n"
RPM_OUTPUT = "amdgpu-dkms\t1:6.14.14-2204008.el9\tnoarch\tamdgpu-dkms,\nbash\t5.1.8-9.el9\tx86_64\t\n"


def _docker_host(root: Path, state_dir: bool = True) -> tuple:
    if state_dir:
        (root / "var/lib/gpuguard").mkdir(parents=True)
    docker = root / "usr/bin/docker"
    docker.parent.mkdir(parents=True)
    docker.write_text("#!/bin/sh\n")
    docker.chmod(0o755)
    runner = FakeRunner()
    runner.add([str(docker), "--version"], stdout=DOCKER_OUTPUT)
    return Host(root=root, runner=runner), runner, docker


def _docker_version(host: Host) -> object:
    return ContainersCollector().collect(host).tools["docker"].version


def test_cached_version_is_used_by_a_later_process(tmp_path: Path) -> None:
    """The version is written under the state directory and read back by a new collector without running docker."""
    host, runner, _ = _docker_host(tmp_path)
    assert _docker_version(host) == "28.2.2"
    cache = json.loads((tmp_path / "var/lib/gpuguard/cache/tool-versions.json").read_text())
    assert cache["docker"]["value"] == "28.2.2"
    runner.calls.clear()
    assert _docker_version(host) == "28.2.2"
    assert runner.calls == []


def test_changed_binary_is_asked_again(tmp_path: Path) -> None:
    """A binary with another size, mtime or inode (an upgrade) misses the cache."""
    host, runner, docker = _docker_host(tmp_path)
    _docker_version(host)
    docker.write_text("#!/bin/sh\n# upgraded\n")
    runner.calls.clear()
    assert _docker_version(host) == "28.2.2"
    assert len(runner.calls) == 1
    os.utime(docker, ns=(1, 1))
    runner.calls.clear()
    _docker_version(host)
    assert len(runner.calls) == 1


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"docker": "28.2.2"}', '{"docker": {"identity": 1}}',
                                    "\xff\xfe", ""])
def test_damaged_cache_is_ignored_and_rewritten(tmp_path: Path, damage: str) -> None:
    """Whatever the file holds, the tool is asked and the file rewritten; never an error."""
    host, runner, _ = _docker_host(tmp_path)
    path = tmp_path / "var/lib/gpuguard/cache/tool-versions.json"
    path.parent.mkdir()
    path.write_bytes(damage.encode("latin-1"))
    assert _docker_version(host) == "28.2.2"
    assert len(runner.calls) == 1
    assert json.loads(path.read_text())["docker"]["value"] == "28.2.2"


def test_unwritable_cache_runs_the_tool_every_time(tmp_path: Path) -> None:
    """A cache directory that cannot be written (here: a file in its place) means the tool is simply run."""
    host, runner, _ = _docker_host(tmp_path)
    (tmp_path / "var/lib/gpuguard/cache").write_text("not a directory")
    for _ in range(2):
        assert _docker_version(host) == "28.2.2"
    assert len(runner.calls) == 2


def test_no_state_directory_writes_nothing(tmp_path: Path) -> None:
    """A root without /var/lib/gpuguard (a fixture tree, an uninstalled agent) gets no cache created in it."""
    host, runner, _ = _docker_host(tmp_path, state_dir=False)
    for _ in range(2):
        assert _docker_version(host) == "28.2.2"
    assert len(runner.calls) == 2
    assert not (tmp_path / "var/lib/gpuguard").exists()


def test_get_answers_only_for_the_stored_identity(tmp_path: Path) -> None:
    """A fact comes back for exactly the identity it was stored with; no identity stores nothing."""
    (tmp_path / "var/lib/gpuguard").mkdir(parents=True)
    (tmp_path / "f").write_text("x")
    identity = file_identity(str(tmp_path / "f"))
    cache = FactCache(Host(root=tmp_path), "t")
    cache.put("a", identity, "1")
    cache.put("b", None, "2")
    cache.save()
    again = FactCache(Host(root=tmp_path), "t")
    assert again.get("a", identity) == "1"
    assert again.get("a", [*identity[:3], 99, identity[4]]) is MISSING
    assert again.get("b", None) is MISSING
    assert file_identity(str(tmp_path / "missing")) is None


def _rpm_host(root: Path) -> tuple:
    (root / "var/lib/gpuguard").mkdir(parents=True)
    (root / "var/lib/rpm").mkdir(parents=True)
    (root / "var/lib/rpm/rpmdb.sqlite").write_text("db")
    runner = FakeRunner()
    runner.add(rpm_query_argv(str(root)), stdout=RPM_OUTPUT)
    return Host(root=root, runner=runner), runner


def test_rpm_listing_is_cached_until_the_database_changes(tmp_path: Path) -> None:
    """rpm runs once for an unchanged database; a changed or added database file runs it again."""
    host, runner = _rpm_host(tmp_path)
    first = RpmCollector().collect(host)
    assert first.installed_count == 2 and first.packages["amdgpu-dkms"].version == "1:6.14.14-2204008.el9"
    assert RpmCollector().collect(host) == first
    assert len(runner.calls) == 1
    (tmp_path / "var/lib/rpm/rpmdb.sqlite-wal").write_text("a transaction")
    assert RpmCollector().collect(host) == first
    assert len(runner.calls) == 2
    (tmp_path / "var/lib/rpm/rpmdb.sqlite").write_text("db, one package more")
    RpmCollector().collect(host)
    assert len(runner.calls) == 3


def test_rpm_listing_is_not_cached_when_the_database_changed_during_the_query(tmp_path: Path) -> None:
    """A package installed while rpm read the database: the listing is used once, not kept."""
    host, runner = _rpm_host(tmp_path)

    def changing(argv, timeout_seconds):
        (tmp_path / "var/lib/rpm/rpmdb.sqlite").write_text("db, changed meanwhile")
        return runner(argv, timeout_seconds)

    changing_host = Host(root=tmp_path, runner=changing)
    RpmCollector().collect(changing_host)
    RpmCollector().collect(host)
    assert len(runner.calls) == 2


def test_rpm_empty_database_is_cached_and_still_absent(tmp_path: Path) -> None:
    """An empty listing is cached too, and the section stays absent."""
    host, runner = _rpm_host(tmp_path)
    runner.add(rpm_query_argv(str(tmp_path)), stdout="")
    for _ in range(2):
        with pytest.raises(CollectorUnavailable, match="empty"):
            RpmCollector().collect(host)
    assert len(runner.calls) == 1
