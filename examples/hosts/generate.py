"""Write the synthetic example hosts under examples/hosts/ (run from anywhere; rewrites them).

Each host is a tree laid out like the host's absolute paths, exactly as ``proxgpu snapshot`` writes
one: sysfs attributes as one-line files, ``driver`` and ``iommu_group`` as symlinks, bridges marked
by a ``pci_bus`` directory, each device in its ``/sys/devices/pciDDDD:BB/...`` directory below its
root port and switch ports, with ``/sys/bus/pci/devices/ADDR`` a link to it as in sysfs, procfs and /etc files as they read on a Proxmox VE host. Every value
follows the kernel's sysfs ABI and NVIDIA's procfs formats; none is captured
from a real machine, so a tree made by ``proxgpu snapshot`` on a real host is always preferred.
"""

from __future__ import annotations

from dataclasses import replace

from sysfs_tree import HERE, Dev, HostSpec, gpu_uuid, write_host


def gpu_pair(
    address: str,
    node: int,
    group: int | None,
    gpu: tuple[str, str, str],
    audio: str | None,
    subsys: tuple[str, str],
    driver: str = "nvidia",
    parent: str | None = None,
) -> list[Dev]:
    vendor, device, cls = gpu
    devs = [Dev(address, vendor, device, cls, driver, group, node, subsys, parent=parent)]
    if audio:
        devs.append(
            Dev(
                address[:-1] + "1",
                vendor,
                audio,
                "040300",
                "snd_hda_intel",
                group,
                node,
                subsys,
                parent=parent,
            )
        )
    return devs


def root_port(address: str, node: int, group: int | None, device: str = "14ab") -> Dev:
    return Dev(address, "1022", device, "060400", "pcieport", group, node, bridge=True)


def nic(address: str, node: int, group: int | None, parent: str) -> Dev:
    """A ConnectX-7 port below ``parent``."""
    return Dev(
        address, "15b3", "1021", "020000", "mlx5_core", group, node, ("15b3", "0023"), parent=parent
    )


def bridge(address: str, ids: tuple[str, str], node: int, group: int | None, parent: str) -> Dev:
    """A switch port: upstream below a root port, downstream below the upstream port."""
    vendor, device = ids
    return Dev(
        address, vendor, device, "060400", "pcieport", group, node, bridge=True, parent=parent
    )


PCI_IDS_COMMON = (
    "# pci.ids subset written by proxgpu snapshot: only devices present on this host\n"
    "1022  Advanced Micro Devices, Inc. [AMD]\n"
    "\t14ab  Genoa/Bergamo/Siena PCIe GPP Bridge\n"
    "1a03  ASPEED Technology, Inc.\n"
    "\t2000  ASPEED Graphics Family\n"
)

# As a real 580 driver lists them (see h200-vm): nvidia-modeset has no line of its own.
NVIDIA_CHARS = (
    "195 nvidia\n195 nvidiactl\n507 nvidia-caps-imex-channels\n508 nvidia-caps\n"
    "509 nvidia-nvlink\n510 nvidia-nvswitch\n511 nvidia-uvm\n"
)

CT200_LXC = """\
#LLM serving container%3A vLLM on all eight GPUs
arch: amd64
cores: 64
features: nesting=1
hostname: llm
memory: 262144
mp0: /tank/models,mp=/models
net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:4A:2F:11,ip=dhcp,type=veth
onboot: 1
ostype: ubuntu
rootfs: local-zfs:subvol-200-disk-0,size=200G
swap: 0
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 511:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia3 dev/nvidia3 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia4 dev/nvidia4 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia5 dev/nvidia5 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia6 dev/nvidia6 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia7 dev/nvidia7 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file
"""

CT200_VM = """\
#Training VM%3A waits for the node-1 GPUs
bios: ovmf
boot: order=scsi0;net0
cores: 32
cpu: host
efidisk0: local-zfs:vm-300-disk-0,efitype=4m,pre-enrolled-keys=1,size=1M
machine: q35
memory: 262144
name: train
net0: virtio=BC:24:11:8E:03:7A,bridge=vmbr0,firewall=1
ostype: l26
scsi0: local-zfs:vm-300-disk-1,discard=on,iothread=1,size=500G
scsihw: virtio-scsi-single
smbios1: uuid=7f0c9a3e-2b1d-4e55-9a61-0c2d6b1e9f42
sockets: 1
vmgenid: 3c1f5b8e-77a2-4a0e-b1d9-5e2c4f6a8b10
"""

