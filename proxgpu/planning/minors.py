"""The ``/dev/nvidiaN`` each GPU kept on nvidia has after the reboot that completes a split.

The driver hands out minors in probe order, lowest free number first, so they hold only while
the same GPUs are probed. With the modprobe binding the vfio GPUs carry their override before
nvidia loads, so the next boot numbers the kept ones 0, 1, ... in probe order (see
:func:`probe_order`). driverctl sets its override from a udev rule that runs after udev has
loaded nvidia for the first GPU, and nvidia probes every GPU it matches at once: each keeps the
minor of its rank among all of them, and the vfio ones' numbers are left free.

The planner checks the entries of containers it does not rewrite against these numbers, and the
renderer gives the containers it does rewrite their nodes by them.

>>> from proxgpu.inspection import Gpu, Inventory
>>> def gpu(bus, minor):
...     address = f"0000:{bus}:00.0"
...     return Gpu(address=address, vendor_id="10de", device_id="2330", class_code="0x030200",
...                driver="nvidia", nvidia_minor=minor, functions=[address], function_info=[])
>>> inventory = Inventory(source="pve1", hostname="pve1",
...                       gpus=[gpu("01", 0), gpu("11", 1), gpu("81", 2), gpu("91", 3)])
>>> boot_minors(inventory, ["0000:81:00.0", "0000:91:00.0"])
{'0000:81:00.0': 0, '0000:91:00.0': 1}
>>> boot_minors(inventory, ["0000:81:00.0", "0000:91:00.0"], "driverctl")
{'0000:81:00.0': 2, '0000:91:00.0': 3}
"""

from __future__ import annotations

from collections.abc import Iterable

from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.pci import NVIDIA_DRIVER
from proxgpu.planning.policy import BindMethod


def boot_minors(
    inventory: Inventory, kept: Iterable[str], bind_method: BindMethod = "modprobe"
) -> dict[str, int]:
    """The minor after the next boot of each GPU in ``kept`` (addresses of the GPUs the plan
    keeps on their host driver) that is on nvidia then, under ``bind_method``; the minors of
    today when the same GPUs stay on nvidia."""
    wanted = set(kept)
    planned = sorted(g.address for g in inventory.gpus if g.address in wanted and _nvidia(g))
    current = sorted(g.address for g in inventory.gpus if g.driver == NVIDIA_DRIVER)
    minors = {g.address: g.nvidia_minor for g in inventory.gpus}
    if planned == current and all(minors[a] is not None for a in planned):
        return {a: m for a, m in minors.items() if a in planned and m is not None}
    probed = planned
    if bind_method == "driverctl":
        probed = sorted(g.address for g in inventory.gpus if _nvidia(g))
    probed = probe_order(probed, minors)
    return {address: probed.index(address) for address in planned}


def _nvidia(gpu: Gpu) -> bool:
    return gpu.host_driver == NVIDIA_DRIVER


def probe_order(addresses: list[str], minors: dict[str, int | None]) -> list[str]:
    """``addresses`` in the order the driver probes them: the kernel's PCI enumeration, which
    the GPUs' minors today record (each took the lowest free one as it was probed) and which
    need not be the addresses' order (host bridges are enumerated in firmware order); in PCI
    order when a GPU has no minor today.

    >>> probe_order(["0000:21:00.0", "0000:81:00.0"], {"0000:21:00.0": 1, "0000:81:00.0": 0})
    ['0000:81:00.0', '0000:21:00.0']
    """
    if any(minors.get(a) is None for a in addresses):
        return sorted(addresses)
    return sorted(addresses, key=lambda a: (minors[a], a))
