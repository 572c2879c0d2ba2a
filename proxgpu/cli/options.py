"""The options every command shares, and what they turn into: a host, a GPU filter, a policy."""

from __future__ import annotations

import argparse

from proxgpu.host import connect
from proxgpu.host.base import Host
from proxgpu.host.ssh import SSHOptions
from proxgpu.inspection import inspect
from proxgpu.inspection.build import GpuFilter
from proxgpu.inspection.inventory import Inventory
from proxgpu.pipeline import Proposal, propose
from proxgpu.planning.model import SplitPolicy, parse_vm_spec
from proxgpu.rendering.context import RenderOptions


def host_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("host (default: this machine)")
    where.add_argument(
        "--host", metavar="[USER@]HOST[:PORT]", help="a remote host, reached over SSH"
    )
    where.add_argument(
        "--root",
        metavar="DIR",
        help="a directory laid out like a host (a snapshot, an image): files only, no actions; "
        "with --host, such a directory on the remote host",
    )
    ssh = parser.add_argument_group("SSH (settings in ~/.ssh/config apply too)")
    ssh.add_argument("--port", type=int, help="SSH port")
    ssh.add_argument("--user", help="SSH user (default from ~/.ssh/config, else your name)")
    ssh.add_argument("-i", "--identity", metavar="KEY", help="private key file")
    ssh.add_argument("--known-hosts", metavar="FILE", help="known_hosts file to verify against")
    ssh.add_argument(
        "--accept-new-host-key",
        action="store_true",
        help="trust and record a host key seen for the first time (never a changed one)",
    )
    ssh.add_argument("--ssh-config", metavar="FILE", help="SSH config file (default ~/.ssh/config)")
    ssh.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS")
    gpus = parser.add_argument_group("what counts as a GPU")
    gpus.add_argument(
        "--gpu-class",
        action="append",
        metavar="PREFIX",
        help="PCI class prefix in hex (default 03: every display controller)",
    )
    gpus.add_argument(
        "--gpu-vendor",
        action="append",
        metavar="VENDOR",
        help="only this PCI vendor ID (e.g. 10de); repeatable",
    )


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


def plan_options(parser: argparse.ArgumentParser) -> None:
    split = parser.add_argument_group("the split")
    split.add_argument(
        "--split",
        choices=["numa"],
        default="numa",
        help="one group per NUMA node; the lowest node with GPUs stays on the host",
    )
    split.add_argument(
        "--host-node",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="keep this NUMA node's GPUs on the host driver (repeatable)",
    )
    split.add_argument(
        "--vfio-node",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="bind this NUMA node's GPUs to vfio-pci (repeatable)",
    )
    split.add_argument("--host-gpus", metavar="ADDR,...", help="keep these GPUs on the host driver")
    split.add_argument("--vfio-gpus", metavar="ADDR,...", help="bind these GPUs to vfio-pci")
    split.add_argument("--lxc", type=int, metavar="VMID", help="container that gets the host group")
    split.add_argument(
        "--vm",
        action="append",
        default=[],
        metavar="VMID[:N]",
        help="VM that gets vfio GPUs (N of them; repeatable)",
    )
    split.add_argument(
        "--enable-iommu",
        action="store_true",
        help="turn the IOMMU on in the kernel command line if it is off",
    )
    files = parser.add_argument_group("how the files are written")
    files.add_argument(
        "--bind-method",
        choices=["modprobe", "driverctl"],
        default="modprobe",
        help="boot-time binding: modprobe.d hook (default) or driverctl overrides",
    )
    files.add_argument(
        "--mapping", metavar="NAME", help="give VMs their GPUs through this cluster PCI mapping"
    )


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
    options = RenderOptions(bind_method=args.bind_method, mapping=args.mapping)
    return propose(host, split_policy(args), options, gpu_filter(args))