PVE_BLACKLIST = """\
# This file contains a list of modules which are not supported by Proxmox VE

# nvidiafb see bugreport https://bugzilla.proxmox.com/show_bug.cgi?id=701
blacklist nvidiafb
"""

#: depmod's file of the modules' own softdeps: NVIDIA's open module (kernel-open/nvidia/
#: libspdm_ecc.c) declares ``MODULE_SOFTDEP("pre: ecdh_generic,ecdsa_generic")``, ext4 crc32c.
MODULES_SOFTDEP = """\
# Soft dependencies extracted from modules themselves.
softdep ext4 pre: crc32c
softdep nvidia pre: ecdh_generic,ecdsa_generic
"""

ETC_MODULES = """\
# /etc/modules: kernel modules to load at boot time.
#
# This file contains the names of kernel modules that should be loaded
# at boot time, one per line. Lines beginning with "#" are ignored.
# Parameters can be specified after the module name.

"""


UNEVEN_LXC = """\
arch: amd64
cores: 48
hostname: inference
memory: 131072
net0: name=eth0,bridge=vmbr0,ip=dhcp,type=veth
ostype: debian
rootfs: local-lvm:vm-150-disk-0,size=64G
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 506:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
lxc.apparmor.profile: unconfined
"""


def ct200() -> HostSpec:
    rtx = ("10de", "2bb1", "030000")
    subsys = ("10de", "204b")
    devices: list[Dev] = []
    layout = [
        ("0000:01:00.0", 0, 12, "0000:00:01.1", 11),
        ("0000:11:00.0", 0, 20, "0000:10:01.1", 19),
        ("0000:61:00.0", 0, 36, "0000:60:01.1", 35),
        ("0000:71:00.0", 0, 44, "0000:70:01.1", 43),
        ("0000:81:00.0", 1, 60, "0000:80:01.1", 59),
        ("0000:91:00.0", 1, 68, "0000:90:01.1", 67),
        ("0000:e1:00.0", 1, 84, "0000:e0:01.1", 83),
        ("0000:f1:00.0", 1, 92, "0000:f0:01.1", 91),
    ]
    for address, node, group, port, port_group in layout:
        devices.append(root_port(port, node, port_group))
        devices += gpu_pair(address, node, group, rtx, "22e8", subsys, parent=port)
    devices += [root_port("0000:c0:01.1", 1, 75), nic("0000:c1:00.0", 1, 76, "0000:c0:01.1")]
    return HostSpec(
        name="ct200",
        address_bits=(52, 57),
        kernel="6.8.12-11-pve",
        pve="8.4.1",
        cmdline="initrd=\\EFI\\proxmox\\6.8.12-11-pve\\initrd.img-6.8.12-11-pve "
        "root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt",
        nodes={0: ("0-31", 528166912), 1: ("32-63", 528476160)},
        devices=devices,
        efi=True,
        nvidia_minors={address: i for i, (address, *_rest) in enumerate(layout)},
        model="NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        bar1_gib=128,
        char_devices=NVIDIA_CHARS,
        pci_ids=PCI_IDS_COMMON + "10de  NVIDIA Corporation\n"
        "\t22e8  GB202 High Definition Audio Controller\n"
        "\t2bb1  GB202GL [RTX PRO 6000 Blackwell Workstation Edition]\n"
        "15b3  Mellanox Technologies\n\t1021  MT2910 Family [ConnectX-7]\n",
        files={
            "/etc/pve/lxc/200.conf": CT200_LXC,
            "/etc/pve/qemu-server/300.conf": CT200_VM,
            "/etc/modprobe.d/pve-blacklist.conf": PVE_BLACKLIST,
            "/lib/modules/6.8.12-11-pve/modules.softdep": MODULES_SOFTDEP,
            "/etc/modules": ETC_MODULES,
            "/etc/kernel/cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt\n",
            "/etc/kernel/proxmox-boot-uuids": "4A1C-2B7F\n4A1C-9E03\n",
        },
    )


