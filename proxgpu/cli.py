"""The ``proxgpu`` command: parse options, call the library, map its errors to exit codes.

Exit codes: 0 success, 1 other errors, 2 usage, 3 host unreachable, 4 authentication failed,
5 host key unknown or changed, 6 not root, 7 a command on the host failed, 8 a sysfs file
missing or unparsable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from proxgpu.capture import gather, write_tree
from proxgpu.errors import ProxgpuError
from proxgpu.hosts import Host, SSHOptions, connect
from proxgpu.inspection import GpuFilter, build_inventory
from proxgpu.report import render_inventory

Handler = Callable[[argparse.Namespace], int]


def _host_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("host (default: this machine)")
    where.add_argument(
        "--host", metavar="[USER@]HOST[:PORT]", help="inspect a remote host over SSH"
    )
    where.add_argument(
        "--root",
        metavar="DIR",
        help="a directory laid out like the host (a snapshot); with --host, a "
        "prefix on the remote host",
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


def _open_host(args: argparse.Namespace) -> Host:
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


def _gpu_filter(args: argparse.Namespace) -> GpuFilter:
    classes = tuple(c.lower().removeprefix("0x") for c in args.gpu_class or ["03"])
    vendors = (
        tuple(v.lower().removeprefix("0x") for v in args.gpu_vendor) if args.gpu_vendor else None
    )
    return GpuFilter(classes=classes, vendors=vendors)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print the host's inventory."""
    with _open_host(args) as host:
        inventory = build_inventory(gather(host), host.name, _gpu_filter(args))
    if args.json:
        print(inventory.model_dump_json(indent=2))
    else:
        print(render_inventory(inventory))
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Capture what inspection reads into a directory that ``--root`` reads back."""
    with _open_host(args) as host:
        capture = gather(host)
        entries = write_tree(capture, args.output)
        inventory = build_inventory(capture, host.name, _gpu_filter(args))
    print(
        f"{host.name}: wrote {entries} entries to {args.output} "
        f"({len(inventory.gpus)} GPUs); read it back with: proxgpu inspect --root {args.output}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="proxgpu", description="Partition a Proxmox VE host's GPUs along NUMA lines."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = sub.add_parser("inspect", help="show GPUs, NUMA nodes, IOMMU groups and drivers")
    _host_options(inspect)
    inspect.add_argument("--json", action="store_true", help="print the inventory as JSON")
    inspect.set_defaults(handler=cmd_inspect)
    snapshot = sub.add_parser("snapshot", help="capture what inspection reads into a directory")
    _host_options(snapshot)
    snapshot.add_argument("-o", "--output", required=True, metavar="DIR")
    snapshot.set_defaults(handler=cmd_snapshot)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except ProxgpuError as exc:
        print(f"proxgpu: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("proxgpu: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
