"""Host data is checked before it is believed: what a host's files say must make sense together,
or inspection stops (exit 8) naming the file, instead of a plan built on it.

>>> from proxgpu.inspection.inventory import Inventory, NumaNode
>>> validate(Inventory(source="pve1", hostname="pve1",
...                    numa_nodes=[NumaNode(id=0, cpus="0-99999999999")]))
Traceback (most recent call last):
...
proxgpu.errors.SysfsError: pve1: /sys/devices/system/node/node0/cpulist: CPU 99999999999 in \
'0-99999999999' is beyond any real machine (65536 CPUs)
"""

from __future__ import annotations

from proxgpu.cpulist import parse_cpulist
from proxgpu.errors import SysfsError
from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.paths import NVIDIA_GPUS, PCI_DEVICES

#: The nvidia driver numbers GPUs /dev/nvidia0 to /dev/nvidia254; 255 is /dev/nvidiactl.
MAX_NVIDIA_MINOR = 254


def validate(inventory: Inventory) -> None:
    """Refuse an inventory whose facts contradict each other or the kernel's limits.

    :raises SysfsError: naming the file that says what cannot be.
    """
    source = inventory.source
    for node in inventory.numa_nodes:
        _check_cpulist(source, f"/sys/devices/system/node/node{node.id}/cpulist", node.cpus)
    for gpu in inventory.gpus:
        if gpu.local_cpus is not None:
            _check_cpulist(source, f"{PCI_DEVICES}{gpu.address}/local_cpulist", gpu.local_cpus)
    _check_numa_nodes(inventory)
    _check_minors(source, inventory.gpus)


def _check_cpulist(source: str, path: str, text: str) -> None:
    try:
        parse_cpulist(text)
    except ValueError as exc:
        raise SysfsError(source, path, str(exc)) from None


def _check_numa_nodes(inventory: Inventory) -> None:
    known = {node.id for node in inventory.numa_nodes}
    if not known:
        return  # no node directory at all: every GPU's node is unknown anyway
    for gpu in inventory.gpus:
        if gpu.numa_node is not None and gpu.numa_node not in known:
            raise SysfsError(
                inventory.source,
                f"{PCI_DEVICES}{gpu.address}/numa_node",
                f"names NUMA node {gpu.numa_node}, but the host has nodes "
                f"{', '.join(map(str, sorted(known)))}",
            )


def _check_minors(source: str, gpus: list[Gpu]) -> None:
    seen: dict[int, str] = {}
    for gpu in gpus:
        minor = gpu.nvidia_minor
        if minor is None:
            continue
        path = f"{NVIDIA_GPUS}{gpu.address}/information"
        if minor > MAX_NVIDIA_MINOR:
            raise SysfsError(source, path, f"Device Minor {minor} is beyond /dev/nvidia254")
        if minor in seen:
            raise SysfsError(
                source,
                path,
                f"Device Minor {minor} is also that of {seen[minor]}: two GPUs "
                "cannot share /dev/nvidia" + str(minor),
            )
        seen[minor] = gpu.address
