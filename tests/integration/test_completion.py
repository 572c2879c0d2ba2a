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

from proxgpu.cli.commandline import CommandLine
from proxgpu.cli.completion import (
    SHELLS,
    cmd_completion,
    completion_script,
    value_kind,
)
from proxgpu.cli.manual import EXIT_CODES
from proxgpu.cli.parser import build_parser
from proxgpu.errors import ProxgpuError
from tests.support.tools import find_tool, require_tool
from tests.support.trees import REPO
from tools.manpage import man_page

MAN_PAGE = REPO / "man" / "proxgpu.1"


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's subcommand names."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    raise AssertionError("the parser has no subcommands")


def bash_complete(words: list[str], env: dict[str, str] | None = None) -> list[str]:
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
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [w.strip() for w in done.stdout.splitlines() if w.strip()]


def test_man_page_matches_the_parser() -> None:
    assert man_page() == MAN_PAGE.read_text(), (
        "man/proxgpu.1 is out of date: python tools/manpage.py > man/proxgpu.1"
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
    assert [int(w) for w in status.split() if w.isdigit()] == [code for code, _, _ in EXIT_CODES]
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
    with pytest.raises(ProxgpuError, match="bash, zsh, fish"):
        completion_script("cmd.exe")


def test_completion_handler_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    for shell in SHELLS:
        assert cmd_completion(CommandLine(command="completion", shell=shell)) == 0
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


SSH_CONFIG = "Host pve1 pve2 *.lab\n  User root\nHost bastion\n  Hostname 10.1.1.1\n"
KNOWN_HOSTS = (
    "pve3,10.0.0.3 ssh-ed25519 AAAA\n"
    "[pve4]:2222 ssh-ed25519 AAAA\n"
    "|1|c2FsdA==|aGFzaA== ssh-ed25519 AAAA\n"  # hashed: no name to offer
    "@cert-authority *.ca ssh-ed25519 AAAA\n"
)
OFFERED = {"pve1", "pve2", "bastion", "pve3", "10.0.0.3", "pve4"}


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """A HOME whose ~/.ssh holds a config and a known_hosts naming hosts in every form."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "config").write_text(SSH_CONFIG)
    (ssh / "known_hosts").write_text(KNOWN_HOSTS)
    return {"HOME": str(tmp_path / "home")}


def offered(names: list[str]) -> set[str]:
    """The names a completion offered, less any the machine's own /etc/ssh files add."""
    return {n for n in names if n.removeprefix("root@") in OFFERED | {"*.lab", "*.ca"}}


def test_bash_completes_hosts_from_ssh_config_and_known_hosts(home: dict[str, str]) -> None:
    assert offered(bash_complete(["proxgpu", "plan", "--host", ""], home)) == OFFERED
    assert offered(bash_complete(["proxgpu", "inspect", "--host", "root@pv"], home)) == {
        "root@pve1",
        "root@pve2",
        "root@pve3",
        "root@pve4",
    }


def path_options(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(subcommand, option, kind) for every option of every subcommand whose value is a path."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                for option in command._actions:
                    kind = value_kind(option)
                    if kind in ("file", "directory") and option.option_strings:
                        found.append((name, option.option_strings[-1], kind))
    return found


def test_every_file_and_directory_option_completes_paths_in_bash(tmp_path: Path) -> None:
    options = path_options(build_parser())
    metavars = {"--root", "--output", "--identity", "--known-hosts", "--ssh-config", "--out"}
    assert {option for _, option, _ in options} >= metavars | {"--plan"}
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree.json").write_text("{}")
    for command, option, kind in options:
        got = bash_complete(["proxgpu", command, option, f"{tmp_path}/tr"])
        want = (
            {f"{tmp_path}/tree"}
            if kind == "directory"
            else {f"{tmp_path}/tree", f"{tmp_path}/tree.json"}
        )
        assert set(got) == want, (command, option)


def fish_complete(line: str, env: dict[str, str]) -> list[str]:
    """What a real fish offers for ``line`` with proxgpu's completion script loaded."""
    fish = require_tool("fish", "fish")
    script = completion_script("fish")
    done = subprocess.run(
        [fish, "--no-config", "-c", f"{script}\ncomplete -C {shlex.quote(line)}"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [w.split("\t")[0] for w in done.stdout.splitlines() if w.strip()]


def test_fish_completes_subcommands_options_hosts_and_paths(
    home: dict[str, str], tmp_path: Path
) -> None:
    assert set(fish_complete("proxgpu ", home)) >= set(subcommands(build_parser()))
    assert "--detailed-exitcode" in fish_complete("proxgpu plan --de", home)
    assert "--parallel" not in fish_complete("proxgpu inspect --", home)
    assert offered(fish_complete("proxgpu plan --host ", home)) == OFFERED
    assert offered(fish_complete("proxgpu plan --host root@pve", home)) == {
        "root@pve1",
        "root@pve2",
        "root@pve3",
        "root@pve4",
    }
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree.json").write_text("{}")
    assert fish_complete(f"proxgpu inspect --root {tmp_path}/tr", home) == [f"{tmp_path}/tree/"]
    assert set(fish_complete(f"proxgpu apply --plan {tmp_path}/tr", home)) == {
        f"{tmp_path}/tree/",
        f"{tmp_path}/tree.json",
    }


def test_zsh_completes_hosts_from_ssh_config_and_known_hosts(home: dict[str, str]) -> None:
    """zsh's completion widgets need a terminal: compadd and compset are stood in for by
    functions that print what they were given; the host function and the script are zsh's."""
    zsh = require_tool("zsh", "zsh")
    probe = f"""
autoload -Uz compinit && compinit -u -d "$HOME/.zcompdump"
{completion_script("zsh")}
compset() {{ return 0 }}
compadd() {{ print -l -- "${{(@P)${{@[-1]}}}}" }}
_proxgpu_hosts
"""
    done = subprocess.run(
        [zsh, "-f", "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, **home},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert offered(done.stdout.split()) == OFFERED
