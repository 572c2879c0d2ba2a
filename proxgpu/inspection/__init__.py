"""Inspection: what a host has, read in one round trip.

:func:`inspect` is the edge: :mod:`~proxgpu.inspection.capture` runs one command on the host and
:mod:`~proxgpu.inspection.build` interprets its output (pure) into the
:class:`~proxgpu.inspection.inventory.Inventory` every later stage reads.

>>> from proxgpu.host import DirectoryHost
>>> inv = inspect(DirectoryHost("examples/hosts/ct200"))
>>> [g.address for g in inv.gpus if g.numa_node == 1]
['0000:81:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0']
"""

from __future__ import annotations

from proxgpu.host.base import Host
from proxgpu.inspection.build import build_inventory
from proxgpu.inspection.capture import gather
from proxgpu.inspection.inventory import (
    Gpu,
    Inventory,
    MdevType,
    NumaNode,
    PciFunction,
    VgpuType,
    VirtualFunction,
)
from proxgpu.inspection.recognition import GpuFilter


def inspect(host: Host, gpu_filter: GpuFilter | None = None) -> Inventory:
    """Inspect ``host`` in one round trip and return its inventory.

    :raises HostError: when the host cannot be read, or what it says cannot be trusted.
    """
    return build_inventory(gather(host), host.name, gpu_filter or GpuFilter())


__all__ = [
    "Gpu",
    "GpuFilter",
    "Inventory",
    "MdevType",
    "NumaNode",
    "PciFunction",
    "VgpuType",
    "VirtualFunction",
    "build_inventory",
    "inspect",
]
