"""What the plan options turn into: a split policy, and a proposal for a host. Apart from
:mod:`~proxgpu.cli.setup`, so that the commands that only read a host load no planner.

>>> from proxgpu.cli.parser import build_parser
>>> args = build_parser().parse_args(["plan", "--root", "examples/hosts/ct200", "--vm", "300:2"])
>>> split_policy(args).vms
[(300, 2)]
"""

from __future__ import annotations

import argparse

from proxgpu.cli.setup import gpu_filter
from proxgpu.errors import ProxgpuError
from proxgpu.host.base import Host
from proxgpu.pipeline import Proposal, propose
from proxgpu.planning import SplitPolicy
from proxgpu.rendering import RenderOptions


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
        vms=args.vm,
        enable_iommu=args.enable_iommu,
    )


def proposal(args: argparse.Namespace, host: Host) -> Proposal:
    """What ``host`` needs; a cluster's node comes with it already planned (or its error)."""
    planned = getattr(args, "proposal", None)
    if isinstance(planned, ProxgpuError):
        raise planned
    if planned is not None:
        return planned  # type: ignore[no-any-return]
    return propose(host, split_policy(args), render_options(args), gpu_filter(args))


def render_options(args: argparse.Namespace) -> RenderOptions:
    """``--bind-method`` and ``--mapping``."""
    return RenderOptions(bind_method=args.bind_method, mapping=args.mapping)
