"""The sysfs, procfs and /etc files of a synthetic example host, written as a snapshot tree
(used by generate.py, which describes each host).

Devices live in their ``/sys/devices/pciDDDD:BB/...`` directory below their root port and switch
ports, with ``/sys/bus/pci/devices/ADDR`` a link to it, as sysfs lays them out.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from proxgpu.inspection.capture import ALIAS_LIST

HERE = Path(__file__).resolve().parent


@dataclass
class Dev:
    """One PCI function as the example wants it."""

    address: str
    vendor: str
    device: str
    cls: str
    driver: str | None
    group: int | None
    node: int
    subsys: tuple[str, str] = ("0000", "0000")
    bridge: bool = False
    boot_vga: bool | None = None
    #: The bridge above (a root port or switch port); None: on a root bus.
    parent: str | None = None
    #: An SR-IOV virtual function's physical function (its sibling below the same bridge).
    physfn: str | None = None


@dataclass
class HostSpec:
    """A whole example host."""

    name: str
    kernel: str
    pve: str
    cmdline: str
    nodes: dict[int, tuple[str, int]]
    devices: list[Dev]
    efi: bool = False
    nvidia_minors: dict[str, int] = field(default_factory=dict)
    model: str = ""
    files: dict[str, str] = field(default_factory=dict)
    #: Symlinks to write after the files: path -> target, as the kernel makes them.
    links: dict[str, str] = field(default_factory=dict)
    pci_ids: str = ""
    char_devices: str = ""
    cpu_vendor: str = "AuthenticAMD"
    #: The first CPU's ``address sizes`` line: physical and virtual address bits.
    address_bits: tuple[int, int] = (48, 48)
    # No display: nvidia-modeset never loads, so /dev/nvidia-modeset does not exist.
    headless: bool = False
    mig: bool = False
    #: The size of the GPUs' large BAR (BAR1, the VRAM aperture) in GiB; None: no resource file.
    bar1_gib: int | None = None
    tools: tuple[str, ...] = (
        "usr/sbin/update-initramfs",
        "usr/sbin/proxmox-boot-tool",
        "usr/sbin/update-grub",
        "usr/bin/pvesh",
        "bin/fuser",
    )


BUILT_IN_DRIVERS = {"pcieport"}

#: The PCI aliases of the examples' GPU drivers, as depmod lists them in ``modules.alias`` (in
#: module order: the kernel's own, then NVIDIA's from updates/dkms): nouveau's and
#: snd_hda_intel's NVIDIA entries of their ID tables (``nouveau_drm_pci_table``, ``azx_ids``),
#: and NVIDIA's VGA and 3D controller classes (kernel-open/nvidia/nv-pci-table.c).
MODULE_ALIASES = (
    ("pci:v000010DEd*sv*sd*bc03sc*i*", "nouveau"),
    ("pci:v000010DEd*sv*sd*bc04sc03i00*", "snd_hda_intel"),
    ("pci:v000010DEd*sv*sd*bc03sc00i00*", "nvidia"),
    ("pci:v000010DEd*sv*sd*bc03sc02i00*", "nvidia"),
)


def write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def mark_dir(root: Path, path: str) -> None:
    """A directory whose existence alone is read; the file inside keeps it in git."""
    write(root, f"{path}/.proxgpu-keep", "")


def link(root: Path, path: str, to: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(to)


def cpus_of(spec: HostSpec, node: int) -> str:
    return spec.nodes[node][0]


def all_cpus(spec: HostSpec) -> str:
    return ",".join(cpus for cpus, _ in spec.nodes.values())


def sysfs_dir(spec: HostSpec, dev: Dev) -> str:
    """The device's directory under /sys/devices: its root bus, then every bridge above it."""
    parents = {d.address: d for d in spec.devices}
    chain = [dev.address]
    while parents[chain[0]].parent is not None:
        chain.insert(0, str(parents[chain[0]].parent))
    root_bus = chain[0].rsplit(":", 1)[0]
    return f"/sys/devices/pci{root_bus}/" + "/".join(chain)