def single_socket() -> HostSpec:
    rtx4090 = ("10de", "2684", "030000")
    devices = [
        root_port("0000:00:01.1", -1, 2),
        *gpu_pair("0000:01:00.0", -1, 14, rtx4090, "22ba", ("1043", "889d"), parent="0000:00:01.1"),
        root_port("0000:00:03.1", -1, 4),
        *gpu_pair("0000:0b:00.0", -1, 16, rtx4090, "22ba", ("1043", "889d"), parent="0000:00:03.1"),
    ]
    devices[1].boot_vga = True
    return HostSpec(
        name="single-socket",
        headless=True,
        kernel="6.14.8-2-pve",
        pve="9.0.3",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.14.8-2-pve root=/dev/mapper/pve-root ro quiet",
        nodes={0: ("0-31", 131728004)},
        devices=devices,
        nvidia_minors={"0000:01:00.0": 0, "0000:0b:00.0": 1},
        model="NVIDIA GeForce RTX 4090",
        char_devices=NVIDIA_CHARS.replace("511 nvidia-uvm", "505 nvidia-uvm"),
        pci_ids=PCI_IDS_COMMON + "10de  NVIDIA Corporation\n\t2684  AD102 [GeForce RTX 4090]\n"
        "\t22ba  AD102 High Definition Audio Controller\n",
        files={
            "/etc/default/grub": 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_DISTRIBUTOR="Proxmox VE"\n'
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n',
            "/etc/modprobe.d/pve-blacklist.conf": PVE_BLACKLIST,
            "/lib/modules/6.14.8-2-pve/modules.softdep": MODULES_SOFTDEP,
            "/etc/modules": ETC_MODULES,
            "/etc/pve/lxc/101.conf": "arch: amd64\ncores: 8\nhostname: jellyfin\nmemory: 8192\n"
            "ostype: debian\nrootfs: local-lvm:vm-101-disk-0,size=16G\n"
            "unprivileged: 1\ndev0: /dev/nvidia0,gid=44\ndev1: /dev/nvidiactl,gid=44\n"
            "dev2: /dev/nvidia-uvm,gid=44\n",
        },
    )


def switched(address: str, node: int, gpu: tuple[str, str, str], with_nic: bool) -> list[Dev]:
    """A GPU behind a PCIe switch below its own root port (IOMMU off: no groups), with a
    ConnectX-7 on the switch's other downstream port when ``with_nic``, as GPU servers pair them."""
    bus = int(address[5:7], 16)
    port, upstream, down, nic_port = (
        f"0000:{bus - 3:02x}:01.0",
        f"0000:{bus - 2:02x}:00.0",
        f"0000:{bus - 1:02x}:00.0",
        f"0000:{bus - 1:02x}:01.0",
    )
    switch = ("1000", "c030")
    devices = [
        Dev(port, "8086", "352a", "060400", "pcieport", None, node, bridge=True),
        bridge(upstream, switch, node, None, port),
        bridge(down, switch, node, None, upstream),
        *gpu_pair(address, node, None, gpu, None, ("10de", "1851"), parent=down),
    ]
    if with_nic:
        devices += [bridge(nic_port, switch, node, None, upstream)]
        devices += [nic(f"0000:{bus + 1:02x}:00.0", node, None, nic_port)]
    return devices


def uneven() -> HostSpec:
    l40s = ("10de", "26b9", "030200")
    devices: list[Dev] = []
    addresses = [
        "0000:17:00.0",
        "0000:31:00.0",
        "0000:4b:00.0",
        "0000:65:00.0",
        "0000:7f:00.0",
        "0000:98:00.0",
        "0000:b1:00.0",
        "0000:ca:00.0",
    ]
    for i, address in enumerate(addresses):
        devices += switched(address, 0 if i < 5 else 1, l40s, with_nic=i % 2 == 0)
    return HostSpec(
        name="uneven-5-3",
        mig=True,
        cpu_vendor="GenuineIntel",
        address_bits=(46, 57),
        kernel="6.2.16-3-pve",
        pve="8.0.3",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.2.16-3-pve root=/dev/mapper/pve-root ro quiet",
        nodes={0: ("0-23,48-71", 263678136), 1: ("24-47,72-95", 264207688)},
        devices=devices,
        nvidia_minors={a: i for i, a in enumerate(addresses)},
        model="NVIDIA L40S",
        char_devices=NVIDIA_CHARS.replace("511 nvidia-uvm", "506 nvidia-uvm"),
        pci_ids=PCI_IDS_COMMON + "1000  Broadcom / LSI\n\tc030  PEX890xx PCIe Gen 5 Switch\n"
        "10de  NVIDIA Corporation\n\t26b9  AD102GL [L40S]\n"
        "15b3  Mellanox Technologies\n\t1021  MT2910 Family [ConnectX-7]\n"
        "8086  Intel Corporation\n\t352a  Ice Lake/Sapphire Rapids PCIe Root Port\n",
        files={
            "/etc/default/grub": 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_DISTRIBUTOR="Proxmox VE"\n'
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n',
            "/etc/modprobe.d/pve-blacklist.conf": PVE_BLACKLIST,
            "/etc/modules": ETC_MODULES,
            # Proxmox VE 8.0 has no devN entries: the container gets raw lxc lines.
            "/etc/pve/lxc/150.conf": UNEVEN_LXC,
        },
    )


