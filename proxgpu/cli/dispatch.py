"""What the command line does once its options are read: output conventions, one host, many
hosts or a cluster, and every error as its exit code (see :mod:`proxgpu.cli`).

>>> refuse(UsageError("unrecognized arguments: --bogus"), ["plan", "--detailed-exitcode"])
1
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import import_module

from proxgpu.cli.console import report_error, setup_logging, wants_color
from proxgpu.cli.fleet import expand_hosts, run_fleet
from proxgpu.cli.hosts import close_unused, open_early
from proxgpu.errors import ProxgpuError, UsageError
from proxgpu.redact import redact_secrets


def refuse(exc: UsageError, arguments: list[str]) -> int:
    """Report options that could not be read; the exit code."""
    report_error(exc, "--json" in arguments)
    # With --detailed-exitcode, 2 would mean "changes".
    return 1 if "--detailed-exitcode" in arguments else exc.exit_code


def run(args: argparse.Namespace, detailed: bool) -> int:
    """Run the command ``args`` name, for one host, many or a cluster; the exit code."""
    # `completion` takes none of the output options the other commands share.
    setup_logging(getattr(args, "verbose", 0), getattr(args, "quiet", False))
    color = getattr(args, "color", "never")
    args.use_color = wants_color(color, tty=sys.stdout.isatty(), environ=os.environ)
    args.json = getattr(args, "json", False)
    hosts = expand_hosts(getattr(args, "host", None))
    if getattr(args, "cluster", False):
        # Every online node of the cluster, as a fleet keyed by node name (see .cluster).
        args.hosts, args.host = hosts, hosts[0] if hosts else None
        args.node_handler, args.handler = args.handler, "cluster:cmd_cluster"
        args.run_node = lambda one: _run(one, detailed)
        return _run(args, detailed)
    if len(hosts) > 1 and getattr(args, "fleet", "read") != "self":
        return run_fleet(args, hosts, lambda one: _run(one, detailed))
    args.hosts = hosts
    args.host = hosts[0] if hosts else None
    return _run(args, detailed)


def _run(args: argparse.Namespace, detailed: bool) -> int:
    """Run the command for one host (or none): its exit code, every failure on one line."""
    try:
        # The SSH handshake then overlaps the command's imports (see .hosts).
        open_early(args)
        # Imported once a command runs: it brings pydantic, paramiko and jinja2 along.
        module, _, handler = args.handler.partition(":")
        return int(getattr(import_module(f"proxgpu.cli.{module}"), handler)(args))
    except ProxgpuError as exc:
        report_error(exc, args.json)
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
            f"proxgpu: internal error: {type(exc).__name__}: {redact_secrets(str(exc))} "
            "(set PROXGPU_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1
    finally:
        close_unused(args)