def write_device(root: Path, spec: HostSpec, dev: Dev) -> None:
    base = sysfs_dir(spec, dev)
    link(root, f"/sys/bus/pci/devices/{dev.address}", f"../../..{base.removeprefix('/sys')}")
    write(root, f"{base}/vendor", f"0x{dev.vendor}\n")
    write(root, f"{base}/device", f"0x{dev.device}\n")
    write(root, f"{base}/class", f"0x{dev.cls}\n")
    write(root, f"{base}/subsystem_vendor", f"0x{dev.subsys[0]}\n")
    write(root, f"{base}/subsystem_device", f"0x{dev.subsys[1]}\n")
    write(root, f"{base}/numa_node", f"{dev.node}\n")
    # With numa_node -1 the kernel lists every online CPU as local.
    write(
        root,
        f"{base}/local_cpulist",
        (all_cpus(spec) if dev.node < 0 else cpus_of(spec, dev.node)) + "\n",
    )
    write(root, f"{base}/driver_override", "(null)\n")
    write(root, f"{base}/modalias", modalias(dev) + "\n")
    if dev.cls.startswith("0300"):
        write(root, f"{base}/boot_vga", "1\n" if dev.boot_vga else "0\n")
    if dev.cls.startswith("03") and spec.bar1_gib:
        write(root, f"{base}/resource", gpu_resource(dev, spec.bar1_gib))
    # Relative to the device's own directory, as the kernel makes them.
    up = "../" * (base.count("/") - 1)
    if dev.driver:
        link(root, f"{base}/driver", f"{up}bus/pci/drivers/{dev.driver}")
    if dev.group is not None:
        link(root, f"{base}/iommu_group", f"{up}kernel/iommu_groups/{dev.group}")
    if dev.bridge:
        mark_dir(root, f"{base}/pci_bus")
    if dev.physfn:
        link(root, f"{base}/physfn", f"../{dev.physfn}")


def modalias(dev: Dev) -> str:
    """What udev asks kmod to load for the device, as sysfs prints it (pci-sysfs.c
    ``modalias_show``: IDs in 8 and class bytes in 2 upper-case hex digits)."""
    ids = "".join(
        f"{key}{value.upper():0>8}"
        for key, value in zip(
            ("v", "d", "sv", "sd"), (dev.vendor, dev.device, *dev.subsys), strict=True
        )
    )
    cls = dev.cls.upper()
    return f"pci:{ids}bc{cls[0:2]}sc{cls[2:4]}i{cls[4:6]}"


def write_module_aliases(root: Path, spec: HostSpec) -> None:
    """The running kernel's aliases as ``proxgpu snapshot`` keeps them: the lines of its
    ``modules.alias`` that find a module for a function of a GPU's slot, and of its built-in
    modules' (none, for these GPUs), each list after the gather's first line."""
    slots = {d.address.rsplit(".", 1)[0] for d in spec.devices if d.cls.startswith(("03", "12"))}
    names = [modalias(d) for d in spec.devices if d.address.rsplit(".", 1)[0] in slots]
    found = [
        f"alias {glob} {module}"
        for glob, module in MODULE_ALIASES
        if any(fnmatchcase(name, glob) for name in names)
    ]
    directory = f"/lib/modules/{spec.kernel}"
    write(root, f"{directory}/modules.alias", "".join(f"{line}\n" for line in [ALIAS_LIST, *found]))
    write(root, f"{directory}/modules.builtin.modinfo", ALIAS_LIST + "\0")