def shared_group() -> HostSpec:
    a6000 = ("10de", "2230", "030000")
    subsys = ("10de", "1459")
    devices = [
        root_port("0000:00:01.1", 0, 3),
        *gpu_pair("0000:01:00.0", 0, 14, a6000, "1aef", subsys, parent="0000:00:01.1"),
        root_port("0000:00:03.1", 0, 5),
        *gpu_pair("0000:02:00.0", 0, 15, a6000, "1aef", subsys, parent="0000:00:03.1"),
        # A PCIe switch without ACS: both GPUs behind it share one IOMMU group with its ports.
        Dev("0000:80:01.1", "10b5", "8747", "060400", "pcieport", 40, 1, bridge=True),
        bridge("0000:81:00.0", ("10b5", "8747"), 1, 40, "0000:80:01.1"),
        bridge("0000:82:08.0", ("10b5", "8747"), 1, 40, "0000:81:00.0"),
        bridge("0000:82:10.0", ("10b5", "8747"), 1, 40, "0000:81:00.0"),
        *gpu_pair("0000:83:00.0", 1, 40, a6000, "1aef", subsys, parent="0000:82:08.0"),
        *gpu_pair("0000:84:00.0", 1, 40, a6000, "1aef", subsys, parent="0000:82:10.0"),
    ]
    return HostSpec(
        name="shared-iommu-group",
        kernel="6.8.12-11-pve",
        pve="8.4.1",
        cmdline="BOOT_IMAGE=/boot/vmlinuz-6.8.12-11-pve root=/dev/mapper/pve-root ro quiet iommu=pt",
        nodes={0: ("0-15,32-47", 131728004), 1: ("16-31,48-63", 132071424)},
        devices=devices,
        nvidia_minors={"0000:01:00.0": 0, "0000:02:00.0": 1, "0000:83:00.0": 2, "0000:84:00.0": 3},
        model="NVIDIA RTX A6000",
        char_devices=NVIDIA_CHARS,
        pci_ids=PCI_IDS_COMMON
        + "10b5  PLX Technology, Inc.\n\t8747  PEX 8747 48-Lane, 5-Port PCI Express Gen 3 (8.0 GT/s) Switch\n"
        "10de  NVIDIA Corporation\n\t1aef  GA102 High Definition Audio Controller\n\t2230  GA102GL [RTX A6000]\n",
        files={
            "/etc/default/grub": 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_DISTRIBUTOR="Proxmox VE"\n'
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"\nGRUB_CMDLINE_LINUX=""\n',
            "/etc/modules": ETC_MODULES,
        },
    )


VGPU_VM_310 = """\
#CAD desktops%3A an NVIDIA vGPU of the node-1 L40S
bios: ovmf
cores: 8
cpu: host
efidisk0: local-zfs:vm-310-disk-1,efitype=4m,pre-enrolled-keys=1,size=1M
machine: q35
memory: 32768
name: cad
net0: virtio=BC:24:11:5D:21:0C,bridge=vmbr0,firewall=1
ostype: win11
scsi0: local-zfs:vm-310-disk-0,size=200G
sockets: 1
hostpci0: 0000:81:00.0,mdev=nvidia-1155,pcie=1
"""

