"""Container runtime and toolkit versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.collectors.containers import ContainersCollector, parse_docker_daemon_json, parse_tool_version
from agent.errors import CollectorUnavailable
from agent.host import Host
from tests.fakes.runner import FakeRunner


@pytest.mark.parametrize("output,expected", [
    ("Docker version 28.2.2, build e6534b4\n", "28.2.2"),
    ("containerd containerd.io 1.7.22 7f7fdf5fed64eb6a7caf99b3e12efcf9d60e311c\n", "1.7.22"),
    ("containerd github.com/containerd/containerd/v2 v2.0.4 1a43cb6a1035441f9aca8f5666a9b3ef9e70ab20\n", "2.0.4"),
    ("runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\ngo: go1.19.8\n", "1.1.5+ds1"),
    ("podman version 4.9.4-rhel\n", "4.9.4-rhel"),
    ("crun version 1.14.4\ncommit: a220ca661ce078f2c37b38c92e66cf66c012d9c1\n", "1.14.4"),
    ("NVIDIA Container Toolkit CLI version 1.17.8\ncommit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d\n", "1.17.8"),
    ("cli-version: 1.17.8\nlib-version: 1.17.8\nbuild date: 2025-05-30\n", "1.17.8"),
    ("no version here\n", None),
])
def test_parse_tool_version(output: str, expected) -> None:
    """The tool's own version is the first versioned line, not the commit or Go version."""
    assert parse_tool_version(output) == expected


def test_parse_docker_daemon_json_runtimes() -> None:
    """Registered runtimes and the default one are read from daemon.json."""
    text = '{"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}'
    assert parse_docker_daemon_json(text) == ("nvidia", ["nvidia"])
    with pytest.raises(ValueError):
        parse_docker_daemon_json("[1, 2]")


def _executable(root: Path, rel: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(0o755)


def test_collector_survives_failing_tool_and_bad_daemon_json(tmp_path: Path) -> None:
    """A tool that times out keeps its path with no version; an invalid daemon.json is logged, not fatal."""
    _executable(tmp_path, "usr/bin/docker")
    _executable(tmp_path, "usr/bin/nvidia-ctk")
    (tmp_path / "etc/docker").mkdir(parents=True)
    (tmp_path / "etc/docker/daemon.json").write_text("{not json")
    runner = FakeRunner()
    runner.add([str(tmp_path / "usr/bin/docker"), "--version"], timeout=True)
    runner.add([str(tmp_path / "usr/bin/nvidia-ctk"), "--version"],
               stdout="NVIDIA Container Toolkit CLI version 1.17.8\ncommit: abc\n")
    info = ContainersCollector().collect(Host(root=tmp_path, runner=runner))
    assert info.tools["docker"].version is None
    assert info.tools["nvidia-container-toolkit"].version == "1.17.8"
    assert info.docker_default_runtime is None


def test_absent_without_any_tool(tmp_path: Path) -> None:
    """A host with no container tooling reports the section absent."""
    with pytest.raises(CollectorUnavailable):
        ContainersCollector().collect(Host(root=tmp_path, runner=FakeRunner()))


def test_tool_version_is_asked_once_per_binary_identity(tmp_path: Path) -> None:
    """``docker --version`` runs once while the binary is unchanged; a replaced binary is asked again."""
    (tmp_path / "var/lib/gpuguard").mkdir(parents=True)
    _executable(tmp_path, "usr/bin/docker")
    docker = tmp_path / "usr/bin/docker"
    calls = []
    runner = FakeRunner()
    runner.add([str(docker), "--version"], stdout="Docker version 28.2.2, build e6534b4\n")

    def counting(argv, timeout_seconds):
        calls.append(list(argv))
        return runner(argv, timeout_seconds)

    host = Host(root=tmp_path, runner=counting)
    for _ in range(3):
        assert ContainersCollector().collect(host).tools["docker"].version == "28.2.2"
    assert len(calls) == 1
    docker.write_text("#!/bin/sh\n# upgraded, a different size\nexit 1\n")
    assert ContainersCollector().collect(host).tools["docker"].version == "28.2.2"
    assert len(calls) == 2


def test_failed_tool_version_is_asked_again(tmp_path: Path) -> None:
    """A timeout is not cached: the next snapshot asks the tool again."""
    (tmp_path / "var/lib/gpuguard").mkdir(parents=True)
    _executable(tmp_path, "usr/bin/docker")
    calls = []
    runner = FakeRunner()
    runner.add([str(tmp_path / "usr/bin/docker"), "--version"], timeout=True)

    def counting(argv, timeout_seconds):
        calls.append(list(argv))
        return runner(argv, timeout_seconds)

    host = Host(root=tmp_path, runner=counting)
    for _ in range(2):
        assert ContainersCollector().collect(host).tools["docker"].version is None
    assert len(calls) == 2
