"""An Ansible-style script: plan the split of a host, show the diff, apply only when asked.

python examples/split_host.py examples/hosts/ct200            # dry run against a snapshot
python examples/split_host.py --host root@10.1.2.6 --apply    # for real, over SSH
"""

from __future__ import annotations

import argparse
import sys

import proxgpu
from proxgpu.pipeline import split_host
from proxgpu.planning.model import SplitPolicy
from proxgpu.rendering.changes import unified_diff


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", help="a snapshot directory instead of a live host")
    parser.add_argument("--host", help="[user@]host[:port] to reach over SSH")
    parser.add_argument("--apply", action="store_true", help="apply instead of checking")
    args = parser.parse_args()
    policy = SplitPolicy(lxc=200, vms=[(300, None)])
    try:
        with proxgpu.connect(args.host, args.root) as host:
            result = split_host(host, policy, check=not args.apply)
    except proxgpu.ProxgpuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    for change in result.changes.changed_files():
        print(unified_diff(change))
    print(f"changed: {result.changed}; actions: {result.actions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