VGPU_VM_400 = """\
#Render node%3A waits for a vGPU
bios: ovmf
cores: 8
cpu: host
efidisk0: local-zfs:vm-400-disk-1,efitype=4m,pre-enrolled-keys=1,size=1M
machine: q35
memory: 32768
name: render
net0: virtio=BC:24:11:5D:21:0D,bridge=vmbr0,firewall=1
ostype: l26
scsi0: local-zfs:vm-400-disk-0,size=100G
sockets: 1
"""

#: mdev_supported_types of an L40S under NVIDIA's vGPU host driver (synthetic ids and counts,
#: in the kernel's mdev sysfs ABI): a GPU runs one type at a time, so once VM 310's 8Q instance
#: exists on 0000:81:00.0 (VM 310 runs: its type's devices/ lists it) its other types offer none.
VGPU_TYPES = (("nvidia-1155", "NVIDIA L40S-8Q", 6), ("nvidia-1158", "NVIDIA L40S-48Q", 1))


def vgpu_files(address: str, used: int) -> dict[str, str]:
    files = {}
    for type_id, name, instances in VGPU_TYPES:
        base = f"/sys/bus/pci/devices/{address}/mdev_supported_types/{type_id}/"
        left = instances - used if type_id == "nvidia-1155" else (0 if used else instances)
        files[base + "name"] = f"{name}\n"
        files[base + "available_instances"] = f"{left}\n"
        files[base + "device_api"] = "vfio-pci\n"
    return files


def vgpu_host() -> HostSpec:
    l40s = ("10de", "26b9", "030200")
    devices: list[Dev] = []
    layout = [
        ("0000:01:00.0", 0, 12, "0000:00:01.1", 11),
        ("0000:11:00.0", 0, 20, "0000:10:01.1", 19),
        ("0000:81:00.0", 1, 60, "0000:80:01.1", 59),
        ("0000:91:00.0", 1, 68, "0000:90:01.1", 67),
    ]
    files = {
        "/etc/pve/lxc/200.conf": CT200_LXC.split("lxc.cgroup2", maxsplit=1)[0].replace(
            "memory: 262144", "memory: 65536"
        ),
        "/etc/pve/qemu-server/310.conf": VGPU_VM_310,
        "/etc/pve/qemu-server/400.conf": VGPU_VM_400,
        "/etc/modprobe.d/pve-blacklist.conf": PVE_BLACKLIST,
        "/etc/modules": ETC_MODULES,
        "/etc/kernel/cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on iommu=pt\n",
        "/etc/kernel/proxmox-boot-uuids": "5B2D-3C80\n",
    }
    for address, node, group, port, port_group in layout:
        devices.append(root_port(port, node, port_group))
        devices += gpu_pair(address, node, group, l40s, None, ("10de", "1851"), parent=port)
        files.update(vgpu_files(address, used=1 if address == "0000:81:00.0" else 0))
    # qemu-server names VM 310's hostpci0 mdev by its index and VMID (generate_mdev_uuid).
    running = "00000000-0000-0000-0000-000000000310"
    links = {
        f"/sys/bus/pci/devices/0000:81:00.0/mdev_supported_types/nvidia-1155/devices/{running}": (
            f"../../../{running}"
        )
    }
    return HostSpec(
        name="vgpu",
        links=links,
        cpu_vendor="GenuineIntel",
        address_bits=(46, 57),
        kernel="6.8.12-11-pve",
        pve="8.4.1",
        cmdline="initrd=\\EFI\\proxmox\\6.8.12-11-pve\\initrd.img-6.8.12-11-pve "
        "root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on iommu=pt",
        nodes={0: ("0-31", 263678136), 1: ("32-63", 264207688)},
        devices=devices,
        efi=True,
        nvidia_minors={address: i for i, (address, *_rest) in enumerate(layout)},
        model="NVIDIA L40S",
        char_devices=NVIDIA_CHARS,
        pci_ids=PCI_IDS_COMMON + "10de  NVIDIA Corporation\n\t26b9  AD102GL [L40S]\n",
        files=files,
    )


def sriov_vfs(address: str, count: int = 8) -> list[str]:
    """The addresses of a GPU's first ``count`` SR-IOV virtual functions: NVIDIA's GPUs put the
    first one at function 4 of their own slot and number on from there (ARI: up to eight
    functions a slot), as ``sriov-manage -e`` enables them."""
    slot = int(address[8:10], 16)
    return [f"{address[:8]}{slot + (4 + n) // 8:02x}.{(4 + n) % 8}" for n in range(count)]


