"""What the host options turn into: a GPU filter and the inventory (the host is opened by
:mod:`~proxgpu.cli.hosts`, the plan options are read by :mod:`~proxgpu.cli.proposing`).

>>> from proxgpu.cli.parser import build_parser
>>> gpu_filter(build_parser().parse_args(["inspect", "--gpu-vendor", "0x10DE"]))
GpuFilter(classes=('03', '12'), vendors=('10de',))
"""

from __future__ import annotations

import argparse

from proxgpu.cli.hosts import open_host
from proxgpu.inspection import GpuFilter, Inventory, inspect


def gpu_filter(args: argparse.Namespace) -> GpuFilter:
    classes = tuple(c.lower().removeprefix("0x") for c in args.gpu_class or GpuFilter.classes)
    vendors = (
        tuple(v.lower().removeprefix("0x") for v in args.gpu_vendor) if args.gpu_vendor else None
    )
    return GpuFilter(classes=classes, vendors=vendors)


def read_inventory(args: argparse.Namespace) -> Inventory:
    with open_host(args) as host:
        return inspect(host, gpu_filter(args))
