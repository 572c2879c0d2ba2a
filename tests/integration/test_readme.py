"""Every shell command and Python snippet in README.md and in each page of docs/, run against the
example hosts, and the exit codes they state, checked: the documentation cannot drift from the
tool again. Each test's id names the page (and the line of a block) it comes from.

What runs, and what is substituted (nothing here reaches another machine):

- ```sh blocks, each in order as one test: every ``&&``-joined part that runs proxgpu, with
  ``.venv/bin/`` meaning the environment running these tests and ``/tmp/`` a folder of the
  test's own. The parts that set a machine up (``apt-get``, ``python3 -m venv``, ``pip
  install``) and ``bash .ci/run`` (CI itself, which runs this test) are not run. A block must
  leave the example hosts it names as they were.
- ```python blocks: a ``connect("USER@HOST")`` is replaced by the ``connect(root=...)`` its
  comment offers; a snippet that reaches a host with no such alternative fails the test.
- ```yaml blocks (plays): ``ansible-playbook --syntax-check`` resolves every module they name,
  and each task gives its module only options the module documents.
- inline `` `proxgpu ...` `` commands without placeholders: with ``--root examples/hosts/ct200``
  (README's running example) when they read a host; ``--host H`` would become that ``--root``.
- the exit codes the pages give in words (check-gpus, ``--detailed-exitcode``, "nothing to roll
  back"), read from their own sentences, so a changed sentence changes what is expected.

And the shape the project gives its documentation: README at most 200 lines, linking every page
of docs/; each page opening with its title and a sentence on what it covers; every relative link
and anchor leading somewhere.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from proxgpu.cli.parser import build_parser
from tests.support.collection import ansible
from tests.support.tools import require_tool
from tests.support.trees import EXAMPLES, REPO, copy_example, tree_bytes

#: README.md, then each page of docs/, by path from the repository's root.
PAGES = {
    path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
}
README_LINES = 200
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


class Block(NamedTuple):
    """A fenced code block: the page holding it, the line its fence opens on, its text."""

    page: str
    line: int
    code: str


def blocks(language: str, pages: tuple[str, ...] = tuple(PAGES)) -> list[Block]:
    """The fenced code blocks of ``language`` in ``pages``."""
    found = []
    for page in pages:
        text = PAGES[page]
        for match in re.finditer(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            found.append(Block(page, text.count("\n", 0, match.start()) + 1, match[1]))
    return found


def where(block: Block) -> str:
    return f"{block.page}:{block.line}"


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
    """The first page's sentence matching ``pattern`` (a line break matches any whitespace)."""
    for text in PAGES.values():
        found = re.search(pattern.replace(" ", r"\s+"), text)
        if found:
            return found
    raise AssertionError(f"no page says /{pattern}/ any more: update this test with it")


def shell_commands(block: Block) -> list[str]:
    """The commands of an ```sh block that this test runs, in order."""
    commands = []
    for line in block.code.splitlines():
        parts = (part.strip() for part in line.split("&&"))
        commands += [part for part in parts if part and not part.startswith(NOT_RUN)]
    return commands


def test_readme_and_the_docs_have_commands_and_snippets_to_run() -> None:
    readme = ("README.md",)
    docs = tuple(page for page in PAGES if page != "README.md")
    assert docs, "docs/ has no pages"
    for pages in (readme, docs):
        assert any(shell_commands(b) for b in blocks("sh", pages)), pages
        assert blocks("python", pages), pages


@pytest.mark.parametrize("block", blocks("sh"), ids=where)
def test_shell_block(block: Block, tmp_path: Path) -> None:
    named = sorted(set(re.findall(r"examples/hosts/([\w.-]+)", block.code)))
    before = {name: tree_bytes(EXAMPLES / name) for name in named}
    for command in shell_commands(block):
        argv = shlex.split(command, comments=True)
        assert argv[0] in {"proxgpu", ".venv/bin/proxgpu"}, f"{argv[0]} runs: teach this test"
        assert "--host" not in argv, f"{command}: the blocks run against example hosts"
        scratch = [re.sub(r"^/tmp/", f"{tmp_path}/", word) for word in argv[1:]]
        done = proxgpu(*scratch)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
    for name in named:
        assert tree_bytes(EXAMPLES / name) == before[name], f"the block changed {name}"


@pytest.mark.parametrize("snippet", blocks("python"), ids=where)
def test_python_snippet(snippet: Block, tmp_path: Path) -> None:
    def offline(match: re.Match[str]) -> str:
        return f"connect({match['alternative']})"

    code = re.sub(
        r'connect\("[^"]*"\)(?P<rest>.*)#\s*or\s+connect\((?P<alternative>root=[^)]*)\)',
        lambda m: offline(m) + m["rest"],
        snippet.code,
    )
    assert not re.search(r'connect\("', code), "a snippet reaches a host with no --root stand-in"
    # The trees it connects to, copied, so that a snippet that applies cannot change the examples.
    for name in set(re.findall(r'root="examples/hosts/([\w.-]+)"', code)):
        copy_example(tmp_path / "examples" / "hosts", name)
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