#: The vGPU types an L40S's VFs list as creatable (vGPU 17 and later: the VF's
#: nvidia/creatable_vgpu_types, "ID : name"; synthetic ids, as for the vgpu host).
SRIOV_TYPES = ((1155, "NVIDIA L40S-8Q"), (1158, "NVIDIA L40S-48Q"))

VGPU_SRIOV_VM_310 = VGPU_VM_310.replace(
    "#CAD desktops%3A an NVIDIA vGPU of the node-1 L40S",
    "#CAD desktops%3A an NVIDIA vGPU on a VF of the node-1 L40S",
).replace("hostpci0: 0000:81:00.0,", "hostpci0: 0000:81:01.2,")

VGPU_SRIOV_VM_311 = (
    VGPU_SRIOV_VM_310.replace("#CAD desktops%3A", "#CAD desktops (stopped)%3A")
    .replace("name: cad", "name: cad-2")
    .replace("vm-310-", "vm-311-")
    .replace("BC:24:11:5D:21:0C", "BC:24:11:5D:21:0E")
    .replace("hostpci0: 0000:81:01.2,", "hostpci0: 0000:81:00.4,")
)


def sriov_vgpu_files(address: str, running: str | None) -> dict[str, str]:
    """The nvidia/ files of each VF of GPU ``address``: the VF ``running`` holds an 8Q vGPU (a
    running VM's), the others hold none (a stopped VM's VF too, until the VM starts); once one
    exists, a GPU in NVIDIA's default (homogeneous) mode lets its other VFs make only that
    type, and the VF holding it lists nothing."""
    files = {}
    for vf in sriov_vfs(address):
        base = f"/sys/bus/pci/devices/{vf}/nvidia/"
        held = vf == running
        if held:
            creatable = []
        elif running is not None:
            creatable = [t for t in SRIOV_TYPES if t[0] == 1155]
        else:
            creatable = list(SRIOV_TYPES)
        files[base + "current_vgpu_type"] = "1155\n" if held else "0\n"
        files[base + "creatable_vgpu_types"] = "".join(f"{i:<5} : {n}\n" for i, n in creatable)
    return files


def vgpu_sriov_host() -> HostSpec:
    """The vgpu host's four L40S with NVIDIA vGPU 17 on SR-IOV: every GPU's VFs enabled
    (sriov-manage -e ALL), VM 310 running a vGPU on VF 0000:81:01.2, stopped VM 311 configured
    with one on VF 0000:81:00.4, VM 400 without a GPU."""
    l40s = ("10de", "26b9", "030200")
    subsys = ("10de", "1851")
    layout = [
        ("0000:01:00.0", 0, 12, "0000:00:01.1", 11),
        ("0000:11:00.0", 0, 20, "0000:10:01.1", 19),
        ("0000:81:00.0", 1, 60, "0000:80:01.1", 59),
        ("0000:91:00.0", 1, 68, "0000:90:01.1", 67),
    ]
    spec = vgpu_host()
    devices: list[Dev] = []
    files = {
        path: text
        for path, text in spec.files.items()
        if not path.startswith("/sys/") and path != "/etc/pve/qemu-server/310.conf"
    }
    files["/etc/pve/qemu-server/310.conf"] = VGPU_SRIOV_VM_310
    files["/etc/pve/qemu-server/311.conf"] = VGPU_SRIOV_VM_311
    for i, (address, node, group, port, port_group) in enumerate(layout):
        devices.append(root_port(port, node, port_group))
        devices += gpu_pair(address, node, group, l40s, None, subsys, parent=port)
        devices += [
            Dev(vf, *l40s, "nvidia", 200 + 8 * i + n, node, subsys, parent=port, physfn=address)
            for n, vf in enumerate(sriov_vfs(address))
        ]
        running = "0000:81:01.2" if address == "0000:81:00.0" else None
        files.update(sriov_vgpu_files(address, running))
    # The vgpu host's machine, with SR-IOV's functions and files instead of its mdev link.
    return replace(
        spec,
        name="vgpu-sriov",
        devices=devices,
        links={},
        efi=True,
        nvidia_minors={address: i for i, (address, *_rest) in enumerate(layout)},
        char_devices=NVIDIA_CHARS,
        files=files,
    )


