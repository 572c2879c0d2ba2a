"""Every path proxgpu reads or writes on a host, as the host itself names it (no root prefix).

A host's ``root`` (see :mod:`proxgpu.host`) is put in front of these when a command runs; the
journal, plans and diffs always carry them as written here.

>>> guest_config("lxc", 200), guest_config("vm", 300)
('/etc/pve/lxc/200.conf', '/etc/pve/qemu-server/300.conf')
>>> guest_of("/etc/pve/qemu-server/300.conf")
('vm', 300)
>>> guest_config_lock("/etc/pve/lxc/200.conf")
'/run/lock/lxc/pve-config-200.lock'
"""

from __future__ import annotations

import re
from typing import Literal

GuestKind = Literal["lxc", "vm"]

# Proxmox VE's cluster file system (pmxcfs): guest configs and cluster-wide mappings.
PVE_DIR = "/etc/pve/"
LXC_CONFIG_DIR = "/etc/pve/lxc/"
VM_CONFIG_DIR = "/etc/pve/qemu-server/"
MAPPING_DIR = "/etc/pve/mapping/"
PCI_MAPPING = "/etc/pve/mapping/pci.cfg"
#: The member list pmxcfs keeps on every node (names, IPs, online).
MEMBERS = "/etc/pve/.members"
#: Each node's own guest configs (``/etc/pve/lxc`` links to ``nodes/<this node>/lxc``).
NODES_DIR = "/etc/pve/nodes/"
GUEST_CONFIG = re.compile(r"^/etc/pve/(lxc|qemu-server)/(\d+)\.conf$")
#: Where inspection finds the files that say which guest holds which device.
GUEST_FILE_PREFIXES = (LXC_CONFIG_DIR, VM_CONFIG_DIR, MAPPING_DIR)

# What inspection reads.
PCI_DEVICES = "/sys/bus/pci/devices/"
NVIDIA_GPUS = "/proc/driver/nvidia/gpus/"
PCI_IDS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids")

#: What a snapshot keeps of a command's output that inspection reads (on a live host the command
#: runs, and nothing is written here): nvidia-smi's list of GPUs and MIG devices (``-L``) and its
#: plain table, whose "MIG devices" rows say which GPU and compute instance each device is.
CAPTURED_DIR = "/var/lib/proxgpu/captured/"
NVIDIA_SMI_LIST = f"{CAPTURED_DIR}nvidia-smi-L"
NVIDIA_SMI_TABLE = f"{CAPTURED_DIR}nvidia-smi"

# The host files a split writes or edits.
#: Named to sort before depmod's ``modules.softdep`` and the other modprobe.d files: kmod uses
#: only the first softdep line for a module (see :mod:`proxgpu.kmod`).
MODPROBE_CONF = "/etc/modprobe.d/00-proxgpu-vfio.conf"
#: Where earlier proxgpu wrote it, after ``modules.softdep``; a plan replaces it.
LEGACY_MODPROBE_CONF = "/etc/modprobe.d/proxgpu-vfio.conf"
BIND_SCRIPT = "/usr/local/sbin/proxgpu-vfio-bind"
#: The two files' base names: kmod sorts config files by it, and an initramfs lists them by it.
MODPROBE_CONF_NAME = MODPROBE_CONF.rsplit("/", 1)[1]
BIND_SCRIPT_NAME = BIND_SCRIPT.rsplit("/", 1)[1]
INITRAMFS_HOOK = "/etc/initramfs-tools/hooks/proxgpu"
MODULES_LOAD = "/etc/modules-load.d/proxgpu-vfio.conf"
DRIVERCTL_DIR = "/etc/driverctl.d/"
KERNEL_CMDLINE = "/etc/kernel/cmdline"
GRUB_DEFAULT = "/etc/default/grub"

# What proxgpu keeps on the host: the journal and backups survive a reboot, the lock does not.
JOURNAL_DIR = "/var/lib/proxgpu/journal"
BACKUP_DIR = "/var/lib/proxgpu/backups"
LOCK_DIR = "/run/lock/proxgpu"
#: Where a follow-up action's output is kept while it runs, for its last lines to be followed.
OUTPUT_DIR = "/var/lib/proxgpu/output"


def check_host_path(path: str) -> str:
    """``path`` itself if it is a plain absolute path on a host; else :class:`ValueError`.

    Paths come back from journals and plan files that could have been edited: one with ``..``,
    ``.``, an empty component or a control character could name a file outside the host's root
    once its prefix is put in front, so it is refused before anything uses it.

    >>> check_host_path("/etc/pve/lxc/200.conf")
    '/etc/pve/lxc/200.conf'
    >>> check_host_path("/etc/../../outside")
    Traceback (most recent call last):
    ...
    ValueError: not a plain absolute path: '/etc/../../outside'
    """
    parts = path.split("/")
    plain = (
        path.startswith("/")
        and len(path) > 1
        and all(part not in ("", ".", "..") for part in parts[1:])
        and not any(ord(c) < 32 or c == "\x7f" for c in path)
    )
    if not plain:
        raise ValueError(f"not a plain absolute path: {path!r}")
    return path


def guest_config(kind: GuestKind, vmid: int) -> str:
    """The config file of a container (``lxc``) or VM (``vm``)."""
    return f"{LXC_CONFIG_DIR if kind == 'lxc' else VM_CONFIG_DIR}{vmid}.conf"


def guest_of(path: str) -> tuple[GuestKind, int] | None:
    """Which guest a config path belongs to, or ``None`` when it is no guest config."""
    match = GUEST_CONFIG.match(path)
    if match is None:
        return None
    return ("lxc" if match[1] == "lxc" else "vm"), int(match[2])


def guest_label(path: str) -> str | None:
    """The guest ``path`` is the config of, as messages name it (``CT 201``, ``VM 300``), or
    ``None`` when it is no guest config.

    >>> guest_label("/etc/pve/lxc/201.conf"), guest_label("/etc/modules")
    ('CT 201', None)
    """
    guest = guest_of(path)
    if guest is None:
        return None
    kind, vmid = guest
    return f"{'CT' if kind == 'lxc' else 'VM'} {vmid}"


def with_guest(path: str) -> str:
    """``path``, followed by the guest it is the config of.

    >>> with_guest("/etc/pve/qemu-server/300.conf"), with_guest("/etc/modules")
    ('/etc/pve/qemu-server/300.conf (VM 300)', '/etc/modules')
    """
    label = guest_label(path)
    return path if label is None else f"{path} ({label})"


def is_vm_config(path: str) -> bool:
    """Whether ``path`` is a VM's config (``/etc/pve/qemu-server/N.conf``)."""
    guest = guest_of(path)
    return guest is not None and guest[0] == "vm"


def guest_config_lock(path: str) -> str | None:
    """The lock file ``qm set`` / ``pct set`` take for a guest config, or ``None``."""
    guest = guest_of(path)
    if guest is None:
        return None
    kind, vmid = guest
    if kind == "vm":
        return f"/var/lock/qemu-server/lock-{vmid}.conf"
    return f"/run/lock/lxc/pve-config-{vmid}.lock"