def gpu_resource(dev: Dev, bar1_gib: int) -> str:
    """A GPU's sysfs ``resource``: BAR0 registers (32-bit), BAR1 VRAM and BAR3 (64-bit,
    prefetchable), BAR5 I/O ports, then the ROM and the unused slots, as the kernel prints them."""
    bus = int(dev.address[5:7], 16)
    bar1 = (0x200 + bus * 4) << 32
    regions = [
        (0x8000_0000 + (bus >> 4) * (64 << 20), 64 << 20, 0x40200),
        (bar1, bar1_gib << 30, 0x14220C),
        (0, 0, 0),
        (bar1 + (bar1_gib << 30), 32 << 20, 0x14220C),
        (0, 0, 0),
        (0x1000 + bus * 0x100, 128, 0x40101),
        (0, 0, 0),
    ]
    lines = [
        f"0x{start:016x} 0x{start + size - 1 if size else 0:016x} 0x{flags:016x}"
        for start, size, flags in regions
    ]
    return (
        "\n".join(lines + ["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 6) + "\n"
    )


def write_device_nodes(root: Path, spec: HostSpec) -> None:
    """The nvidia device nodes, as a snapshot records them: empty files."""
    names = [f"nvidia{minor}" for minor in spec.nvidia_minors.values()]
    names += ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    names += [] if spec.headless else ["nvidia-modeset"]
    # MIG-capable datacenter GPUs: the capability nodes nvidia-modprobe creates (as on a real H200).
    names += ["nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2"] if spec.mig else []
    for name in names:
        write(root, f"/dev/{name}", "")


def gpu_uuid(address: str, minor: int) -> str:
    """The UUID an example GPU's /proc information (and nvidia-smi -L) gives it."""
    return f"GPU-{minor:08x}-5a1e-4c2b-9f3d-{address[5:7]}0000c7a200"


def write_nvidia(root: Path, spec: HostSpec) -> None:
    write(
        root,
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Wed May 21 20:06:11 UTC 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n",
    )
    for address, minor in spec.nvidia_minors.items():
        uuid = gpu_uuid(address, minor)
        write(
            root,
            f"/proc/driver/nvidia/gpus/{address}/information",
            f"Model: \t\t {spec.model}\nIRQ:   \t\t {200 + minor}\nGPU UUID: \t {uuid}\n"
            "Video BIOS: \t 98.02.2e.00.05\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {address}\nDevice Minor: \t {minor}\n"
            "GPU Firmware: \t 575.57.08\nGPU Excluded:\t No\n",
        )


#: The x86 flags every 64-bit server CPU of the last decade has, 1 GiB pages (pdpe1gb) among them
#: (a real line lists a hundred more).
CPU_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc "
    "cpuid pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c "
    "rdrand hypervisor lahf_lm abm avx2 bmi1 bmi2 erms"
)


def cpuinfo(spec: HostSpec) -> str:
    """The first CPU's block of ``/proc/cpuinfo`` as far as inspection reads it, in the kernel's
    order (``flags`` before ``address sizes``)."""
    physical, virtual = spec.address_bits
    return (
        f"processor\t: 0\nvendor_id\t: {spec.cpu_vendor}\ncpu family\t: 25\n"
        f"flags\t\t: {CPU_FLAGS}\n"
        f"address sizes\t: {physical} bits physical, {virtual} bits virtual\n"
    )


def write_host(spec: HostSpec) -> None:
    root = HERE / spec.name
    if root.exists():
        shutil.rmtree(root)
    write(root, "/proc/sys/kernel/hostname", f"{spec.name}\n")
    write(root, "/proc/sys/kernel/osrelease", f"{spec.kernel}\n")
    write(root, "/proc/cmdline", f"{spec.cmdline}\n")
    write(
        root,
        "/proc/devices",
        "Character devices:\n  1 mem\n  4 tty\n  5 /dev/tty\n 10 misc\n"
        f"{spec.char_devices}226 drm\n242 vfio\n\nBlock devices:\n  8 sd\n259 blkext\n",
    )
    write(
        root,
        "/usr/share/perl5/PVE/pvecfg.pm",
        "package PVE::pvecfg;\n\nuse strict;\nuse warnings;\n\n"
        "sub package {\n    return 'pve-manager';\n}\n\n"
        f"sub version {{\n    return '{spec.pve}';\n}}\n\n"
        f"sub release {{\n    return '{spec.pve.rsplit('.', 1)[0]}';\n}}\n",
    )
    write(root, "/usr/share/misc/pci.ids", spec.pci_ids)
    for node, (cpus, mem_kib) in spec.nodes.items():
        write(root, f"/sys/devices/system/node/node{node}/cpulist", f"{cpus}\n")
        write(
            root,
            f"/sys/devices/system/node/node{node}/meminfo",
            f"Node {node} MemTotal:       {mem_kib:>8} kB\n"
            f"Node {node} MemFree:        {mem_kib // 2:>8} kB\n",
        )
    write(root, "/proc/cpuinfo", cpuinfo(spec))
    for dev in spec.devices:
        write_device(root, spec, dev)
    write_module_aliases(root, spec)
    for driver in sorted({d.driver for d in spec.devices if d.driver} - BUILT_IN_DRIVERS):
        link(root, f"/sys/bus/pci/drivers/{driver}/module", f"../../../../module/{driver}")
    for tool in spec.tools:
        write(root, tool, "")
    if spec.nvidia_minors:
        write_nvidia(root, spec)
        write_device_nodes(root, spec)
    if spec.efi:
        mark_dir(root, "/sys/firmware/efi")
    mark_dir(root, "/etc/pve")
    for path, text in spec.files.items():
        write(root, path, text)
    for path, target in spec.links.items():
        link(root, path, target)
