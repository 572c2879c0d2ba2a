"""What the host options turn into: a host, a GPU filter, the inventory (the plan options are
in :mod:`~proxgpu.cli.proposing`).

>>> from proxgpu.cli.parser import build_parser
>>> gpu_filter(build_parser().parse_args(["inspect", "--gpu-vendor", "0x10DE"]))
GpuFilter(classes=('03',), vendors=('10de',))
"""

from __future__ import annotations

import argparse

from proxgpu.host import connect
from proxgpu.host.base import Host
from proxgpu.host.ssh import SSHOptions
from proxgpu.inspection import GpuFilter, Inventory, inspect


def open_host(args: argparse.Namespace) -> Host:
    options = None
    if args.host:
        options = SSHOptions(
            user=args.user,
            port=args.port,
            identity_file=args.identity,
            known_hosts=args.known_hosts,
            accept_new_host_key=args.accept_new_host_key,
            connect_timeout=args.connect_timeout,
            ssh_config=args.ssh_config,
        )
    return connect(args.host, args.root, options)


def gpu_filter(args: argparse.Namespace) -> GpuFilter:
    classes = tuple(c.lower().removeprefix("0x") for c in args.gpu_class or ["03"])
    vendors = (
        tuple(v.lower().removeprefix("0x") for v in args.gpu_vendor) if args.gpu_vendor else None
    )
    return GpuFilter(classes=classes, vendors=vendors)


def read_inventory(args: argparse.Namespace) -> Inventory:
    with open_host(args) as host:
        return inspect(host, gpu_filter(args))
