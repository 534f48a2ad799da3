"""Running and next-boot kernel detection."""

from __future__ import annotations

import pytest

from agent.collectors.kernel import KernelCollector, installed_kernels, next_boot_kernel, pick_from_saved_entry
from agent.errors import CollectorUnavailable
from agent.host import Host


def test_installed_kernels_sorted_by_version_not_text() -> None:
    """6.8.0-100 sorts after 6.8.0-45; .old and rescue images are ignored."""
    names = ["vmlinuz-6.8.0-100-generic", "vmlinuz-6.8.0-45-generic", "vmlinuz.old", "vmlinuz-6.8.0-45-generic.old",
             "vmlinuz-0-rescue-abc", "config-6.8.0-45-generic", "initrd.img-6.8.0-45-generic"]
    assert installed_kernels(names, []) == ["6.8.0-45-generic", "6.8.0-100-generic"]


def test_installed_kernels_include_modules_dirs_with_vmlinuz() -> None:
    """Fedora-style /lib/modules/<release>/vmlinuz counts as installed."""
    assert installed_kernels([], ["6.11.4-301.fc41.x86_64"]) == ["6.11.4-301.fc41.x86_64"]


@pytest.mark.parametrize("saved,expected", [
    ("0123456789abcdef0123456789abcdef-5.14.0-570.22.1.el9_6.x86_64", "5.14.0-570.22.1.el9_6.x86_64"),
    ("gnulinux-advanced-uuid>gnulinux-6.8.0-45-generic-advanced-uuid", "6.8.0-45-generic"),
    ("Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-45-generic", "6.8.0-45-generic"),
    ("", None),
    ("something-else", None),
])
def test_pick_from_saved_entry(saved: str, expected) -> None:
    """BLS ids and GRUB menu paths map to the installed release they name."""
    installed = ["5.14.0-570.12.1.el9_6.x86_64", "5.14.0-570.22.1.el9_6.x86_64", "6.8.0-4-generic",
                 "6.8.0-45-generic"]
    assert pick_from_saved_entry(saved, installed) == expected


def test_next_boot_prefers_saved_entry_when_grub_default_is_saved() -> None:
    """GRUB_DEFAULT=saved with a grubenv entry boots that entry, even if it is not the newest."""
    installed = ["6.8.0-45-generic", "6.8.0-49-generic"]
    grubenv = "# GRUB Environment Block\nsaved_entry=gnulinux-6.8.0-45-generic-advanced-x\n"
    assert next_boot_kernel(installed, grubenv, "GRUB_DEFAULT=saved\n") == ("6.8.0-45-generic", "grubenv")


def test_next_boot_is_newest_with_grub_default_zero() -> None:
    """Debian's GRUB_DEFAULT=0 boots the newest kernel whatever grubenv says."""
    installed = ["6.8.0-45-generic", "6.8.0-49-generic"]
    grubenv = "saved_entry=gnulinux-6.8.0-45-generic-advanced-x\n"
    assert next_boot_kernel(installed, grubenv, "GRUB_DEFAULT=0\n") == ("6.8.0-49-generic", "newest_installed")


def test_next_boot_unknown_without_installed_kernels() -> None:
    """A container or VM without /boot has no known next-boot kernel."""
    assert next_boot_kernel([], None, None) == (None, None)


def test_collector_flags_pending_reboot(tmp_path) -> None:
    """A newer installed kernel than the running one marks a reboot as pending."""
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.8.0-45-generic\n")
    (tmp_path / "boot").mkdir()
    for release in ("6.8.0-45-generic", "6.8.0-49-generic"):
        (tmp_path / f"boot/vmlinuz-{release}").write_text("")
    info = KernelCollector().collect(Host(root=tmp_path))
    assert info.running_release == "6.8.0-45-generic"
    assert info.next_boot == "6.8.0-49-generic"
    assert info.reboot_pending is True


def test_collector_absent_without_proc(tmp_path) -> None:
    """Without /proc there is no running kernel to report."""
    with pytest.raises(CollectorUnavailable):
        KernelCollector().collect(Host(root=tmp_path))
