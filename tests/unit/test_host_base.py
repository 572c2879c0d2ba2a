"""The one place a command line is quoted for a POSIX shell (proxgpu.host.base)."""

from __future__ import annotations

import shlex

from proxgpu.host.base import command_line


def test_command_line_quotes_for_a_posix_shell() -> None:
    assert command_line(["echo", "a b", "it's"]) == "echo 'a b' 'it'\"'\"'s'"


def test_command_line_round_trips_through_a_posix_shell_parser() -> None:
    argv = ["printf", "%s|", "a b", "it's", "$HOME", "; rm -rf /", "", "\\n", "*"]
    assert shlex.split(command_line(argv)) == argv