MIG_CT = """\
#Notebook%3A one MIG instance
arch: amd64
cores: 8
hostname: {name}
memory: 32768
net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:4E:{mac}:0A,ip=dhcp,type=veth
ostype: debian
rootfs: local-zfs:subvol-{vmid}-disk-0,size=64G
swap: 0
unprivileged: 1
"""

#: The MIG layout the admin made on GPU 0 (nvidia-smi mig -cgi 9,14,19 -C, then a second
#: compute instance in GPU instance 3): (GPU instance id, compute instance ids).
MIG_LAYOUT = ((2, (0,)), (3, (0, 1)), (9, (0,)))


def mig_cap_minor(gpu: int, gi: int, ci: int | None = None) -> int:
    """The minor NVIDIA's table gives a MIG capability (nv-caps.c: mig/config 1, mig/monitor 2,
    then per GPU 15 GPU instances of one access file and 8 compute instances each)."""
    return 3 + gpu * 135 + gi * 9 + (0 if ci is None else 1 + ci)


def mig_files(gpu: int) -> dict[str, str]:
    """The /proc access files of GPU ``gpu``'s MIG instances and the nodes nvidia-modprobe made
    of them, with mig/config and mig/monitor (modes as the driver gives them: 0400 and 0444)."""
    base = "/proc/driver/nvidia/capabilities"
    caps = {f"{base}/mig/config": (1, 0o400), f"{base}/mig/monitor": (2, 0o444)}
    for gi, cis in MIG_LAYOUT:
        caps[f"{base}/gpu{gpu}/mig/gi{gi}/access"] = (mig_cap_minor(gpu, gi), 0o444)
        for ci in cis:
            caps[f"{base}/gpu{gpu}/mig/gi{gi}/ci{ci}/access"] = (mig_cap_minor(gpu, gi, ci), 0o444)
    files = {
        path: f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"
        for path, (minor, mode) in caps.items()
    }
    files.update({f"/dev/nvidia-caps/nvidia-cap{minor}": "" for minor, _ in caps.values()})
    return files


#: GPU 0's MIG devices as nvidia-smi numbers them (its "MIG Dev", -L's "Device N"), with the
#: profile -L names each by: (GPU instance id, compute instance id, profile).
MIG_DEVICES = ((2, 0, "3g.71gb"), (3, 0, "1c.2g.35gb"), (3, 1, "1c.2g.35gb"), (9, 0, "1g.18gb"))


def mig_uuid(gi: int, ci: int) -> str:
    """An example MIG device's UUID (``MIG-`` and a UUID's hex form, as driver R470 and later
    print it)."""
    return f"MIG-00000000-5a1e-5c2b-9f3d-{gi:02x}{ci:02x}0000c7a2"


