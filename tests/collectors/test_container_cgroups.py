"""The container runtimes' cgroup driver, the NVIDIA toolkit and /dev/char links, and the finding they make."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import pytest

from agent.collectors.base import Section, Status
from agent.collectors.container_cgroups import (
    FIX,
    ContainerCgroupsCollector,
    ContainerCgroupsInfo,
    parse_containerd_systemd_cgroup,
    parse_device_minor,
    parse_docker_cgroup_driver,
    parse_proc_devices,
)
from agent.errors import CollectorUnavailable
from agent.frozen import replace
from agent.host import Host
from agent.snapshot.drift import analyze
from agent.snapshot.io import validate_snapshot
from agent.snapshot.model import Snapshot
from agent.snapshot.take import take_snapshot
from tests.conftest import make_fixture_host

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
226 drm
508 nvidia-uvm
509 nvidia-caps

Block devices:
  8 sd
"""
INFORMATION = ("Model: \t\t NVIDIA H200\nIRQ:   \t\t 16\nGPU UUID: \t GPU-1\nDevice Minor: \t %d\n"
               "Bus Location: \t 0000:18:00.0\n")
CONTAINERD_V2 = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""
CONTAINERD_V3 = """version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = false
"""


@pytest.mark.parametrize("text,expected", [
    ('{"exec-opts": ["native.cgroupdriver=systemd"]}', "systemd"),
    ('{"exec-opts": ["native.cgroupdriver=systemd", "native.cgroupdriver=cgroupfs"]}', "cgroupfs"),
    ('{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}', None),
    ("", None),
])
def test_parse_docker_cgroup_driver(text: str, expected: Optional[str]) -> None:
    """exec-opts' native.cgroupdriver (the last one wins, as in dockerd); None when it is not set."""
    assert parse_docker_cgroup_driver(text) == expected


def test_parse_docker_cgroup_driver_refuses_what_is_not_an_object() -> None:
    """A daemon.json that is not a JSON object is a ValueError."""
    with pytest.raises(ValueError):
        parse_docker_cgroup_driver("[1]")


@pytest.mark.parametrize("text,expected", [(CONTAINERD_V2, True), (CONTAINERD_V3, False), ("version = 2\n", None)])
def test_parse_containerd_systemd_cgroup(text: str, expected: Optional[bool]) -> None:
    """runc's SystemdCgroup in containerd's version 2 and 3 layouts; None when it is not set."""
    assert parse_containerd_systemd_cgroup(text) is expected


def test_parse_containerd_refuses_what_is_not_toml() -> None:
    """A config.toml that is not TOML is a ValueError."""
    with pytest.raises(ValueError):
        parse_containerd_systemd_cgroup("[plugins\n")


def test_parse_proc_devices_and_device_minor() -> None:
    """Character majors by name (block devices left out), and a GPU's Device Minor."""
    assert parse_proc_devices(PROC_DEVICES) == {"mem": 1, "nvidia-frontend": 195, "drm": 226, "nvidia-uvm": 508,
                                                "nvidia-caps": 509}
    assert parse_device_minor(INFORMATION % 3) == 3
    assert parse_device_minor("Model: x\n") is None


def _root(tmp_path: Path, daemon_json: Optional[str] = '{"exec-opts": ["native.cgroupdriver=systemd"]}',
          links: tuple = (), toolkit: bool = True, gpus: int = 2) -> Host:
    """A fixture tree of an NVIDIA host with docker (and its daemon.json), written under tmp_path."""
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc/devices").write_text(PROC_DEVICES)
    for minor in range(gpus):
        bus = root / f"proc/driver/nvidia/gpus/0000:{0x18 + minor:02x}:00.0"
        bus.mkdir(parents=True)
        (bus / "information").write_text(INFORMATION % minor)
    if daemon_json is not None:
        (root / "etc/docker").mkdir(parents=True)
        (root / "etc/docker/daemon.json").write_text(daemon_json)
    if toolkit:
        (root / "usr/bin").mkdir(parents=True)
        ctk = root / "usr/bin/nvidia-ctk"
        ctk.write_text("#!/bin/sh\n")
        ctk.chmod(0o755)
    (root / "dev/char").mkdir(parents=True)
    for link in links:
        os.symlink(f"../nvidia{link.split(':')[1]}", root / "dev/char" / link)  # dangling here, as in a fixture
    return Host.for_root(str(root))


