"""The ``proxgpu`` command: parse options, call the library, map its errors to exit codes.

Exit codes: 0 success, 1 other errors, 2 usage, 3 host unreachable, 4 authentication failed,
5 host key unknown or changed, 6 not root, 7 a command on the host failed, 8 a sysfs file
missing or unparsable, 9 plan refused, 10 apply refused before writing (preflight), 11 another
apply holds the lock, 12 apply failed (everything restored), 13 rollback failed, 14 live rebind
failed, 15 journal unreadable, 16 plan cannot be rendered, 17 verify found drift.
``plan --detailed-exitcode`` follows Terraform instead: 0 nothing to change, 2 changes pending,
1 any error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from proxgpu.capture import gather, redact_secrets, write_tree
from proxgpu.errors import ProxgpuError, UsageError
from proxgpu.hosts import Host, SSHOptions, connect
from proxgpu.inspection import GpuFilter, build_inventory, inspect
from proxgpu.inventory import Inventory
from proxgpu.pipeline import Proposal, propose
from proxgpu.planning import SplitPolicy, check_gpu_set, parse_vm_spec
from proxgpu.rendering import RenderOptions
from proxgpu.report import render_changes, render_inventory, render_plan, table
from proxgpu.transaction import (
    JournalEntry,
    apply_changes,
    history,
    rollback,
    verify,
)

DRIFT_EXIT = 17

Handler = Callable[[argparse.Namespace], int]


def _host_options(parser: argparse.ArgumentParser) -> None:
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


def _inventory(args: argparse.Namespace) -> Inventory:
    with _open_host(args) as host:
        return inspect(host, _gpu_filter(args))


def _plan_options(parser: argparse.ArgumentParser) -> None:
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


def _split_policy(args: argparse.Namespace) -> SplitPolicy:
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


def _proposal(args: argparse.Namespace, host: Host) -> Proposal:
    options = RenderOptions(bind_method=args.bind_method, mapping=args.mapping)
    return propose(host, _split_policy(args), options, _gpu_filter(args))


def cmd_plan(args: argparse.Namespace) -> int:
    """Show the split and the exact file changes it needs, without changing anything."""
    with _open_host(args) as host:
        inventory, plan, changes = _proposal(args, host)
    if args.json:
        document = plan.model_dump(mode="json")
        document["changes"] = {
            **changes.model_dump(mode="json"),
            "changed": changes.changed,
            "summary": changes.summary(),
            "diff": changes.ansible_diff(),
        }
        print(json.dumps(document, indent=2))
    else:
        print(render_plan(plan, inventory))
        print()
        print(render_changes(changes, color=sys.stdout.isatty()), end="")
    if args.detailed_exitcode:
        return 2 if changes.changed else 0
    return 0


def _progress(step: str, message: str) -> None:
    # Progress goes to stderr so that --json output stays one document on stdout.
    print(f"[{step}] {message}", file=sys.stderr, flush=True)


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise UsageError("not on a terminal: pass --yes to apply without asking")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def cmd_apply(args: argparse.Namespace) -> int:
    """Show the plan and diff, ask, then apply as one transaction (or only check with --dry-run)."""
    if args.json and not (args.yes or args.dry_run):
        raise UsageError("--json prints one document and cannot ask: add --yes or --dry-run")
    with _open_host(args) as host:
        inventory, plan, changes = _proposal(args, host)
        if not args.json:
            print(render_plan(plan, inventory), end="\n\n")
            print(render_changes(changes, color=sys.stdout.isatty()), end="")
        proceed = args.dry_run or args.yes or not changes.changed
        if not proceed and not _confirm(f"Apply these changes to {host.name}?"):
            print("Nothing changed.", file=sys.stderr)
            return 1
        result = apply_changes(
            host,
            changes,
            plan=plan,
            dry_run=args.dry_run,
            live=args.live,
            inventory=inventory,
            skip_guest_check=args.skip_guest_check,
            progress=None if args.json else _progress,
        )
    if args.json:
        print(
            json.dumps(
                {
                    "plan": plan.model_dump(mode="json"),
                    "result": result.model_dump(mode="json"),
                    "diff": changes.ansible_diff(),
                },
                indent=2,
            )
        )
    elif result.changed:
        # Without changes the summary printed above already said so.
        print("\n".join(result.messages))
    return 0


def _journal_entry(host: Host, to: str | None) -> JournalEntry:
    entries = [e for e in history(host) if e.status == "applied" and (to is None or e.id == to)]
    if not entries:
        wanted = f"entry {to}" if to else "applied entry"
        raise UsageError(f"{host.name}: no {wanted} in the journal (see proxgpu history)")
    return entries[-1]


def cmd_verify(args: argparse.Namespace) -> int:
    """Compare the host with the last (or the named) apply; exit 17 on drift."""
    with _open_host(args) as host:
        report = verify(host, _journal_entry(host, args.to))
    if args.json:
        print(report.model_dump_json(indent=2))
    elif report.drifted:
        print("\n".join(f"drift: {line}" for line in report.drift))
    else:
        print(f"{host.name}: no drift, the host matches the applied plan")
    return DRIFT_EXIT if report.drifted else 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """Restore the files of a journal entry byte for byte and re-run the post-actions."""
    with _open_host(args) as host:
        if not args.yes and not _confirm(
            f"Roll {host.name} back to before {args.to or 'the last apply'}?"
        ):
            print("Nothing changed.", file=sys.stderr)
            return 1
        result = rollback(
            host,
            args.to,
            force=args.force,
            live=args.live,
            break_lock=args.break_lock,
            progress=_progress,
        )
    print("\n".join(result.messages or [f"restored {len(result.files)} files"]))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """List the journal, oldest first."""
    with _open_host(args) as host:
        entries = history(host)
    if args.json:
        print(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return 0
    rows = [["ID", "STATUS", "STARTED", "BY", "FILES"]]
    rows += [[e.id, e.status, e.started, e.client, str(len(e.files))] for e in entries]
    print(table(rows) if entries else f"{host.name}: the journal is empty")
    return 0


def cmd_check_gpus(args: argparse.Namespace) -> int:
    """Exit 0 when a GPU set is NUMA-local, 1 with an explanation when it straddles nodes."""
    inventory = _inventory(args)
    check = check_gpu_set(inventory, [s.strip() for s in args.gpus.split(",") if s.strip()])
    print(check.explanation, file=sys.stdout if check.numa_local else sys.stderr)
    return 0 if check.numa_local else 1


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print the host's inventory."""
    inventory = _inventory(args)
    if args.json:
        shown = {p: redact_secrets(t) for p, t in inventory.guest_configs.items()}
        print(inventory.model_copy(update={"guest_configs": shown}).model_dump_json(indent=2))
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
        prog="proxgpu",
        description="Partition a Proxmox VE host's GPUs along NUMA lines.",
        epilog="Typical use: proxgpu plan --host root@pve1 --lxc 200 --vm 300, review the diff, "
        "then the same with apply. Exit codes are listed in README.md.",
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
    plan = sub.add_parser("plan", help="show the split and the file changes it needs (dry run)")
    _host_options(plan)
    _plan_options(plan)
    plan.add_argument("--json", action="store_true", help="print the plan and changes as JSON")
    plan.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 0 when nothing would change, 2 when changes are pending, 1 on error",
    )
    plan.set_defaults(handler=cmd_plan)
    apply = sub.add_parser(
        "apply", help="apply the split: preflight, backup, atomic writes, actions"
    )
    _host_options(apply)
    _plan_options(apply)
    apply.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    apply.add_argument("--dry-run", action="store_true", help="check everything, change nothing")
    apply.add_argument(
        "--live", action="store_true", help="also rebind the vfio group now, without a reboot"
    )
    apply.add_argument(
        "--skip-guest-check",
        action="store_true",
        help="do not ask Proxmox whether the target guests are stopped",
    )
    apply.add_argument("--json", action="store_true", help="print the result as one JSON document")
    apply.set_defaults(handler=cmd_apply)
    verify_cmd = sub.add_parser(
        "verify", help="compare the host with the last apply (exit 17: drift)"
    )
    _host_options(verify_cmd)
    verify_cmd.add_argument("--to", metavar="ID", help="journal entry (default: the last applied)")
    verify_cmd.add_argument("--json", action="store_true")
    verify_cmd.set_defaults(handler=cmd_verify)
    back = sub.add_parser("rollback", help="restore the files of a journal entry byte for byte")
    _host_options(back)
    back.add_argument("--to", metavar="ID", help="journal entry (default: the last apply)")
    back.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    back.add_argument("--force", action="store_true", help="even if files changed since the apply")
    back.add_argument(
        "--live", action="store_true", help="also return rebound functions to their drivers now"
    )
    back.add_argument(
        "--break-lock", action="store_true", help="take over a lock left by an interrupted apply"
    )
    back.set_defaults(handler=cmd_rollback)
    hist = sub.add_parser("history", help="list the journal of applies and rollbacks")
    _host_options(hist)
    hist.add_argument("--json", action="store_true")
    hist.set_defaults(handler=cmd_history)
    check = sub.add_parser("check-gpus", help="is a GPU set NUMA-local? (exit 0 yes, 1 no)")
    check.add_argument("gpus", help="indexes in PCI bus order or addresses, comma-separated")
    _host_options(check)
    check.set_defaults(handler=cmd_check_gpus)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    detailed = "--detailed-exitcode" in arguments
    try:
        args = build_parser().parse_args(arguments)
    except SystemExit as exc:
        # argparse has printed the problem; with --detailed-exitcode, 2 would mean "changes".
        return 1 if detailed and exc.code else int(exc.code or 0)
    handler: Handler = args.handler
    try:
        return handler(args)
    except ProxgpuError as exc:
        print(f"proxgpu: {exc}", file=sys.stderr)
        return 1 if detailed else exc.exit_code
    except BrokenPipeError:
        # The reader went away (proxgpu ... | head): stop quietly, as other tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("proxgpu: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # A bug, not bad input: still one line, with the traceback one variable away.
        if os.environ.get("PROXGPU_DEBUG"):
            raise
        print(
            f"proxgpu: internal error: {type(exc).__name__}: {exc} "
            "(set PROXGPU_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
