"""Whether a systemd daemon-reload can cut the GPUs off running containers on this host.

NVIDIA's notice (nvidia-docker #1730, nvidia-container-toolkit #48, still reported in #1227 and #1744): when docker
or containerd use the systemd cgroup driver, systemd owns each container's device cgroup and names the allowed
devices by their ``/dev/char/MAJOR:MINOR`` path. The NVIDIA device nodes are made by nvidia-modprobe, not udev,
so those links are missing; on the next ``systemctl daemon-reload`` (any package's maintainer script may run one)
systemd re-applies the rules without the GPUs, and CUDA in running containers fails with "Failed to initialize
NVML: Unknown Error". The fix is the links: ``nvidia-ctk system create-dev-char-symlinks --create-all``, kept
across reboots and driver reloads by a udev rule that runs it.

This collector reads the facts (the runtimes' cgroup driver, the toolkit, the NVIDIA devices and their links);
``agent/snapshot/drift.py`` turns the risky combination into a finding. Everything is read through the Host, so a
fixture tree stands in for a host: the devices come from /proc/devices and /proc/driver/nvidia, not from stat()
of device nodes.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from agent.errors import CollectorUnavailable
from agent.frozen import Frozen, field, frozen_record
from agent.host import Host
from agent.lazyre import LazyPattern
from agent.log import get_logger
from agent.tomlreader import toml_module

log = get_logger("collectors.container_cgroups")

DOCKER_DAEMON_JSON = "/etc/docker/daemon.json"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"
# Programs and files that say the NVIDIA container toolkit is installed (a runtime hook or the CDI tooling).
TOOLKIT_PROGRAMS = ("nvidia-ctk", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-cli")
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
# /proc/devices names of the character majors containers need: the GPUs and nvidiactl, and nvidia-uvm (CUDA).
FRONTEND_NAMES = ("nvidia-frontend", "nvidia")
UVM_NAME = "nvidia-uvm"
NVIDIACTL_MINOR = 255
FIX = "nvidia-ctk system create-dev-char-symlinks --create-all"

_CGROUP_DRIVER = LazyPattern(r"^native\.cgroupdriver\s*=\s*(\S+)$")


@frozen_record
class ContainerCgroupsInfo(Frozen):
    """The container runtimes' cgroup driver, the NVIDIA toolkit, and the NVIDIA devices without /dev/char links."""

    docker_cgroup_driver: Optional[str] = None       # "systemd" | "cgroupfs"; None without docker
    docker_cgroup_driver_source: Optional[str] = None  # "daemon.json" | "default (cgroup v2)" | "default (cgroup v1)"
    containerd_systemd_cgroup: Optional[bool] = None   # runc's SystemdCgroup in config.toml; None without the file
    nvidia_container_toolkit: bool = False
    # "MAJOR:MINOR" of the NVIDIA devices containers get, and those of them with no /dev/char/MAJOR:MINOR entry.
    nvidia_devices: List[str] = field(default_factory=list)
    dev_char_missing: List[str] = field(default_factory=list)

    @property
    def systemd_cgroup_runtimes(self) -> List[str]:
        """The runtimes that use the systemd cgroup driver."""
        out = []
        if self.docker_cgroup_driver == "systemd":
            out.append("docker")
        if self.containerd_systemd_cgroup:
            out.append("containerd")
        return out


def parse_docker_cgroup_driver(text: str) -> Optional[str]:
    """``native.cgroupdriver`` from daemon.json's ``exec-opts``; None when it is not set. ValueError: not JSON."""
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError("daemon.json is not a JSON object")
    options = data.get("exec-opts") or []
    if not isinstance(options, list):
        return None
    driver = None
    for option in options:  # dockerd takes the last one given
        match = _CGROUP_DRIVER.match(str(option).strip())
        if match:
            driver = match.group(1)
    return driver


