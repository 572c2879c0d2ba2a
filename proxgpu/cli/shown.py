"""One host's result as the command line shows it, for one host or as a section of many.

Each command that runs per host has a ``host_NAME(line, host, say)`` function returning a
:class:`Shown`: the text, the ``--json`` document, the exit code and lines for stderr. A run for
one host prints it (:func:`run_one`); a fleet prints every host's in order (:mod:`.fleet`).

>>> Shown("ok\\n", {"ok": True}, notes=("careful",)).code
0
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxgpu.cli.commandline import CommandLine
from proxgpu.cli.console import write_output
from proxgpu.cli.hosts import open_host
from proxgpu.host.base import Host

if TYPE_CHECKING:
    # Only a type here: the fleet's engine (threads, futures) loads with several hosts.
    from proxgpu.fleet import Say


@dataclass(frozen=True)
class Shown:
    """What a command shows for one host: stdout's text, the JSON document, the exit code, and
    lines for stderr (warnings that do not fail the command)."""

    text: str = ""
    document: Any = None
    code: int = 0
    notes: tuple[str, ...] = ()


#: A command's work on one opened host.
HostWork = Callable[[CommandLine, Host, "Say"], Shown]


class StepPrinter:
    """Steps on stderr (so that ``--json`` stays one document on stdout), with elapsed time:
    rebuilding the initramfs for every kernel takes minutes. Silent when ``quiet``."""

    def __init__(self, name: str = "", *, quiet: bool = False) -> None:
        self.name = name
        self.quiet = quiet
        self.start = time.monotonic()

    def __call__(self, step: str, message: str) -> None:
        if self.quiet:
            return
        if step == "output":  # a line of the running action's output (with -v)
            print(f"  | {message}", file=sys.stderr, flush=True)
            return
        elapsed = time.monotonic() - self.start
        print(f"[{elapsed:6.1f}s] {step}: {message}", file=sys.stderr, flush=True)


def run_one(line: CommandLine, work: HostWork, output: str | None = None) -> int:
    """Run ``work`` on the host ``line`` names and print what it shows (to ``output`` when
    given); the exit code."""
    with open_host(line) as host:
        shown = work(line, host, StepPrinter(host.name, quiet=line.json))
    emit(line, shown, output)
    return shown.code


def emit(line: CommandLine, shown: Shown, output: str | None = None) -> None:
    """Print one host's :class:`Shown`: its notes on stderr, its text or document on stdout."""
    for note in shown.notes:
        print(f"proxgpu: {note}", file=sys.stderr)
    text = json.dumps(shown.document, indent=2) + "\n" if line.json else shown.text
    write_output(text, output)
