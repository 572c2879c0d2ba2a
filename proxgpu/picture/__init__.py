"""Pictures of a host's GPU split: an SVG diagram, a terminal tree and a self-contained HTML
report, all pure functions of an inventory, a plan and its change set.

:func:`inventory_svg` draws the host: one column per NUMA node, its PCIe tree from the root
ports through switches to each GPU, IOMMU groups framed. :func:`inventory_tree` prints the same
structure as text. :func:`render_report` puts the picture of a plan (each GPU coloured by its role,
labelled with its guest), its warnings or refusals, the CUDA_VISIBLE_DEVICES sets, the diff and
the follow-up actions into one HTML file that fetches nothing.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> print(inventory_tree(inspect(DirectoryHost("examples/hosts/ct200"))).splitlines()[2])
├─ pci0000:00
"""

from __future__ import annotations

from proxgpu.picture.report import HostReport, UnreadHost, render_report
from proxgpu.picture.svg import inventory_svg, render_svg
from proxgpu.picture.topology import Assignment, assignments, build_topology
from proxgpu.picture.tree import inventory_tree

__all__ = [
    "Assignment",
    "HostReport",
    "UnreadHost",
    "assignments",
    "build_topology",
    "inventory_svg",
    "inventory_tree",
    "render_report",
    "render_svg",
]
