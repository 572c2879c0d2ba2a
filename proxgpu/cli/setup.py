"""What the shared options turn into: a host, a GPU filter, a split policy, a proposal.

>>> from proxgpu.cli.parser import build_parser
>>> args = build_parser().parse_args(["plan", "--root", "examples/hosts/ct200", "--vm", "300:2"])
>>> split_policy(args).vms
[(300, 2)]
"""

from __future__ import annotations

import argparse

from proxgpu.errors import ProxgpuError
from proxgpu.host import connect
from proxgpu.host.base import Host
from proxgpu.host.ssh import SSHOptions
from proxgpu.inspection import GpuFilter, Inventory, inspect
from proxgpu.pipeline import Proposal, propose
from proxgpu.planning import SplitPolicy, parse_vm_spec
from proxgpu.rendering import RenderOptions


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


def split_policy(args: argparse.Namespace) -> SplitPolicy:
    def addresses(text: str | None) -> list[str]:
        return [a.strip() for a in (text or "").split(",") if a.strip()]

    return SplitPolicy(
        split=args.split,
        host_nodes=args.host_node,
        vfio_nodes=args.vfio_node,
        host_gpus=addresses(args.host_gpus),
        vfio_gpus=addresses(args.vfio_gpus),
        lxc=args.lxc,
        vms=[parse_vm_spec(spec) for spec in args.vm],
        enable_iommu=args.enable_iommu,
    )


def proposal(args: argparse.Namespace, host: Host) -> Proposal:
    """What ``host`` needs; a cluster's node comes with it already planned (or its error)."""
    planned = getattr(args, "proposal", None)
    if isinstance(planned, ProxgpuError):
        raise planned
    if planned is not None:
        return planned  # type: ignore[no-any-return]
    options = RenderOptions(bind_method=args.bind_method, mapping=args.mapping)
    return propose(host, split_policy(args), options, gpu_filter(args))
