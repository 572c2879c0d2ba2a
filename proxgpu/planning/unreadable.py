"""Device entries of the planned guests' configs that Proxmox cannot read.

Proxmox does not refuse such an entry: when it loads the config it warns ("unable to parse value
of 'hostpci0'") and leaves the entry out, so the guest starts without that device. A plan that
writes its own entries beside one would look complete while the guest lacks what the broken
entry meant to give it, so the plan says which entry that is.

The patterns are qemu-server's (``PVE::QemuServer::PCI``: ``$PCIRE`` for each ``host`` ID of a
``hostpciN`` value) and pve-container's (``verify_lxc_dev_string``: a ``devN`` path starts at
``/dev/`` and has no ``.`` or ``..`` component).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from proxgpu.paths import guest_config
from proxgpu.planning.context import Context
from proxgpu.planning.model import PlanGroup
from proxgpu.pve.claims import GuestRef
from proxgpu.pve.config import HOSTPCI_KEY, GuestConfig, hostpci_devices, parse_property_string

#: qemu-server's PCI ID (lower-case hex, as its pattern is matched).
_PCI_ID = re.compile(r"(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?")
_DEV = re.compile(r"dev\d+")


def warn_unreadable_entries(ctx: Context, groups: list[PlanGroup]) -> None:
    """Warn about each device entry of a guest the plan writes that Proxmox would leave out.

    >>> from proxgpu.inspection import Inventory
    >>> from proxgpu.planning.policy import SplitPolicy
    >>> configs = {"/etc/pve/qemu-server/300.conf": "hostpci0: 0000:81:0\\n"}
    >>> ctx = Context(Inventory(source="s", hostname="h", guest_configs=configs), SplitPolicy())
    >>> group = PlanGroup(role="vfio", numa_node=1, gpus=[], functions=[], cpus="0",
    ...                   memory_nodes=[1], driver="vfio-pci", guest={"type": "vm", "vmid": 300})
    >>> warn_unreadable_entries(ctx, [group])
    >>> ctx.warnings[0][:52]
    'VM 300: hostpci0: 0000:81:0 is not an entry Proxmox '
    """
    guests = dict.fromkeys(guest for group in groups for guest in group.guests)
    for guest in guests:
        text = ctx.inventory.guest_configs.get(guest_config(guest.type, guest.vmid))
        for key, value in _unreadable(guest, text or ""):
            ctx.warnings.append(
                f"{guest.label}: {key}: {value} is not an entry Proxmox can read (it leaves it out "
                "when it loads the config, so the guest starts without it): correct or remove it"
            )


def _unreadable(guest: GuestRef, text: str) -> Iterator[tuple[str, str]]:
    """The device entries of a config's main section that Proxmox cannot read."""
    vm = guest.type == "vm"
    device, readable = (HOSTPCI_KEY, _readable_hostpci) if vm else (_DEV, _readable_dev)
    for key, value in GuestConfig.parse(text).entries():
        if device.fullmatch(key) and not readable(value):
            yield key, value


def _readable_hostpci(value: str) -> bool:
    """
    >>> _readable_hostpci("0000:81:00.0,pcie=1"), _readable_hostpci("mapping=gpus")
    (True, True)
    >>> _readable_hostpci("0000:81:0"), _readable_hostpci("0000:C1:00.0"), _readable_hostpci("=")
    (False, False, False)
    """
    try:
        addresses, _mapping = hostpci_devices(value)
    except ValueError:
        return False
    return all(_PCI_ID.fullmatch(address) for address in addresses)


def _readable_dev(value: str) -> bool:
    """
    >>> _readable_dev("/dev/nvidia0,mode=0666"), _readable_dev("/dev/../etc"), _readable_dev("=")
    (True, False, False)
    """
    try:
        path = parse_property_string(value, "path").get("path", "")
    except ValueError:
        return False
    return path.startswith("/dev/") and not re.search(r"/\.\.?(?:/|$)", path)
