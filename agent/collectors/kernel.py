"""The running kernel and the kernel the next boot will use.

They differ after an unattended kernel upgrade, and that is exactly when an out-of-tree GPU module (DKMS) breaks:
the next boot comes up on a kernel that has no amdgpu/nvidia module built for it.
"""

from __future__ import annotations

from typing import List, Literal, Optional

from agent.errors import CollectorUnavailable
from agent.frozen import Frozen, field, frozen_record
from agent.host import Host
from agent.hostfacts.keyvalue import parse_key_value_lines
from agent.lazyre import LazyPattern
from agent.versions import sort_key

NextBootSource = Literal["grubenv", "grub_default", "newest_installed"]


@frozen_record
class KernelInfo(Frozen):
    """Running and next-boot kernel releases (``uname -r`` form)."""

    running_release: str
    running_version: Optional[str] = None
    installed: List[str] = field(default_factory=list)
    next_boot: Optional[str] = None
    next_boot_source: Optional[NextBootSource] = None
    reboot_pending: bool = False


_VMLINUZ = LazyPattern(r"^(?:vmlinuz|vmlinux|Image)-(.+)$")


def installed_kernels(boot_names: List[str], modules_dirs_with_image: List[str]) -> List[str]:
    """Kernel releases from /boot image names plus /lib/modules dirs that carry their own vmlinuz, oldest first."""
    releases = set(modules_dirs_with_image)
    for name in boot_names:
        match = _VMLINUZ.match(name)
        if match and not name.endswith((".old", ".bak")) and "rescue" not in name:
            releases.add(match.group(1))
    return sorted(releases, key=sort_key("rpm"))


def pick_from_saved_entry(saved_entry: str, installed: List[str]) -> Optional[str]:
    """Map a GRUB ``saved_entry`` (BLS id ``<machine-id>-<release>`` or a menu path) to an installed release."""
    if not saved_entry:
        return None
    # Longest first: "6.8.0-45-generic" must win over "6.8.0-4".
    for release in sorted(installed, key=len, reverse=True):
        if saved_entry.endswith(release) or f"-{release}" in saved_entry or f" {release}" in saved_entry:
            return release
    return None


def next_boot_kernel(installed: List[str], grubenv: Optional[str], grub_default: Optional[str]) -> tuple:
    """(release, source): the saved GRUB entry when GRUB boots the saved one, else the newest installed kernel."""
    default_setting = parse_key_value_lines(grub_default).get("GRUB_DEFAULT", "0") if grub_default else None
    uses_saved = default_setting in (None, "saved")
    if grubenv and uses_saved:
        saved = parse_key_value_lines(grubenv).get("saved_entry", "")
        picked = pick_from_saved_entry(saved, installed)
        if picked:
            return picked, "grubenv"
    if default_setting not in (None, "saved", "0"):
        picked = pick_from_saved_entry(default_setting or "", installed)
        if picked:
            return picked, "grub_default"
    if installed:
        return installed[-1], "newest_installed"
    return None, None


class KernelCollector:
    """Reads /proc for the running kernel and /boot, /lib/modules and GRUB state for the next one."""

    name = "kernel"

    def collect(self, host: Host) -> KernelInfo:
        running = host.read_first_line("/proc/sys/kernel/osrelease")
        if running is None:
            raise CollectorUnavailable("no /proc/sys/kernel/osrelease")
        with_image = []
        for modules_root in ("/lib/modules", "/usr/lib/modules"):
            for release in host.list_dir(modules_root):
                if host.exists(f"{modules_root}/{release}/vmlinuz"):
                    with_image.append(release)
        installed = installed_kernels(host.list_dir("/boot"), with_image)
        grubenv = host.read_text("/boot/grub/grubenv") or host.read_text("/boot/grub2/grubenv")
        next_boot, source = next_boot_kernel(installed, grubenv, host.read_text("/etc/default/grub"))
        return KernelInfo(
            running_release=running,
            running_version=host.read_first_line("/proc/version"),
            installed=installed,
            next_boot=next_boot,
            next_boot_source=source,
            reboot_pending=next_boot is not None and next_boot != running,
        )
