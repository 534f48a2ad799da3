"""A cheap stamp of what the snapshot's collectors read, so that an interval snapshot whose inputs did not change
starts no child (issue #45).

A snapshot child costs about 0.37 s of CPU; at the default 300 s interval that is 4.4 s an hour, nearly twice
node_exporter's whole idle cost, to find the same content hash almost every time. The resident stamps, in about a
millisecond, without reading anything large:

    stat (inode, size, mtime)   the package databases (what the package watch stats), os-release, the boot loader's
                                settings, the container runtimes' configs and container directories, DKMS and
                                kernel module trees, the ROCm and CUDA install links and version files, the compiled
                                policy and the overrides (a new bundle or a SIGHUP recompiles it), /etc/hostname
    content (at most 64 KiB)    the running kernel (/proc/sys/kernel/osrelease, /proc/version), the host name, the
                                loaded modules
                                (/proc/modules), the driver versions (/sys/module/{amdgpu,nvidia}/version,
                                /proc/driver/nvidia/version), the GPUs present (/sys/class/drm) and each one's RAS
                                error counts

What it does not see: facts only a library or a command gives (NVML's and amdsmi's answers, ``docker ps``'s
running containers beyond their directories, a toolkit outside /usr/local and /opt/rocm) and the clock (an
override that expires). Those are caught by the
forced run: an interval snapshot runs at least once every FORCED_SNAPSHOT_SECONDS whatever the stamp says; any
other reason (start, a package change, SIGUSR1, a reload, a new policy) always runs one.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

from agent.host import Host

# An interval snapshot runs at least this often even with an unchanged stamp (docs/reporting.md "Idle cost").
FORCED_SNAPSHOT_SECONDS = 3600.0

STATED_PATHS = (
    "/var/lib/dpkg/status", "/var/lib/rpm", "/usr/lib/sysimage/rpm",
    "/etc/os-release", "/usr/lib/os-release", "/etc/default/grub", "/boot/grub/grubenv", "/boot/grub2/grubenv",
    "/etc/docker/daemon.json", "/etc/containerd/config.toml", "/etc/nvidia-container-runtime/config.toml",
    "/var/lib/docker/containers", "/var/lib/containers/storage/overlay-containers",
    "/var/lib/dkms", "/usr/lib/modules", "/lib/modules",
    "/opt/rocm", "/opt/rocm/.info/version", "/usr/local", "/usr/local/cuda", "/usr/local/cuda/version.json",
    "/dev/kfd", "/dev/nvidiactl", "/etc/hostname",
)
READ_PATHS = (
    "/proc/sys/kernel/osrelease", "/proc/version", "/proc/sys/kernel/hostname", "/proc/modules",
    "/sys/module/amdgpu/version", "/sys/module/nvidia/version", "/proc/driver/nvidia/version",
)
DRM_CLASS_DIR = "/sys/class/drm"
_MAX_READ_BYTES = 64 * 1024

Stamp = Tuple[object, ...]


def _stat(path: str) -> Optional[Tuple[int, int, int]]:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _read(path: str) -> Optional[bytes]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, _MAX_READ_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


def _listing(path: str) -> Tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(path)))
    except OSError:
        return ()


def snapshot_input_stamp(host: Host, extra_paths: Tuple[str, ...] = ()) -> Stamp:
    """The stamp of the snapshot's inputs under ``host``'s root; ``extra_paths`` (host paths) are stated too."""
    stated = tuple(_stat(host.file(path)) for path in STATED_PATHS + extra_paths)
    read = tuple(_read(host.file(path)) for path in READ_PATHS)
    drm = host.file(DRM_CLASS_DIR)
    cards = _listing(drm)
    ras: List[Tuple[str, Optional[bytes]]] = []
    for card in cards:
        ras_dir = f"{drm}/{card}/device/ras"
        ras += [(f"{card}/{name}", _read(f"{ras_dir}/{name}")) for name in _listing(ras_dir)
                if name.endswith("_err_count")]
    return stated, read, cards, tuple(ras)