def test_collector_finds_the_missing_links(tmp_path: Path) -> None:
    """Two GPUs, nvidiactl and nvidia-uvm are expected; the one link present is not reported missing."""
    info = ContainerCgroupsCollector().collect(_root(tmp_path, links=("195:0",)))
    assert info.docker_cgroup_driver == "systemd" and info.docker_cgroup_driver_source == "daemon.json"
    assert info.containerd_systemd_cgroup is None and info.nvidia_container_toolkit
    assert info.nvidia_devices == ["195:0", "195:1", "195:255", "508:0"]
    assert info.dev_char_missing == ["195:1", "195:255", "508:0"]


def test_docker_default_driver_follows_the_cgroup_version(tmp_path: Path) -> None:
    """Without exec-opts dockerd picks systemd on a cgroup v2 host and cgroupfs on cgroup v1."""
    host = _root(tmp_path, daemon_json="{}")
    info = ContainerCgroupsCollector().collect(host)
    assert (info.docker_cgroup_driver, info.docker_cgroup_driver_source) == ("cgroupfs", "default (cgroup v1)")
    host.path("/sys/fs/cgroup").mkdir(parents=True)
    host.path("/sys/fs/cgroup/cgroup.controllers").write_text("cpu memory\n")
    info = ContainerCgroupsCollector().collect(host)
    assert (info.docker_cgroup_driver, info.docker_cgroup_driver_source) == ("systemd", "default (cgroup v2)")


def test_containerd_config_is_read(tmp_path: Path) -> None:
    """containerd's SystemdCgroup = true makes containerd a systemd-driver runtime."""
    host = _root(tmp_path, daemon_json=None)
    host.path("/etc/containerd").mkdir(parents=True)
    host.path("/etc/containerd/config.toml").write_text(CONTAINERD_V2)
    info = ContainerCgroupsCollector().collect(host)
    assert info.docker_cgroup_driver is None and info.containerd_systemd_cgroup is True
    assert info.systemd_cgroup_runtimes == ["containerd"]


def test_collector_is_absent_without_an_nvidia_driver_or_a_runtime(tmp_path: Path) -> None:
    """No /proc/driver/nvidia/gpus, or neither docker nor containerd: nothing to say."""
    with pytest.raises(CollectorUnavailable, match="no NVIDIA driver"):
        ContainerCgroupsCollector().collect(_root(tmp_path / "a", gpus=0))
    with pytest.raises(CollectorUnavailable, match="neither docker nor containerd"):
        ContainerCgroupsCollector().collect(_root(tmp_path / "b", daemon_json=None))


def _snapshot_with(info: ContainerCgroupsInfo) -> Snapshot:
    base = take_snapshot(make_fixture_host("gpuless-debian12"))
    return replace(base, container_cgroups=Section(status=Status.OK, data=info))


def test_the_risky_combination_is_a_finding_with_its_fix(tmp_path: Path) -> None:
    """systemd driver + toolkit + missing links: one warning that names the runtimes, the devices and the fix."""
    info = ContainerCgroupsCollector().collect(_root(tmp_path))
    findings = [f for f in analyze(_snapshot_with(info)) if f.component == "containers"]
    assert [(f.kind, f.severity) for f in findings] == [("gpu_containers_lose_devices_on_daemon_reload", "warning")]
    assert findings[0].details == {"runtimes": "docker", "missing": "195:0 195:1 195:255 508:0", "fix": FIX,
                                   "docker_cgroup_driver_source": "daemon.json"}
    assert FIX in findings[0].message and "daemon-reload" in findings[0].message


@pytest.mark.parametrize("change", [
    {"dev_char_missing": []},                     # the links are there (nvidia-ctk ran)
    {"nvidia_container_toolkit": False},          # no toolkit: no GPU containers this way
    {"docker_cgroup_driver": "cgroupfs"},         # cgroupfs driver: systemd does not own the device rules
])
def test_without_the_whole_combination_there_is_no_finding(tmp_path: Path, change: dict) -> None:
    """Links present, no toolkit, or the cgroupfs driver: no finding."""
    info = replace(ContainerCgroupsCollector().collect(_root(tmp_path)), **change)
    assert not [f for f in analyze(_snapshot_with(info)) if f.component == "containers"]


def test_a_stored_snapshot_without_the_section_still_reads() -> None:
    """Snapshots stored before the section existed read back with it absent ("not collected")."""
    snap = take_snapshot(make_fixture_host("gpuless-debian12"))
    stored = json.loads(snap.to_json())
    del stored["container_cgroups"]
    again = validate_snapshot(stored)
    assert again.container_cgroups.status == Status.ABSENT and again.container_cgroups.reason == "not collected"
