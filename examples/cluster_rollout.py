"""Plan a Proxmox VE cluster's split from a script, then roll it out node by node.

Every online node is planned before anything is written; the cluster's one PCI mapping is
written first, by the node the members were read from; the rollout stops at the first node
that fails. Each node's steps are printed as they happen.

    python examples/cluster_rollout.py --root examples/hosts/cluster-3 --vm 300 --vm 310
    python examples/cluster_rollout.py --host root@pve1 --vm 300 --mapping gpu-vfio --apply

Without ``--apply`` nothing is changed (the rollout only checks, as ``apply --dry-run``).
"""

from __future__ import annotations

import argparse
import sys

import proxgpu
from proxgpu.errors import ProxgpuError
from proxgpu.fleet import Event


def main(argv: list[str] | None = None) -> int:
    """Plan the cluster, show what each node needs, then roll it out (or only check it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--host", help="one node of the cluster, over SSH")
    where.add_argument("--root", help="a cluster snapshot (snapshot --cluster -o DIR)")
    parser.add_argument("--vm", action="append", default=[], help="VMID or VMID:N")
    parser.add_argument("--lxc", type=int)
    parser.add_argument("--mapping", help="one cluster PCI mapping for every node's vfio GPUs")
    parser.add_argument("--apply", action="store_true", help="apply for real")
    args = parser.parse_args(argv)
    try:
        if args.root:
            nodes = proxgpu.snapshot_nodes(args.root)
        else:
            nodes = proxgpu.find_nodes(proxgpu.Target(args.host))
        policy = proxgpu.SplitPolicy(lxc=args.lxc, vms=args.vm)
        planned = proxgpu.plan_cluster(nodes, policy, mapping=args.mapping)
    except ProxgpuError as exc:
        print(f"cannot plan: {exc}", file=sys.stderr)
        return exc.exit_code
    print(nodes.summary())
    for name, proposal in planned.proposals.items():
        if isinstance(proposal, ProxgpuError):
            print(f"{name}: cannot be planned: {proposal}")
        else:
            print(f"{name}: {proposal.changes.summary()}")
    if planned.mapping is not None:
        print(f"mapping {args.mapping}: {'changes' if planned.mapping.changed else 'no change'}")
    try:
        checked = proxgpu.ApplyOptions(dry_run=not args.apply)
        rollout = proxgpu.apply_cluster(planned, options=checked, on_event=_show)
    except ProxgpuError as exc:
        print(f"nothing applied: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"done: {rollout.done}; failed: {rollout.failed}; not touched: {rollout.not_touched}")
    return rollout.code


def _show(event: Event) -> None:
    print(event, file=sys.stderr)  # pve2: [   3.1s] write: replacing 5 files


if __name__ == "__main__":
    sys.exit(main())
