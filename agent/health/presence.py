"""Whether this host has a GPU at all: asked first, so that a GPU-less host is ``skipped`` before anything else.

No probe user is looked up and no framework imported on a host without GPUs: a source install on a CPU box, a CI
runner, a login node. The evidence, cheapest first, read through the Host's root:

- the snapshot's GPU inventory, when the caller has one (the daemon does);
- the device nodes the drivers make: ``/dev/kfd`` (amdgpu's compute node), ``/dev/nvidia0``, ``/dev/nvidia1``, ...;
- AMD (0x1002) or NVIDIA (0x10de) display or accelerator functions (PCI class 0x03 or 0x12) in
  ``/sys/bus/pci/devices`` (whether or not a driver is bound; an NVSwitch, class 0x068000, is no GPU) or behind a
  DRM card (``/sys/class/drm/card<N>/device``);
- ``/proc/driver/nvidia/gpus/<bdf>``;
- last, the SMI library (NVML, amdsmi) enumerating a device: a container that sees its GPUs through the library only.

Any one of them means "GPUs present"; the check then goes on as before and finds any problem with them.
"""

from __future__ import annotations

from typing import Optional

from agent.collectors.amdgpu import AMD_PCI_VENDOR
from agent.collectors.nvidia import NVIDIA_PCI_VENDOR
from agent.errors import GpuguardError
from agent.health.activity import open_reader
from agent.host import Host
from agent.snapshot.model import Snapshot

PCI_DEVICES_DIR = "/sys/bus/pci/devices"
DRM_DIR = "/sys/class/drm"
_GPU_VENDORS = (AMD_PCI_VENDOR, NVIDIA_PCI_VENDOR)
_GPU_CLASS_PREFIXES = ("0x03", "0x12")  # display controllers; processing accelerators (MI300X: 0x120000)
NO_GPU_REASON = ("no GPU on this host (no /dev/kfd or /dev/nvidia<N>, no AMD or NVIDIA display or accelerator in "
                 "/sys/bus/pci/devices, no GPU the SMI library enumerates)")


def snapshot_gpu_count(snapshot: Optional[Snapshot]) -> int:
    """The GPUs the snapshot's amdgpu and nvidia sections list (0 without a snapshot)."""
    if snapshot is None:
        return 0
    amd = len(snapshot.amdgpu.data.gpus) if snapshot.amdgpu.data else 0
    nvidia = len(snapshot.nvidia.data.gpus) if snapshot.nvidia.data else 0
    return amd + nvidia


def has_gpu_device_node(host: Host) -> bool:
    """``/dev/kfd`` or an ``/dev/nvidia<N>`` under the host root."""
    if host.exists("/dev/kfd"):
        return True
    return any(name.startswith("nvidia") and name[len("nvidia"):].isdigit() for name in host.list_dir("/dev"))


def has_gpu_pci_function(host: Host) -> bool:
    """An AMD or NVIDIA display or accelerator function in sysfs (bound to a driver or not), or a DRM card's."""
    bases = [f"{PCI_DEVICES_DIR}/{name}" for name in host.list_dir(PCI_DEVICES_DIR)]
    bases += [f"{DRM_DIR}/{card}/device" for card in host.list_dir(DRM_DIR)
              if card.startswith("card") and card[len("card"):].isdigit()]
    for base in bases:
        try:
            vendor = (host.read_first_line(f"{base}/vendor") or "").lower()
            if vendor in _GPU_VENDORS and (host.read_first_line(f"{base}/class") or "").lower().startswith(
                    _GPU_CLASS_PREFIXES):
                return True
        except GpuguardError:
            continue  # an unreadable function is no evidence either way
    return False


def smi_enumerates_a_gpu(host: Host) -> bool:
    """Whether NVML or amdsmi starts and lists at least one device."""
    try:
        reader = open_reader(host.load_module, None)
    except GpuguardError:
        return False
    reader.close()
    return True


def no_gpu_reason(host: Host, snapshot: Optional[Snapshot] = None) -> Optional[str]:
    """None when anything says this host has a GPU (or a place to look cannot be read); else why the health check
    has nothing to check. Never a wrong skip: an unreadable /dev or sysfs lets the check go on and see for itself."""
    try:
        if snapshot_gpu_count(snapshot) > 0 or has_gpu_device_node(host) or has_gpu_pci_function(host):
            return None
        if host.list_dir("/proc/driver/nvidia/gpus") or smi_enumerates_a_gpu(host):
            return None
    except GpuguardError:
        return None
    return NO_GPU_REASON
