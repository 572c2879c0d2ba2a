"""Many hosts in one run, as the command line shows them (the engine is :mod:`proxgpu.fleet`).

Each host's steps stream to stderr as they happen, prefixed with the host
(``pve2: [  3.1s] write: replacing 5 files``), with ``pve2: ok`` or ``failed (exit N)`` as it
ends; then the results in the order the hosts were given: one section per host, or with
``--json`` one document ``{"hosts": {TARGET: document}}`` (an error document for a host that
failed). With ``-o FILE`` the output is one file holding every host (see :func:`write_all`).
The exit code is the worst host's.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from proxgpu.cli.commandline import CommandLine
from proxgpu.cli.console import error_document, write_output
from proxgpu.cli.hosts import connector
from proxgpu.cli.registry import Command
from proxgpu.cli.shown import Shown
from proxgpu.errors import UsageError
from proxgpu.fleet import Event, Outcome, Say, Target, each_host, roll_out
from proxgpu.host.base import Host


@dataclass(frozen=True)
class Header:
    """What a run over a cluster says once: first in the text, ``"cluster"`` in the JSON
    document; the members not run with why, and an exit code of its own."""

    text: str = ""
    document: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    code: int = 0


def run_fleet(
    line: CommandLine,
    command: Command,
    targets: dict[str, Target],
    header: Header | None = None,
) -> int:
    """Run ``command``'s work on every host (a rollout for the commands that change hosts),
    print the results in order; the worst exit code."""
    header = header or Header()
    rolling = command.fleet == "rolling"
    if rolling:
        require_yes(line)
    listen = EventPrinter(verbose=rolling)
    work = command.host_work()

    def one(host: Host, say: Say) -> Shown:
        # Each host's work sees the command line of that host alone.
        return work(line.at(targets[say.name], say.name), host, say)

    if rolling:
        rollout = roll_out(
            targets,
            one,
            connect=connector(line),
            parallel=line.parallel,
            on_event=listen,
        )
        outcomes = rollout.outcomes
    else:
        outcomes = each_host(
            targets, one, connect=connector(line), forks=line.forks, on_event=listen
        )
    print_all(line, command, list(targets), outcomes, header, ended=listen.ended)
    codes = [exit_code(o, line.detailed) for o in outcomes.values()]
    return max([*codes, header.code], default=0)


def require_yes(line: CommandLine) -> None:
    """Several hosts are changed only with ``--yes`` (or checked with ``--dry-run``).

    :raises UsageError: without either.
    """
    if not (line.yes or line.dry_run):
        raise UsageError(
            "several hosts cannot be asked one by one: review them with "
            "`proxgpu plan --host ...`, then pass --yes"
        )


def exit_code(outcome: Outcome[Shown], detailed: bool = False) -> int:
    """A host's exit code: its error's (1 with ``--detailed-exitcode``), else what it showed."""
    if outcome.error is not None and detailed:
        return 1
    return outcome.code


class EventPrinter:
    """Each host's events on stderr as they happen: steps (for changes), heartbeats, ends."""

    def __init__(self, *, verbose: bool) -> None:
        self.verbose = verbose
        self.lock = threading.Lock()
        self.ended: set[str] = set()

    def __call__(self, event: Event) -> None:
        if event.step == "end":
            self.ended.add(event.host)
        elif not (self.verbose or event.step == "still"):
            return
        with self.lock:
            print(event, file=sys.stderr, flush=True)