def mig_smi_files(gpus: list[tuple[str, str]]) -> dict[str, str]:
    """What ``proxgpu snapshot`` keeps of nvidia-smi on the mig host: ``nvidia-smi -L`` and the
    plain ``nvidia-smi``'s tables, laid out as NVIDIA's MIG user guide shows them ("Getting
    Started with MIG", "CUDA Device Enumeration"; R450-era column widths), for GPUs ``(address,
    UUID)`` in nvidia-smi's order, GPU 0 carrying :data:`MIG_DEVICES`."""
    listing = []
    for index, (_address, uuid) in enumerate(gpus):
        listing.append(f"GPU {index}: NVIDIA H200 (UUID: {uuid})")
        listing += [
            f"  MIG {profile:<12} Device {n:>2}: (UUID: {mig_uuid(gi, ci)})"
            for n, (gi, ci, profile) in enumerate(MIG_DEVICES if index == 0 else ())
        ]
    rule = "+-------------------------------+----------------------+----------------------+"
    table = [
        "+-----------------------------------------------------------------------------+",
        "| NVIDIA-SMI 575.57.08    Driver Version: 575.57.08    CUDA Version: 12.9     |",
        "|-------------------------------+----------------------+----------------------+",
        "| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |",
        "|                               |                      |               MIG M. |",
        "|===============================+======================+======================|",
    ]
    for index, (address, _uuid) in enumerate(gpus):
        mig = index == 0
        table += [
            f"|  {index:>2}  NVIDIA H200         On   | 0000{address.upper()} Off |"
            f"{'On' if mig else '0':>21} |",
            f"| N/A   31C    P0    {'90W' if mig else '75W'} / 700W |"
            f"{'96MiB' if mig else '0MiB':>10} / 143771MiB |"
            f"{'N/A' if mig else '0%':>8}      Default |",
            f"|                               |                      |"
            f"{'Enabled' if mig else 'Disabled':>21} |",
            rule,
        ]
    mig_rule = "+------------------+----------------------+-----------+-----------------------+"
    table += [
        "",
        "+-----------------------------------------------------------------------------+",
        "| MIG devices:                                                                |",
        mig_rule,
        "| GPU  GI  CI  MIG |         Memory-Usage |        Vol|         Shared        |",
        "|      ID  ID  Dev |           BAR1-Usage | SM     Unc| CE  ENC  DEC  OFA  JPG|",
        "|                  |                      |        ECC|                       |",
        "|==================+======================+===========+=======================|",
    ]
    for n, (gi, ci, _profile) in enumerate(MIG_DEVICES):
        table += [
            f"|  0  {gi:>3} {ci:>3} {n:>3}  |     13MiB / 35584MiB | 16      0 |"
            "  1   0    1    0    1 |",
            "|                  |      0MiB / 65535MiB |           |                       |",
            mig_rule,
        ]
    table += [
        "",
        "+-----------------------------------------------------------------------------+",
        "| Processes:                                                                  |",
        "|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |",
        "|        ID   ID                                                   Usage      |",
        "|=============================================================================|",
        "|  No running processes found                                                 |",
        "+-----------------------------------------------------------------------------+",
    ]
    return {
        "/var/lib/proxgpu/captured/nvidia-smi-L": "\n".join(listing) + "\n",
        "/var/lib/proxgpu/captured/nvidia-smi": "\n".join(table) + "\n",
    }


def mig_host() -> HostSpec:
    h200 = ("10de", "2335", "030200")
    devices: list[Dev] = []
    layout = [
        ("0000:18:00.0", 0, 12, "0000:17:01.1", 11),
        ("0000:2a:00.0", 0, 20, "0000:29:01.1", 19),
        ("0000:9a:00.0", 1, 60, "0000:99:01.1", 59),
        ("0000:ab:00.0", 1, 68, "0000:aa:01.1", 67),
    ]
    for address, node, group, port, port_group in layout:
        devices.append(root_port(port, node, port_group))
        devices += gpu_pair(address, node, group, h200, None, ("10de", "18be"), parent=port)
    files = {
        "/etc/pve/lxc/200.conf": MIG_CT.format(name="notebook-a", mac="10", vmid=200),
        "/etc/pve/lxc/201.conf": MIG_CT.format(name="notebook-b", mac="11", vmid=201),
        "/etc/pve/qemu-server/300.conf": CT200_VM,
        "/etc/modprobe.d/pve-blacklist.conf": PVE_BLACKLIST,
        "/etc/modules": ETC_MODULES,
        "/etc/kernel/cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt\n",
        "/etc/kernel/proxmox-boot-uuids": "6C3E-4D91\n",
    }
    files.update(mig_files(gpu=0))
    files.update(mig_smi_files([(a, gpu_uuid(a, minor)) for minor, (a, *_r) in enumerate(layout)]))
    return HostSpec(
        name="mig",
        headless=True,
        address_bits=(52, 57),
        kernel="6.8.12-11-pve",
        pve="8.4.1",
        cmdline="initrd=\\EFI\\proxmox\\6.8.12-11-pve\\initrd.img-6.8.12-11-pve "
        "root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt",
        nodes={0: ("0-47", 528166912), 1: ("48-95", 528476160)},
        devices=devices,
        efi=True,
        nvidia_minors={address: i for i, (address, *_rest) in enumerate(layout)},
        model="NVIDIA H200",
        bar1_gib=256,
        char_devices=NVIDIA_CHARS,
        pci_ids=PCI_IDS_COMMON + "10de  NVIDIA Corporation\n\t2335  GH100 [H200 SXM 141GB]\n",
        files=files,
    )


def main() -> None:
    hosts = (ct200(), single_socket(), uneven(), shared_group(), vgpu_host(), vgpu_sriov_host())
    for spec in (*hosts, mig_host()):
        write_host(spec)
        print(f"wrote {HERE / spec.name}")


if __name__ == "__main__":
    main()
