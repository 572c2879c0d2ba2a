"""Shell completion and the man page, generated from the parser: the completion scripts work in
a real bash, and man/proxgpu.1 (committed, shipped in the sdist) is what the parser makes now."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from proxgpu.cli.completion import SHELLS, cmd_completion, completion_script, man_page
from proxgpu.cli.manual import EXIT_CODES
from proxgpu.cli.parser import build_parser
from proxgpu.errors import ProxgpuError
from tests.support.tools import find_tool, require_tool
from tests.support.trees import REPO

MAN_PAGE = REPO / "man" / "proxgpu.1"


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's subcommand names."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    raise AssertionError("the parser has no subcommands")


def bash_complete(words: list[str]) -> list[str]:
    """What bash offers for the last of ``words`` with proxgpu's completion script loaded."""
    bash = require_tool("bash", "bash")
    script = completion_script("bash")
    line = " ".join(shlex.quote(w) for w in words)
    probe = f"""
{script}
func=$(complete -p proxgpu | sed -E 's/.* -F ([^ ]+) .*/\\1/')
COMP_WORDS=({line})
COMP_CWORD={len(words) - 1}
COMP_LINE={shlex.quote(line)}
COMP_POINT=${{#COMP_LINE}}
"$func" proxgpu {shlex.quote(words[-1])} {shlex.quote(words[-2])}
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [w.strip() for w in done.stdout.splitlines() if w.strip()]


def test_man_page_matches_the_parser() -> None:
    assert man_page() == MAN_PAGE.read_text(), (
        "man/proxgpu.1 is out of date: python -m proxgpu.cli.completion man > man/proxgpu.1"
    )


def test_man_page_is_the_same_at_any_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = man_page()
    monkeypatch.setenv("COLUMNS", "250")
    assert man_page() == narrow
    assert os.environ["COLUMNS"] == "250", "the caller's COLUMNS is restored"


def test_man_page_renders_with_man(tmp_path: Path) -> None:
    """The generated roff is one man reads (whether the committed copy is current is the test
    above)."""
    man = find_tool("man")
    if man is None:
        pytest.skip("man is not installed")
    page = tmp_path / "proxgpu.1"
    page.write_text(man_page())
    shown = subprocess.run(
        [man, "-l", str(page)],
        capture_output=True,
        text=True,
        env={**os.environ, "MANPAGER": "cat", "MANWIDTH": "100"},
        timeout=60,
        check=True,
    ).stdout
    for name in subcommands(build_parser()):
        assert f"proxgpu {name}" in shown
    for section in ("EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES"):
        assert f"\n{section}\n" in shown, section
    status = shown.split("\nEXIT STATUS\n")[1].split("\nENVIRONMENT\n")[0]
    assert [int(w) for w in status.split() if w.isdigit()] == [e.code for e in EXIT_CODES]
    assert "PROXGPU_DEBUG" in shown and "/var/lib/proxgpu/journal/" in shown


def test_bash_completes_subcommands_and_their_options() -> None:
    names = subcommands(build_parser())
    assert set(bash_complete(["proxgpu", ""])) >= set(names)
    assert "plan" in bash_complete(["proxgpu", "pl"])
    assert "inspect" not in bash_complete(["proxgpu", "pl"])
    assert bash_complete(["proxgpu", "plan", "--ro"]) == ["--root"]
    assert "--detailed-exitcode" in bash_complete(["proxgpu", "plan", "--de"])


def test_zsh_script_names_every_subcommand() -> None:
    script = completion_script("zsh")
    assert script.startswith("#compdef proxgpu")
    for name in subcommands(build_parser()):
        assert f"{name}) _arguments" in script, name
    zsh = find_tool("zsh")
    if zsh is not None:  # a syntax check where zsh is there; bash is the one run for real
        subprocess.run([zsh, "-n", "-c", script], check=True, timeout=60)


def test_unknown_shell_is_refused_naming_the_choices() -> None:
    with pytest.raises(ProxgpuError, match="bash, zsh"):
        completion_script("cmd.exe")


def test_completion_handler_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    for shell in SHELLS:
        assert cmd_completion(argparse.Namespace(shell=shell)) == 0
        assert capsys.readouterr().out == completion_script(shell)


def test_proxgpu_completion_subcommand() -> None:
    assert "completion" in subcommands(build_parser())
    done = subprocess.run(
        [sys.executable, "-m", "proxgpu", "completion", "bash"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == completion_script("bash")
