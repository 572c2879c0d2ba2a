"""An Ansible-style script: plan the split of a host, show the diff, apply only when asked.

python examples/split_host.py                                       # ct200: CT 200, VM 300
python examples/split_host.py examples/hosts/single-socket --lxc 101 --vm none \\
    --vfio-gpus 0000:0b:00.0                                        # NUMA unknown: by address
python examples/split_host.py examples/hosts/uneven-5-3 --lxc 150 --vm none --enable-iommu
python examples/split_host.py examples/hosts/shared-iommu-group --lxc none --vm none
python examples/split_host.py examples/hosts/h200-vm --lxc none --vm none \\
    --host-gpus 0000:00:06.0
python examples/split_host.py examples/hosts/mig --lxc none --vm 300   # whole GPUs only
python examples/split_host.py examples/hosts/cluster-3/pve2 --lxc none --vm 310   # a cluster node
python examples/split_host.py examples/hosts/cluster-3/pve3 --lxc 150 --vm 320
python examples/split_host.py --host root@pve1 --apply             # for real, over SSH

Without --apply nothing is written: it exits 0 and prints the changes it would make. With
--apply it writes them as one transaction (the same as `proxgpu apply --yes`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import proxgpu
from proxgpu.pipeline import split_host
from proxgpu.planning import SplitPolicy
from proxgpu.rendering.changes import unified_diff

CT200 = Path(__file__).resolve().parent / "hosts" / "ct200"


def guest(value: str) -> int | None:
    """A container VMID, or ``none`` for no container.

    >>> guest("200"), guest("none")
    (200, None)
    """
    return None if value == "none" else int(value)


def addresses(value: str) -> list[str]:
    """A comma-separated list of PCI addresses.

    >>> addresses("0000:01:00.0, 0b:00.0")
    ['0000:01:00.0', '0b:00.0']
    """
    return [a.strip() for a in value.split(",") if a.strip()]


def policy_of(args: argparse.Namespace) -> SplitPolicy:
    """The split the options ask for; VMs default to 300 (ct200's), ``--vm none`` means none.

    >>> policy_of(parse_args([])).vms
    [(300, None)]
    >>> policy_of(parse_args(["--vm", "none", "--lxc", "none"])).lxc is None
    True
    """
    specs = args.vm if args.vm is not None else ["300"]
    return SplitPolicy(
        lxc=args.lxc,
        vms=[spec for spec in specs if spec != "none"],
        host_nodes=args.host_node,
        vfio_nodes=args.vfio_node,
        host_gpus=args.host_gpus,
        vfio_gpus=args.vfio_gpus,
        enable_iommu=args.enable_iommu,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The script's options, as ``proxgpu plan`` spells them."""
    # The docstring's examples are the options each example host needs: --help shows them.
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "root",
        nargs="?",
        help="a snapshot directory (default: examples/hosts/ct200; with --host, on that host)",
    )
    parser.add_argument("--host", help="[user@]host[:port] to reach over SSH")
    parser.add_argument("--apply", action="store_true", help="apply instead of checking")
    parser.add_argument(
        "--lxc",
        type=guest,
        default=200,
        metavar="VMID",
        help="container for the host group (default 200; none: no container)",
    )
    parser.add_argument(
        "--vm",
        action="append",
        metavar="VMID[:N]",
        help="VM for vfio GPUs, repeatable (default 300; none: no VM)",
    )
    parser.add_argument(
        "--host-node", type=int, action="append", default=[], metavar="N", help="keep node N"
    )
    parser.add_argument(
        "--vfio-node", type=int, action="append", default=[], metavar="N", help="give node N"
    )
    parser.add_argument(
        "--host-gpus", type=addresses, default=[], metavar="ADDR,...", help="keep these GPUs"
    )
    parser.add_argument(
        "--vfio-gpus", type=addresses, default=[], metavar="ADDR,...", help="give these GPUs"
    )
    parser.add_argument(
        "--enable-iommu", action="store_true", help="turn the IOMMU on in the kernel command line"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Plan (or with ``--apply`` apply) the split; the exit code is proxgpu's for any error."""
    args = parse_args(argv)
    # Without a host or a root, the example host: a live run must be asked for by name.
    root = args.root if args.root or args.host else str(CT200)
    try:
        policy = policy_of(args)
        with proxgpu.connect(args.host, root) as host:
            result = split_host(host, policy, how=proxgpu.ApplyOptions(dry_run=not args.apply))
    except proxgpu.ProxgpuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    # Shown, not written: secrets in guest configs (cipassword) are redacted, as the CLI does.
    for change in result.shown.changed_files():
        print(unified_diff(change))
    for group in result.plan.groups:
        print(f"{group.role}: {', '.join(group.gpus)} -> {group.driver}")
    print(f"changed: {result.changed}; actions: {result.actions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
