"""Which devices the guests' Proxmox configs already hand to a guest.

A container claims an NVIDIA GPU through its device node (``devN: /dev/nvidia3``, a raw
``lxc.mount.entry: /dev/nvidia3 ...``) or its cgroup rule (``c 195:3 rwm``, or ``c 195:* rwm`` for
every GPU); a VM claims a PCI device through ``hostpciN`` with an address or a ``mapping=`` from
``/etc/pve/mapping/pci.cfg``. A ``hostpciN`` with ``mdev=`` is a vGPU: qemu-server creates a
mediated device on the GPU (``prepare_pci_device`` in PVE/QemuServer/PCI.pm) and leaves the GPU
on its host driver, so that claim needs the GPU kept there, not moved to vfio-pci. A
``hostpciN`` with ``driver=keep`` is still a passthrough (QEMU gets ``vfio-pci,host=ADDR``, as
``print_hostpci_devices`` writes it), but qemu-server neither resets the device nor binds it to
vfio-pci (``prepare_pci_device``): the host must have it on vfio-pci before the VM starts, and a
GPU that stays on its host driver stops the VM from starting, not the host's use of it. Only the
main section of a config counts: pending changes and snapshots do not hold devices. The claims
keep the addresses and minors as written; matching them to GPUs is the planner's job.

>>> configs = {"/etc/pve/lxc/201.conf": "dev0: /dev/nvidia3,gid=44\\n",
...            "/etc/pve/qemu-server/300.conf": "hostpci0: 81:00,pcie=1\\n"}
>>> [(c.guest.vmid, c.nvidia_minor, c.pci_address) for c in device_claims(configs, "pve1")]
[(201, 3, None), (300, None, '81:00')]
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from proxgpu.model import FrozenModel
from proxgpu.paths import GUEST_CONFIG, PCI_MAPPING
from proxgpu.pve.config import HOSTPCI_KEY, GuestConfig, hostpci_devices, parse_property_string
from proxgpu.pve.mapping import PciMappingConfig

NVIDIA_MAJOR = 195
"""The character major of ``/dev/nvidiaN``: registered, so it never changes (unlike nvidia-uvm)."""

_NVIDIA_NODE = re.compile(r"^/dev/nvidia(\d+)$")
_NVIDIA_CAP_NODE = re.compile(r"^/dev/nvidia-caps/nvidia-cap(\d+)$")
_NVIDIA_RULE = re.compile(rf"^c\s+{NVIDIA_MAJOR}:(\*|\d+)(?:\s|$)")
_CGROUP_ALLOW = ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")


class GuestRef(FrozenModel):
    """A guest by type and VMID, as the plan's JSON writes it.

    >>> GuestRef(type="lxc", vmid=200).model_dump()
    {'type': 'lxc', 'vmid': 200}
    """

    type: Literal["lxc", "vm"]
    vmid: int

    @property
    def label(self) -> str:
        """The guest as Proxmox's GUI names it.

        >>> GuestRef(type="lxc", vmid=200).label
        'CT 200'
        """
        return f"{'CT' if self.type == 'lxc' else 'VM'} {self.vmid}"


@dataclass(frozen=True, kw_only=True)
class DeviceClaim:
    """One config line by which a guest holds a device.

    Exactly one of ``pci_address`` (as written: ``81:00``, ``0000:81:00.0``) and ``nvidia_minor``
    (``"*"`` for ``c 195:* rwm``) is set. ``mapping`` names the PCI mapping the address came from,
    ``mdev`` the mediated device type of a vGPU entry; ``keep_driver`` marks a ``driver=keep``
    entry, whose binding qemu-server leaves to the host.

    >>> DeviceClaim(guest=GuestRef(type="lxc", vmid=201), path="/etc/pve/lxc/201.conf",
    ...             line="lxc.cgroup2.devices.allow: c 195:* rwm", nvidia_minor="*").nvidia_minor
    '*'
    """

    guest: GuestRef
    path: str
    line: str
    pci_address: str | None = None
    nvidia_minor: int | Literal["*"] | None = None
    mapping: str | None = None
    mdev: str | None = None
    keep_driver: bool = False

    @property
    def keeps_host_driver(self) -> bool:
        """A vGPU: the VM uses the GPU through its host driver."""
        return self.mdev is not None


def device_claims(configs: Mapping[str, str], node: str) -> list[DeviceClaim]:
    """Every device claim in the guest configs, by path then line.

    ``configs`` maps absolute paths to file text (``Inventory.guest_configs``); only
    ``/etc/pve/lxc/N.conf`` and ``/etc/pve/qemu-server/N.conf`` are guests of this host. PCI
    mappings resolve through ``/etc/pve/mapping/pci.cfg``, keeping the ``map`` entries whose
    ``node`` is this host's cluster node name (``Inventory.node_name``).

    >>> cfg = "gpu1\\n\\tmap id=10de:2330,node=pve1,path=0000:c1:00.0\\n"
    >>> configs = {PCI_MAPPING: cfg, "/etc/pve/qemu-server/301.conf": "hostpci1: mapping=gpu1"}
    >>> [(c.pci_address, c.mapping) for c in device_claims(configs, "pve1")]
    [('0000:c1:00.0', 'gpu1')]
    """
    mappings = _pci_mappings(configs.get(PCI_MAPPING, ""), node)
    claims: list[DeviceClaim] = []
    for path in sorted(configs):
        match = GUEST_CONFIG.match(path)
        if match is None:
            continue
        guest = GuestRef(type="lxc" if match[1] == "lxc" else "vm", vmid=int(match[2]))
        # Only the main section holds devices: pending changes and snapshots do not.
        for key, value in GuestConfig.parse(configs[path]).entries():
            line = f"{key}: {value}"
            if guest.type == "vm" and HOSTPCI_KEY.fullmatch(key):
                mdev, keep = hostpci_mdev(value), hostpci_keeps_binding(value)
                claims.extend(
                    DeviceClaim(
                        guest=guest,
                        path=path,
                        line=line,
                        pci_address=pci,
                        mapping=name,
                        mdev=mdev,
                        keep_driver=keep,
                    )
                    for pci, name in _hostpci_addresses(value, mappings)
                )
            elif guest.type == "lxc" and (minor := _lxc_minor(key, value)) is not None:
                claims.append(DeviceClaim(guest=guest, path=path, line=line, nvidia_minor=minor))
    return claims


def nvidia_cap_users(configs: Mapping[str, str]) -> dict[int, list[GuestRef]]:
    """NVIDIA capability minor -> the containers whose config gives them its node
    (``/dev/nvidia-caps/nvidia-capN`` as a ``devN`` entry or a raw ``lxc.mount.entry``): the MIG
    instances a container runs on, as each instance's pair of capability nodes says.

    >>> configs = {"/etc/pve/lxc/200.conf": "dev4: /dev/nvidia-caps/nvidia-cap22,mode=0444\\n"}
    >>> {minor: [g.label for g in guests] for minor, guests in nvidia_cap_users(configs).items()}
    {22: ['CT 200']}
    """
    users: dict[int, list[GuestRef]] = {}
    for path in sorted(configs):
        match = GUEST_CONFIG.match(path)
        if match is None or match[1] != "lxc":
            continue
        guest = GuestRef(type="lxc", vmid=int(match[2]))
        for key, value in GuestConfig.parse(configs[path]).entries():
            node = _lxc_node(key, value)
            cap = _NVIDIA_CAP_NODE.match(node or "")
            if cap and guest not in users.setdefault(int(cap[1]), []):
                users[int(cap[1])].append(guest)
    return users


def hostpci_mdev(value: str) -> str | None:
    """The mediated device type of a ``hostpciN`` value (a vGPU), if it names one.

    >>> hostpci_mdev("0000:81:00.0,mdev=nvidia-1072,pcie=1"), hostpci_mdev("81:00,pcie=1")
    ('nvidia-1072', None)
    """
    try:
        return parse_property_string(value, "host").get("mdev") or None
    except ValueError:
        return None


def hostpci_keeps_binding(value: str) -> bool:
    """Whether a ``hostpciN`` value says ``driver=keep`` (qemu-server's ``driver`` option, ``vfio``
    by default): qemu-server then leaves the device on the driver it has.

    >>> hostpci_keeps_binding("0000:81:00,driver=keep"), hostpci_keeps_binding("81:00,pcie=1")
    (True, False)
    """
    try:
        return parse_property_string(value, "host").get("driver") == "keep"
    except ValueError:
        return False


def _hostpci_addresses(
    value: str, mappings: dict[str, list[str]]
) -> Iterator[tuple[str, str | None]]:
    """The addresses of a ``hostpciN`` value, each with the mapping it came from."""
    try:
        addresses, mapping = hostpci_devices(value)
    except ValueError:
        return  # Proxmox refuses such a value: it claims nothing
    yield from ((address, None) for address in addresses)
    if mapping is not None:
        yield from ((address, mapping) for address in mappings.get(mapping, []))


def _lxc_minor(key: str, value: str) -> int | Literal["*"] | None:
    """The nvidia minor a container line gives access to, if any."""
    if key in _CGROUP_ALLOW:
        rule = _NVIDIA_RULE.match(value)
        if rule is None:
            return None
        return "*" if rule[1] == "*" else int(rule[1])
    match = _NVIDIA_NODE.match(_lxc_node(key, value) or "")
    return int(match[1]) if match else None


def _lxc_node(key: str, value: str) -> str | None:
    """The host device node a container line hands in (a ``devN`` entry's path, a raw
    ``lxc.mount.entry``'s source), if it is one of those."""
    if re.fullmatch(r"dev\d+", key):
        try:
            return parse_property_string(value, "path").get("path", "")
        except ValueError:
            return None
    if key == "lxc.mount.entry":
        return value.split(maxsplit=1)[0] if value else ""
    return None


def _pci_mappings(text: str, node: str) -> dict[str, list[str]]:
    """Mapping id -> the ``path`` of each of its ``map`` entries for this node."""
    config = PciMappingConfig.parse(text)
    mappings: dict[str, list[str]] = {}
    for mapping_id in config.ids():
        paths = []
        for key, value in config.entries(mapping_id):
            try:
                fields = parse_property_string(value) if key == "map" else {}
            except ValueError:
                continue
            # Mappings are cluster-wide: another node's map entry names that node's hardware.
            if fields.get("node", node) == node and fields.get("path"):
                paths.append(fields["path"])
        mappings[mapping_id] = paths
    return mappings
