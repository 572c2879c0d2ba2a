"""What the command line does once its options are read: output conventions, one host, many
hosts or a cluster, and every error as its exit code (see :mod:`proxgpu.cli`).

>>> refuse(UsageError("unrecognized arguments: --bogus"), ["plan", "--detailed-exitcode"])
1
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from importlib import import_module

from proxgpu.cli.commandline import CommandLine, read
from proxgpu.cli.console import report_error, setup_logging
from proxgpu.cli.hosts import close_unused, open_early
from proxgpu.cli.registry import COMMANDS, Command
from proxgpu.errors import ProxgpuError, UsageError
from proxgpu.redact import redact_secrets

log = logging.getLogger(__name__)


def refuse(exc: UsageError, arguments: list[str]) -> int:
    """Report options that could not be read; the exit code."""
    try:
        report_error(exc, "--json" in arguments)
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_gone()
    # With --detailed-exitcode, 2 would mean "changes".
    return 1 if "--detailed-exitcode" in arguments else exc.exit_code


def _reader_gone() -> int:
    """The reader of stdout went away (proxgpu ... | head): stop quietly, as other tools do,
    with the exit code of a process SIGPIPE ended. What is left in Python's buffer goes
    nowhere, so that exiting does not fail again on it."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def run(args: argparse.Namespace, detailed: bool) -> int:
    """Run the command ``args`` name, for one host, many or a cluster; the exit code."""
    # `completion` takes none of the output options the other commands share.
    setup_logging(getattr(args, "verbose", 0), getattr(args, "quiet", False))
    as_json = getattr(args, "json", False)
    return _guarded(as_json, detailed, lambda: _route(read(args, detailed)))


def _route(line: CommandLine) -> int:
    command = COMMANDS[line.command]
    if line.cluster:
        # Every online node of the cluster, as a fleet keyed by node name (see .cluster).
        return int(import_module("proxgpu.cli.cluster").run_cluster(line, command))
    if len(line.hosts) > 1 and command.fleet != "self":
        fleet = import_module("proxgpu.cli.fleet")
        fleet.check_several(line)
        targets = {h: fleet.Target(h, line.root) for h in line.hosts}
        return int(fleet.run_fleet(line, command, targets))
    return _run(line, command)


def _run(line: CommandLine, command: Command) -> int:
    """Run the command for one host (or none); its exit code."""
    start = time.monotonic()
    # The SSH handshake then overlaps the command's imports (see .hosts).
    open_early(line)
    try:
        # Its module is imported once it runs: it brings pydantic, paramiko and jinja2 along.
        return command.run(line)
    finally:
        close_unused(line)
        # -vv: the whole command's time, beside each exchange's.
        log.debug("%s took %.3f s", line.command, time.monotonic() - start)


def _guarded(as_json: bool, detailed: bool, work: Callable[[], int]) -> int:
    """``work``'s exit code, every failure on one line."""
    try:
        # Saying what failed writes to stdout too (--json), so it is inside the pipe's guard,
        # and so is the last flush: a reader gone while stdout is buffered shows only there.
        try:
            code = work()
        except ProxgpuError as exc:
            report_error(exc, as_json)
            code = 1 if detailed else exc.exit_code
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _reader_gone()
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
