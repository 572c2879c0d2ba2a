"""Building an inventory from a capture (proxgpu.inspection.build), with no host involved."""

from __future__ import annotations

import pytest

from proxgpu.inspection.build import build_inventory
from proxgpu.inspection.capture import Capture
from proxgpu.inspection.recognition import GpuFilter


def test_unreadable_guest_config_becomes_a_warning() -> None:
    capture = Capture(
        unreadable=["/etc/pve/lxc/100.conf"],
        lines={
            "/sys/bus/pci/devices/0000:00:00.0/class": ["0x060000"],
            "/sys/bus/pci/devices/0000:00:00.0/vendor": ["0x8086"],
            "/sys/bus/pci/devices/0000:00:00.0/device": ["0x0d57"],
        },
    )
    inv = build_inventory(capture, "pve1", GpuFilter())
    assert inv.warnings == [
        "/etc/pve/lxc/100.conf: cannot read (run as root)",
        "/proc/sys/kernel/hostname: missing; using the host's address",
    ]
    assert inv.hostname == "pve1"


@pytest.mark.parametrize(
    ("cmdline", "raw", "dirs", "expected"),
    [
        ("BOOT_IMAGE=/boot/vmlinuz-6.8 root=/dev/sda1", {}, set(), "grub"),
        (
            "initrd=\\EFI\\proxmox\\6.8\\initrd.img root=ZFS=rpool",
            {},
            {"/sys/firmware/efi"},
            "systemd-boot",
        ),
        (
            "root=ZFS=rpool",
            {"/etc/kernel/proxmox-boot-uuids": b"A\n"},
            {"/sys/firmware/efi"},
            "systemd-boot",
        ),
        ("root=/dev/sda1", {"/etc/default/grub": b"GRUB_DEFAULT=0\n"}, set(), "grub"),
        ("root=/dev/sda1", {}, set(), "unknown"),
    ],
)
def test_boot_loader_detection(
    cmdline: str, raw: dict[str, bytes], dirs: set[str], expected: str
) -> None:
    capture = Capture(
        lines={
            "/proc/cmdline": [cmdline],
            "/sys/bus/pci/devices/0000:00:00.0/class": ["0x060000"],
            "/sys/bus/pci/devices/0000:00:00.0/vendor": ["0x8086"],
            "/sys/bus/pci/devices/0000:00:00.0/device": ["0x0d57"],
        },
        raw=raw,
        dirs=dirs,
    )
    assert build_inventory(capture, "h", GpuFilter()).boot_loader == expected
