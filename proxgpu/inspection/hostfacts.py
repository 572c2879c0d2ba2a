"""What the host says beyond its PCI devices: the first CPU's vendor, address bits and 1 GiB
pages (``/proc/cpuinfo``), the framebuffers the kernel registered (``/proc/fb``), Secure Boot,
the NUMA nodes, the Proxmox VE and pve-container versions, the boot loader, and whether the
capture was taken inside a container.

>>> from proxgpu.inspection.capture import Capture
>>> cap = Capture(lines={CPUINFO: ["vendor_id\\t: AuthenticAMD", "flags\\t\\t: fpu pse pdpe1gb lm",
...                                "address sizes\\t: 52 bits physical, 57 bits virtual"],
...                      PROC_FB: ["0 EFI VGA"]},
...               raw={SECURE_BOOT: bytes([6, 0, 0, 0, 1])})
>>> cpu_phys_bits(cap), cpu_pdpe1gb(cap), framebuffers(cap), secure_boot(cap)
(52, True, ['EFI VGA'], True)
"""

from __future__ import annotations

import re

from proxgpu.inspection.capture import Capture, key_value
from proxgpu.inspection.inventory import BootLoader, NumaNode

CPUINFO = "/proc/cpuinfo"
PROC_FB = "/proc/fb"
#: The UEFI global variable ``SecureBoot`` in efivarfs: four attribute bytes, then one byte that
#: is 1 while Secure Boot is on (UEFI spec 2.10, section 3.3, Globally Defined Variables).
SECURE_BOOT = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def cpuinfo_field(capture: Capture, name: str) -> str | None:
    """The value of the first ``name : value`` line the capture holds of ``/proc/cpuinfo``."""
    for line in capture.lines.get(CPUINFO, []):
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def cpu_phys_bits(capture: Capture) -> int | None:
    """The physical address bits the kernel found (``address sizes : 46 bits physical, ...``),
    the number qemu-server reads for ``phys-bits=host``."""
    match = re.match(r"(\d+) bits physical", cpuinfo_field(capture, "address sizes") or "")
    return int(match[1]) if match else None


def cpu_pdpe1gb(capture: Capture) -> bool | None:
    """Whether the CPU has 1 GiB pages (the ``pdpe1gb`` flag); ``None`` when not read."""
    flags = cpuinfo_field(capture, "flags")
    return None if flags is None else "pdpe1gb" in flags.split()


def framebuffers(capture: Capture) -> list[str] | None:
    """The framebuffer names ``/proc/fb`` lists, one per ``N NAME`` line (efifb's is
    ``EFI VGA``, vesafb's ``VESA VGA``, simpledrm's ``simpledrmdrmfb``); ``None`` when the file
    was not read (a snapshot taken before proxgpu read it), which is not "no framebuffer".

    >>> framebuffers(Capture()), framebuffers(Capture(files={PROC_FB}))
    (None, [])
    """
    if PROC_FB not in capture.lines and PROC_FB not in capture.files:
        return None
    names = []
    for line in capture.lines.get(PROC_FB, []):
        number, _, name = line.strip().partition(" ")
        if number.isdigit() and name:
            names.append(name.strip())
    return names


def secure_boot(capture: Capture) -> bool | None:
    """Whether UEFI Secure Boot is on; ``None`` when the variable was not read (no UEFI, or an
    older capture)."""
    data = capture.raw.get(SECURE_BOOT)
    return None if data is None or len(data) < 5 else data[4] == 1


def numa_nodes(capture: Capture) -> list[NumaNode]:
    nodes = []
    pattern = re.compile(r"^/sys/devices/system/node/node(\d+)/cpulist$")
    for path in capture.lines:
        match = pattern.match(path)
        if match:
            node = int(match.group(1))
            cpus = capture.first_line(path) or ""
            nodes.append(NumaNode(id=node, cpus=cpus, memory_kib=_node_memory(capture, node)))
    return sorted(nodes, key=lambda n: n.id)


def _node_memory(capture: Capture, node: int) -> int | None:
    for line in capture.lines.get(f"/sys/devices/system/node/node{node}/meminfo", []):
        match = re.match(r"Node \d+ MemTotal:\s+(\d+) kB", line)
        if match:
            return int(match.group(1))
    return None


def pve_version(capture: Capture) -> str | None:
    text = capture.text("/usr/share/perl5/PVE/pvecfg.pm") or ""
    match = re.search(r"sub version\s*\{\s*return\s*'([^']+)'", text)
    return match.group(1) if match else None


def boot_loader(capture: Capture, cmdline: str | None) -> BootLoader:
    # GRUB always passes BOOT_IMAGE=; systemd-boot loads the initrd from the ESP (initrd=\EFI\...).
    if cmdline and "BOOT_IMAGE=" in cmdline:
        return "grub"
    efi = "/sys/firmware/efi" in capture.dirs
    if efi and (
        "/etc/kernel/proxmox-boot-uuids" in capture.raw or "initrd=\\EFI" in (cmdline or "")
    ):
        return "systemd-boot"
    if "/etc/default/grub" in capture.raw:
        return "grub"
    return "unknown"


def cpu_vendor(capture: Capture) -> str | None:
    return cpuinfo_field(capture, "vendor_id") or None


def container_marker(capture: Capture) -> str | None:
    """The file that shows the capture was taken inside a container: ``/dev/.lxc-boot-id``, which
    LXC writes into the container's autodev ``/dev`` (lxc ``src/lxc/conf.c``,
    ``lxc_setup_boot_id``), or ``/run/systemd/container``, which systemd as the container's init
    writes from the ``container=lxc`` LXC puts in its environment (systemd ``src/core/main.c``,
    ``write_container_id``; lxc ``src/lxc/start.c``, ``do_start``). Neither exists on a host."""
    markers = ("/dev/.lxc-boot-id", "/run/systemd/container")
    return next((path for path in markers if path in capture.lines), None)


def pve_container_version(capture: Capture) -> str | None:
    """The installed pve-container's version, from its dpkg status paragraph."""
    lines = capture.lines.get("/var/lib/dpkg/status", [])
    fields = dict(key_value(line) for line in lines if ":" in line)
    installed = fields.get("Status", "").endswith(" installed")
    return fields.get("Version") if installed and fields.get("Package") == "pve-container" else None
