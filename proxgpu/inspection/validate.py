"""Host data is checked before it is believed: what a host's files say must make sense together,
or inspection stops (exit 8) naming the file, instead of a plan built on it.

>>> from proxgpu.inspection.inventory import Inventory, NumaNode
>>> validate(Inventory(source="pve1", hostname="pve1",
...                    numa_nodes=[NumaNode(id=0, cpus="0-99999999999")]))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
proxgpu.errors.SysfsError: pve1: /sys/devices/system/node/node0/cpulist: CPU 99999999999 in \
'0-99999999999' is beyond any real machine (65536 CPUs); the kernel writes this file: ...
"""

from __future__ import annotations

import re

from proxgpu.cpulist import format_cpulist, parse_cpulist
from proxgpu.errors import SysfsError
from proxgpu.inspection.inventory import Gpu, Inventory, PciFunction
from proxgpu.paths import NVIDIA_GPUS, PCI_DEVICES

#: The nvidia driver numbers GPUs /dev/nvidia0 to /dev/nvidia254; 255 is /dev/nvidiactl.
MAX_NVIDIA_MINOR = 254


def validate(inventory: Inventory) -> None:
    """Refuse an inventory whose facts contradict each other or the kernel's limits.

    :raises SysfsError: naming the file that says what cannot be.
    """
    source = inventory.source
    owner: dict[int, int] = {}  # CPU -> the node that has it
    for node in inventory.numa_nodes:
        path = f"/sys/devices/system/node/node{node.id}/cpulist"
        for cpu in _check_cpulist(source, path, node.cpus):
            if cpu in owner:
                raise SysfsError(
                    source, path, f"CPU {cpu} is also node{owner[cpu]}'s: a CPU is on one node"
                )
            owner[cpu] = node.id
    for gpu in inventory.gpus:
        if gpu.local_cpus is not None:
            path = f"{PCI_DEVICES}{gpu.address}/local_cpulist"
            cpus = _check_cpulist(source, path, gpu.local_cpus)
            _check_cpus_exist(source, path, cpus, owner)
    _check_numa_nodes(inventory)
    _check_minors(source, inventory.gpus)
    for function in (f for gpu in inventory.gpus for f in gpu.function_info):
        _check_modalias(source, function)


#: The fields of a PCI modalias that other sysfs files also give.
_MODALIAS_FIELDS = re.compile(
    r"pci:v(?P<vendor>\w{8})d(?P<device>\w{8})sv\w{8}sd\w{8}bc(?P<base>\w\w)sc(?P<sub>\w\w)i(?P<prog>\w\w)"
)


def _check_modalias(source: str, function: PciFunction) -> None:
    """A function's modalias says its IDs and class as its other files do (the kernel prints
    them all from one ``struct pci_dev``), so kmod is asked about the device that is there.

    >>> fn = PciFunction(address="0000:01:00.0", vendor_id="10de", device_id="2bb1",
    ...                  class_code="0x030000",
    ...                  modalias="pci:v00001002d00002BB1sv000010DEsd0000204Bbc03sc00i00")
    >>> _check_modalias("pve1", fn)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    proxgpu.errors.SysfsError: pve1: /sys/bus/pci/devices/0000:01:00.0/modalias: says vendor \
00001002, but its vendor file says 10de, and the kernel prints both from one device: refusing the \
host's data; the kernel writes this file: ...
    """
    fields = _MODALIAS_FIELDS.fullmatch(function.modalias or "")
    if fields is None:
        return  # not read (names.py refused any other form)
    said = {
        "vendor": fields["vendor"],
        "device": fields["device"],
        "class": fields["base"] + fields["sub"] + fields["prog"],
    }
    known = {
        "vendor": function.vendor_id,
        "device": function.device_id,
        "class": function.class_code.removeprefix("0x"),
    }
    for name, value in said.items():
        if int(value, 16) != int(known[name], 16):
            raise SysfsError(
                source,
                f"{PCI_DEVICES}{function.address}/modalias",
                f"says {name} {value}, but its {name} file says {known[name]}, and the kernel "
                "prints both from one device: refusing the host's data",
            )


def _check_cpulist(source: str, path: str, text: str) -> list[int]:
    try:
        return parse_cpulist(text)
    except ValueError as exc:
        raise SysfsError(source, path, str(exc)) from None


def _check_cpus_exist(source: str, path: str, cpus: list[int], owner: dict[int, int]) -> None:
    """A device's local CPUs are CPUs of the host's nodes (when the host lists its nodes)."""
    missing = [cpu for cpu in cpus if cpu not in owner]
    if owner and missing:
        raise SysfsError(
            source,
            path,
            f"names CPU {missing[0]}, which none of the host's NUMA nodes has "
            f"({format_cpulist(owner)})",
        )


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
