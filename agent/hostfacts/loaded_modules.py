"""The loaded GPU kernel modules: which driver is running, whatever the package database says."""

from __future__ import annotations

from agent.hostfacts.paths import read_small_text

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of the apt hook's start-up budget
    from typing import Dict, Optional, Tuple


def _dotted(token: str) -> bool:
    parts = token.split(".")
    return len(parts) >= 2 and all(p.isdigit() for p in parts)


def parse_proc_driver_version(text: str) -> Tuple[Optional[str], Optional[str]]:
    """(driver version, module flavor ``open``/``proprietary``) from /proc/driver/nvidia/version.

    ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...`` is the open module,
    ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 ...`` the proprietary one.
    """
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or key.strip() != "NVRM version":
            continue
        version = next((token for token in value.split() if _dotted(token)), None)
        flavor = None
        if "Open Kernel Module" in value:
            flavor = "open"
        elif "Kernel Module" in value:
            flavor = "proprietary"
        return version, flavor
    return None, None


def loaded_drivers(root: str) -> Dict[str, str]:
    """Versions of the loaded GPU kernel modules under ``root`` (``{"nvidia": "580.159.04"}``; empty when none).

    The policy judges a driver that no package carries (the .run installer, a VM or container host's driver) by
    the module that is running. ``/sys/module/nvidia/version`` first, then the ``Kernel Module`` line of
    ``/proc/driver/nvidia/version``.
    """
    version = module_version(root, "nvidia")
    if not version:
        version = parse_proc_driver_version(read_small_text(root, "/proc/driver/nvidia/version") or "")[0]
    return {"nvidia": version} if version else {}


def module_version(root: str, module: str) -> Optional[str]:
    """The first line of ``/sys/module/<module>/version`` under ``root``: what an out-of-tree build of a loaded
    module reports (nvidia's driver version, a DKMS amdgpu's kernel base such as ``6.8.5``); None without one (the
    module is not loaded, or is the kernel's own: the inbox amdgpu has no version file)."""
    text = (read_small_text(root, f"/sys/module/{module}/version", 256) or "").strip()
    return text.split("\n")[0].strip() or None