@pytest.mark.parametrize("play", blocks("yaml"), ids=where)
def test_yaml_play(play: Block, tmp_path: Path) -> None:
    require_tool("ansible-playbook", "ansible-core (pip install ansible-core)")
    yaml = importlib.import_module("yaml")  # ansible-core's own dependency
    playbook = tmp_path / "play.yml"
    playbook.write_text(play.code)
    checked = ansible(
        "ansible-playbook", tmp_path, "--syntax-check", "-i", "localhost,", str(playbook)
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tasks = [task for p in yaml.safe_load(play.code) for task in p.get("tasks", [])]
    given = {
        module: set(arguments or {})
        for task in tasks
        for module, arguments in task.items()
        if "." in module  # a module's fully qualified name; the others are task keywords
    }
    assert given, "the play runs no module"
    docs = ansible("ansible-doc", tmp_path, "--json", *given)
    assert docs.returncode == 0, docs.stderr
    documented = json.loads(docs.stdout)
    for module, options in given.items():
        known = set(documented[module]["doc"].get("options") or {})
        assert options <= known, f"{module} has no option {sorted(options - known)}"


def inline_commands() -> list[tuple[str, list[str]]]:
    """Inline `proxgpu ...` spans that are commands (a subcommand or an option first) and name no
    placeholder (DIR, ID, [--json], ...), each with the first page that has it."""
    found: dict[str, tuple[str, list[str]]] = {}
    for page, text in PAGES.items():
        # A span may break across lines: a line break is a space.
        for span in sorted(set(re.findall(r"`(proxgpu\s[^`]*)`", text))):
            argv = span.split()
            if argv[1] not in COMMANDS and not argv[1].startswith("-"):
                continue  # `proxgpu tests bench examples`: the package's directory, not a command
            if all(re.fullmatch(r"[a-z0-9][a-z0-9.,=/-]*|--?[a-z][a-z-]*", w) for w in argv[1:]):
                found.setdefault(" ".join(argv), (page, argv))
    return list(found.values())


INLINE = inline_commands()


@pytest.mark.parametrize(("page", "argv"), INLINE, ids=[f"{p}: {' '.join(a)}" for p, a in INLINE])
def test_inline_command(page: str, argv: list[str]) -> None:
    args = argv[1:]
    if "--host" in args:
        at = args.index("--host")
        del args[at : at + 2]
    reads_a_host = not any(a in ("--version", "--help", "-h") for a in args)
    done = proxgpu(*args, *(["--root", CT200] if reads_a_host else []))
    usage = int(claim(r"\| (\d+) \| usage")[1])
    assert done.returncode != usage and "internal error" not in done.stderr, done.stderr
    if not reads_a_host:
        assert done.returncode == 0 and re.match(r"(usage: )?proxgpu", done.stdout), done.stdout


def test_check_gpus_exit_codes_are_as_the_docs_say() -> None:
    said = claim(
        r"Exits (\d+) when the GPUs share one NUMA node,? (?:and )?(\d+) with an explanation "
        r"when they straddle nodes"
    )
    local, straddles = int(said[1]), int(said[2])
    example = claim(r"on ct200, `(\S+)` (?:fails|straddles) and `(\S+)` passes")
    assert proxgpu("check-gpus", example[1], "--root", CT200).returncode == straddles
    assert proxgpu("check-gpus", example[2], "--root", CT200).returncode == local


def test_detailed_exitcode_is_as_the_docs_say(tmp_path: Path) -> None:
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


def test_nothing_to_roll_back_exits_as_the_docs_say(tmp_path: Path) -> None:
    said = claim(r"With nothing to roll back it says so and exits (\d+)")
    done = proxgpu("rollback", "--root", str(copy_example(tmp_path)), "--yes")
    assert done.returncode == int(said[1]), done.stderr
    assert "nothing to roll back" in (done.stdout + done.stderr).lower()


# The documentation's shape.


def test_readme_is_short() -> None:
    lines = len(PAGES["README.md"].splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines: move detail into docs/"


def test_readme_links_every_docs_page() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", PAGES["README.md"]))
    pages = {page for page in PAGES if page.startswith("docs/")}
    assert pages <= linked, f"README.md does not link {sorted(pages - linked)}"


@pytest.mark.parametrize("page", [p for p in PAGES if p.startswith("docs/")])
def test_page_opens_with_its_title_and_what_it_covers(page: str) -> None:
    title, blank, sentence, *_ = PAGES[page].splitlines()
    assert re.fullmatch(r"# \S.*", title), f"{page} opens with {title!r}, not a # title"
    assert not blank and re.match(r"[A-Za-z`\[]", sentence), f"{page}: no sentence under the title"


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a page: lower case, punctuation but ``-`` and
    ``_`` dropped, spaces made hyphens."""
    headings = re.findall(r"^#+ (.+)$", without_code(text), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def without_code(text: str) -> str:
    """The page without its fenced blocks, whose lines are no headings or links."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_lead_somewhere(page: str) -> None:
    """Every relative link of the page names a file that exists, and a heading there if it
    names an anchor."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", without_code(PAGES[page])):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not this repository's
        path, _, anchor = target.partition("#")
        file = (REPO / page).parent / path if path else REPO / page
        if not file.is_file() or (anchor and anchor not in anchors(file.read_text("utf-8"))):
            broken.append(target)
    assert not broken, f"{page} links {broken}"