def parse_containerd_systemd_cgroup(text: str) -> Optional[bool]:
    """runc's ``SystemdCgroup`` from containerd's config.toml (version 2 or 3 layout); None when it is not set.

    Raises ValueError when the file is not TOML.
    """
    tomllib = toml_module()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(str(exc)) from None
    found: List[bool] = []

    def visit(table: Dict[str, Any], path: Tuple[str, ...]) -> None:
        for key, value in table.items():
            if isinstance(value, dict):
                visit(value, (*path, key))
            elif key == "SystemdCgroup" and isinstance(value, bool) and "runc" in path:
                found.append(value)

    visit(data, ())
    return any(found) if found else None


def parse_proc_devices(text: str) -> Dict[str, int]:
    """Character device names -> majors from /proc/devices (the block devices are left out)."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        if line.strip().startswith("Block devices"):
            break
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            out.setdefault(parts[1], int(parts[0]))
    return out


def parse_device_minor(information: str) -> Optional[int]:
    """``Device Minor:`` from /proc/driver/nvidia/gpus/BUS/information."""
    for line in information.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Device Minor" and value.strip().isdigit():
            return int(value.strip())
    return None


class ContainerCgroupsCollector:
    """Reads the cgroup driver of docker and containerd, the toolkit and the NVIDIA /dev/char links."""

    name = "container_cgroups"

    def collect(self, host: Host) -> ContainerCgroupsInfo:
        if not host.is_dir(NVIDIA_GPUS_DIR):
            raise CollectorUnavailable("no NVIDIA driver loaded (no /proc/driver/nvidia/gpus)")
        docker, docker_source = self._docker(host)
        containerd = self._containerd(host)
        if docker is None and containerd is None:
            raise CollectorUnavailable("neither docker nor containerd is configured")
        devices = self._nvidia_devices(host)
        missing = [dev for dev in devices if not host.exists(f"/dev/char/{dev}")]
        toolkit = any(host.which(p) for p in TOOLKIT_PROGRAMS) or host.exists(TOOLKIT_CONFIG)
        return ContainerCgroupsInfo(docker_cgroup_driver=docker, docker_cgroup_driver_source=docker_source,
                                    containerd_systemd_cgroup=containerd, nvidia_container_toolkit=toolkit,
                                    nvidia_devices=devices, dev_char_missing=missing)

    def _docker(self, host: Host) -> Tuple[Optional[str], Optional[str]]:
        text = host.read_text(DOCKER_DAEMON_JSON)
        if text is None and host.which("dockerd") is None:
            return None, None
        if text is not None:
            try:
                driver = parse_docker_cgroup_driver(text)
            except ValueError as exc:
                log.warning("docker_daemon_json_invalid", path=DOCKER_DAEMON_JSON, error=str(exc))
                driver = None
            if driver is not None:
                return driver, "daemon.json"
        # dockerd's own default since 20.10: systemd on a cgroup v2 host (with systemd), cgroupfs on cgroup v1.
        if host.exists("/sys/fs/cgroup/cgroup.controllers"):
            return "systemd", "default (cgroup v2)"
        return "cgroupfs", "default (cgroup v1)"

    def _containerd(self, host: Host) -> Optional[bool]:
        text = host.read_text(CONTAINERD_CONFIG)
        if text is None:
            return None
        try:
            value = parse_containerd_systemd_cgroup(text)
        except ValueError as exc:
            log.warning("containerd_config_invalid", path=CONTAINERD_CONFIG, error=str(exc))
            return None
        return bool(value)  # not set: runc's default, cgroupfs

    def _nvidia_devices(self, host: Host) -> List[str]:
        majors = parse_proc_devices(host.read_text("/proc/devices") or "")
        frontend = next((majors[n] for n in FRONTEND_NAMES if n in majors), None)
        devices: List[str] = []
        if frontend is not None:
            minors = []
            for bus in host.list_dir(NVIDIA_GPUS_DIR):
                minor = parse_device_minor(host.read_text(f"{NVIDIA_GPUS_DIR}/{bus}/information") or "")
                if minor is not None:
                    minors.append(minor)
            devices.extend(f"{frontend}:{m}" for m in (*sorted(minors), NVIDIACTL_MINOR))
        if UVM_NAME in majors:
            devices.append(f"{majors[UVM_NAME]}:0")
        return devices
