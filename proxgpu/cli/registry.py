"""Every command, as the dispatcher needs to know it: where its code is, how several hosts run
it, whether it plans every node of a cluster first, and whether ``-o`` is its output.

A command's module (``module``, under :mod:`proxgpu.cli`) is imported only when the command
runs, so that ``--help`` loads none. A command that runs host by host has
``host_NAME(line, host, say)``, one host's work: one host is a fleet of one, printed by
:func:`~proxgpu.cli.shown.run_one`. ``cmd_NAME(line)``, where a module has it, runs the command
instead (asking before a change, or a command of no host).

>>> COMMANDS["apply"].fleet, COMMANDS["apply"].plans_first, COMMANDS["report"].per_host
('rolling', True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Literal

from proxgpu.errors import UsageError

if TYPE_CHECKING:
    from proxgpu.cli.commandline import CommandLine
    from proxgpu.cli.shown import HostWork, Shown
    from proxgpu.fleet import Say
    from proxgpu.host.base import Host


@dataclass(frozen=True)
class Command:
    """One command. ``fleet``: how several ``--host`` run, ``"read"`` concurrently,
    ``"rolling"`` one at a time (the commands that change hosts), ``"self"`` by the command
    itself. ``per_host``: it has one host's work to run among several (``host_NAME``).
    ``plans_first``: with ``--cluster`` every node is planned before any is changed, so that
    the mapping is pooled and nothing changes unless every node can be planned.
    ``output_is_result``: ``-o`` takes the command's output (for ``snapshot`` it is where the
    trees go)."""

    name: str
    module: str
    fleet: Literal["read", "rolling", "self"] = "read"
    per_host: bool = True
    plans_first: bool = False
    output_is_result: bool = False

    def run(self, line: CommandLine) -> int:
        """Run it for the one host (or none) ``line`` names; the exit code."""
        own = getattr(self._module(), f"cmd_{self._function}", None)
        if own is not None:
            return int(own(line))
        output = line.output if self.output_is_result else None
        return int(import_module("proxgpu.cli.shown").run_one(line, self.host_work(), output))

    def host_work(self) -> HostWork:
        """Its work on one host of several, its module imported when the first host is open:
        the connections' handshakes then overlap the import (the inspection, the planner).

        >>> COMMANDS["plan"].host_work().__name__
        'host_plan'

        :raises UsageError: for a command that does not run host by host.
        """
        if not self.per_host:
            raise UsageError(f"proxgpu {self.name} does not run on several hosts: give one --host")
        name = f"host_{self._function}"

        def work(line: CommandLine, host: Host, say: Say) -> Shown:
            done: HostWork = getattr(self._module(), name)
            return done(line, host, say)

        work.__name__ = name
        return work

    @property
    def _function(self) -> str:
        return self.name.replace("-", "_")

    def _module(self) -> object:
        return import_module(f"proxgpu.cli.{self.module}")


#: Every command, by name.
COMMANDS = {
    command.name: command
    for command in (
        Command("inspect", "inspecting", output_is_result=True),
        Command("report", "report", fleet="self", per_host=False),
        Command("snapshot", "commands"),
        Command("plan", "change", plans_first=True),
        Command("apply", "change", fleet="rolling", plans_first=True),
        Command("verify", "commands"),
        Command("rollback", "commands", fleet="rolling"),
        Command("history", "commands"),
        Command("check-gpus", "commands"),
        Command("run", "launch", fleet="self", per_host=False),
        Command("completion", "completion", fleet="self", per_host=False),
    )
}