def print_all(
    line: CommandLine,
    command: Command,
    hosts: list[str],
    outcomes: dict[str, Outcome[Shown]],
    header: Header,
    *,
    ended: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Every host's result in the order given, then what stderr says of each host (how it
    ended, unless that was said as it happened: ``ended``)."""
    for name in hosts:
        outcome = outcomes.get(name)
        for note in outcome.result.notes if outcome and outcome.result else ():
            print(f"{name}: proxgpu: {note}", file=sys.stderr)
        if outcome is not None and outcome.error is not None:
            lines = str(outcome.error).splitlines()
            sys.stderr.write("".join(f"{name}: proxgpu: {line}\n" for line in lines))
        if outcome is None:
            print(f"{name}: not touched (an earlier host failed)", file=sys.stderr)
        elif name not in ended:
            print(
                f"{name}: {'ok' if outcome.ok else f'failed (exit {outcome.code})'}",
                file=sys.stderr,
            )
    for name, why in header.skipped.items():
        print(f"{name}: {why}", file=sys.stderr)
    write_all(line, command, hosts, outcomes, header)


def write_all(
    line: CommandLine,
    command: Command,
    hosts: list[str],
    outcomes: dict[str, Outcome[Shown]],
    header: Header,
) -> None:
    """stdout, or ``-o FILE``: one document holding every host (JSON: the fleet document;
    text: a section per host), written whole (see :func:`~.console.write_output`)."""
    svg = line.format == "svg" and not line.tree
    if line.json:
        documents = {n: _document(o) for n, o in outcomes.items()}
        extra = {"cluster": header.document} if header.document else {}
        text = json.dumps({**extra, "hosts": documents}, indent=2) + "\n"
    elif svg:
        # Loaded for pictures only: the picture package brings the planner, Jinja2 and pydantic.
        stack_svgs = import_module("proxgpu.picture.svg").stack_svgs
        text = stack_svgs([(n, _svg_or_error(outcomes.get(n))) for n in hosts])
    else:
        text = header.text
        for name in hosts:
            outcome = outcomes.get(name)
            if outcome is not None and outcome.result is not None:
                body = outcome.result.text
                text += f"== {name} ==\n{body}" + ("" if body.endswith("\n") else "\n")
    output = line.output if command.output_is_result else None
    if output is not None and _per_host(output):
        _folder_for(output)
        suffix = ".json" if line.json else ".svg" if svg else ".txt"
        for name in hosts:
            outcome = outcomes.get(name)
            if outcome is not None and outcome.result is not None:
                own = json.dumps(_document(outcome), indent=2) + "\n"
                path = per_host_path(output, name, suffix)
                write_output(own if line.json else outcome.result.text, path)
        return
    write_output(text, output)


def per_host_path(output: str, name: str, suffix: str) -> str:
    """``-o`` for one host of several: ``{host}`` replaced, or the host's file in ``DIR/``,
    named with the format's ``suffix``.

    >>> per_host_path("out/{host}.svg", "pve1", ".svg"), per_host_path("out/", "pve2", ".txt")
    ('out/pve1.svg', 'out/pve2.txt')
    """
    return output.replace("{host}", name) if "{host}" in output else output + name + suffix


def _folder_for(output: str) -> None:
    """``-o DIR/``: the folder is made when missing, as ``snapshot -o`` makes its own.

    :raises UsageError: when it cannot be.
    """
    if output.endswith("/"):
        try:
            os.makedirs(output, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"{output}: cannot make the folder: {exc.strerror}") from None


def _per_host(output: str) -> bool:
    return "{host}" in output or output.endswith("/")


def check_several(line: CommandLine) -> None:
    """Refuse what several hosts cannot share: one ``--out``/``--plan`` file for all.

    :raises UsageError: naming the option and the way out.
    """
    for option, value in (("out", line.out), ("plan", line.plan)):
        if value and "{host}" not in value:
            raise UsageError(
                f"--{option} {value}: several hosts cannot share one plan file; "
                "put {host} in the name (e.g. plans/{host}.json)"
            )


def _svg_or_error(outcome: Outcome[Shown] | None) -> str | None:
    return outcome.result.text if outcome and outcome.result else None


def _document(outcome: Outcome[Shown]) -> object:
    if outcome.error is not None:
        return error_document(outcome.error)
    return outcome.result.document if outcome.result else None
