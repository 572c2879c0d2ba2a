"""Every shell command and Python snippet in README.md, run against the example hosts, and the
exit codes README states, checked: README cannot drift from the tool again.

What runs, and what is substituted (nothing here reaches another machine):

- ```sh blocks: each ``&&``-joined part that runs proxgpu, with ``.venv/bin/`` meaning the
  environment running these tests. The parts that set a machine up (``apt-get``, ``python3 -m
  venv``, ``pip install``) and ``bash .ci/run`` (CI itself, which runs this test) are not run.
- ```python blocks: a ``connect("USER@HOST")`` is replaced by the ``connect(root=...)`` its
  comment offers; a snippet that reaches a host with no such alternative fails the test.
- inline `` `proxgpu ...` `` commands without placeholders: with ``--root examples/hosts/ct200``
  (README's running example) when they read a host; ``--host H`` would become that ``--root``.
- the exit codes README gives in words (check-gpus, ``--detailed-exitcode``, "nothing to roll
  back"), read from README's own sentences, so a changed sentence changes what is expected.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from proxgpu.cli.parser import build_parser
from tests.support.trees import EXAMPLES, REPO, copy_example

README = (REPO / "README.md").read_text()
CT200 = str(EXAMPLES / "ct200")
BIN = Path(sys.executable).parent
# Set-up steps of the Quick start that this checkout has already taken, and CI's own script.
NOT_RUN = ("apt-get ", "python3 -m venv ", ".venv/bin/pip ", "bash .ci/run")
COMMANDS = {
    name
    for action in build_parser()._actions
    if isinstance(action, argparse._SubParsersAction)
    for name in action.choices
}


def blocks(language: str) -> list[str]:
    """The fenced code blocks of ``language`` in README."""
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.MULTILINE | re.DOTALL)


def proxgpu(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """The installed ``proxgpu`` of this environment, run in the checkout."""
    return subprocess.run(
        [str(BIN / "proxgpu"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )


def claim(pattern: str) -> re.Match[str]:
    """README's sentence matching ``pattern`` (line breaks in README match any whitespace)."""
    found = re.search(pattern.replace(" ", r"\s+"), README)
    assert found, f"README no longer says /{pattern}/: update this test with it"
    return found


def shell_commands() -> list[str]:
    commands = []
    for block in blocks("sh"):
        for line in block.splitlines():
            parts = (part.strip() for part in line.split("&&"))
            commands += [part for part in parts if part and not part.startswith(NOT_RUN)]
    return commands


def test_readme_has_commands_and_snippets_to_run() -> None:
    assert shell_commands() and blocks("python")


@pytest.mark.parametrize("command", shell_commands())
def test_shell_block_command(command: str) -> None:
    argv = shlex.split(command)
    assert argv[0] in {"proxgpu", ".venv/bin/proxgpu"}, f"README runs {argv[0]}: teach this test"
    assert "--host" not in argv, "README's blocks run against example hosts"
    done = proxgpu(*argv[1:])
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("snippet", blocks("python"))
def test_python_snippet(snippet: str, tmp_path: Path) -> None:
    def offline(match: re.Match[str]) -> str:
        return f"connect({match['alternative']})"

    code = re.sub(
        r'connect\("[^"]*"\)(?P<rest>.*)#\s*or\s+connect\((?P<alternative>root=[^)]*)\)',
        lambda m: offline(m) + m["rest"],
        snippet,
    )
    assert not re.search(r'connect\("', code), "a snippet reaches a host with no --root stand-in"
    # The tree it names, copied, so that a snippet that applies cannot change the examples.
    copy_example(tmp_path / "examples" / "hosts", "ct200")
    code = code.replace('root="examples/hosts/', f'root="{tmp_path}/examples/hosts/')
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the snippet prints what it found"


def inline_commands() -> list[list[str]]:
    """Inline `proxgpu ...` spans that are commands (a subcommand or an option first) and name no
    placeholder (DIR, ID, [--json], ...)."""
    found = []
    for span in sorted(set(re.findall(r"`(proxgpu [^`]*)`", README))):
        argv = span.split()
        if argv[1] not in COMMANDS and not argv[1].startswith("-"):
            continue  # `proxgpu tests bench examples`: the package's directory, not a command
        if all(re.fullmatch(r"[a-z0-9][a-z0-9.,=/-]*|--?[a-z][a-z-]*", w) for w in argv[1:]):
            found.append(argv)
    return found


@pytest.mark.parametrize("argv", inline_commands(), ids=" ".join)
def test_inline_command(argv: list[str]) -> None:
    args = argv[1:]
    if "--host" in args:
        at = args.index("--host")
        del args[at : at + 2]
    reads_a_host = not any(a in ("--version", "--help", "-h") for a in args)
    done = proxgpu(*args, *(["--root", CT200] if reads_a_host else []))
    usage = int(claim(r"\| (\d+) \| usage")[1])
    assert done.returncode != usage and "internal error" not in done.stderr, done.stderr
    if not reads_a_host:
        assert done.returncode == 0 and done.stdout.startswith("proxgpu"), done.stdout


def test_check_gpus_exit_codes_are_as_readme_says() -> None:
    said = claim(
        r"Exits (\d+) when the GPUs share one NUMA node,? (?:and )?(\d+) with an explanation "
        r"when they straddle nodes"
    )
    local, straddles = int(said[1]), int(said[2])
    example = claim(r"on ct200, `(\S+)` (?:fails|straddles) and `(\S+)` passes")
    assert proxgpu("check-gpus", example[1], "--root", CT200).returncode == straddles
    assert proxgpu("check-gpus", example[2], "--root", CT200).returncode == local


def test_detailed_exitcode_is_as_readme_says(tmp_path: Path) -> None:
    said = claim(
        r"`--detailed-exitcode` exits (\d+) when nothing would change, (\d+) when changes are "
        r"pending and (\d+) on error"
    )
    nothing, pending, error = int(said[1]), int(said[2]), int(said[3])
    ct200 = ["plan", "--root", CT200, "--lxc", "200", "--vm", "300", "--detailed-exitcode"]
    assert proxgpu(*ct200).returncode == pending
    # The real H200 capture with its one GPU kept where it is: nothing to change.
    h200 = ["plan", "--root", str(EXAMPLES / "h200-vm"), "--host-gpus", "0000:00:06.0"]
    assert proxgpu(*h200, "--detailed-exitcode").returncode == nothing
    assert proxgpu(*ct200, "--lxc", "not-a-vmid").returncode == error
    assert proxgpu(*ct200[:-1], "--root", str(tmp_path / "absent"), ct200[-1]).returncode == error


def test_nothing_to_roll_back_exits_as_readme_says(tmp_path: Path) -> None:
    said = claim(r"With nothing to roll back it says so and exits (\d+)")
    done = proxgpu("rollback", "--root", str(copy_example(tmp_path)), "--yes")
    assert done.returncode == int(said[1]), done.stderr
    assert "nothing to roll back" in (done.stdout + done.stderr).lower()
