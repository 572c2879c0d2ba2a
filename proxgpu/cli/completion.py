"""Shell completion and the manual page, both generated from the argument parser.

``proxgpu completion bash|zsh`` prints a completion script made by shtab from
:func:`~proxgpu.cli.parser.build_parser`, so it can never lag behind the options. The manual
page ``man/proxgpu.1`` is made the same way by argparse-manpage, a development tool: it is
generated into the source tree (``python -m proxgpu.cli.completion man > man/proxgpu.1``),
shipped in the sdist, and a test fails when it no longer matches the parser.
"""

from __future__ import annotations

import argparse
import os
import sys

from proxgpu.cli.manual import TYPICAL, roff_sections
from proxgpu.errors import ProxgpuError

#: The shells ``proxgpu completion`` writes scripts for.
SHELLS = ("bash", "zsh")


def _parser() -> argparse.ArgumentParser:
    # Imported here: the parser module imports this one for the subcommand's handler.
    from proxgpu.cli.parser import build_parser  # noqa: PLC0415

    return build_parser()


def completion_script(shell: str, parser: argparse.ArgumentParser | None = None) -> str:
    """The completion script for ``shell`` (bash or zsh), from ``parser`` (default: proxgpu's).

    >>> "proxgpu" in completion_script("bash")
    True

    :raises ProxgpuError: for another shell, or when shtab is not installed.
    """
    if shell not in SHELLS:
        raise ProxgpuError(f"no completion for {shell!r}: choose one of {', '.join(SHELLS)}")
    try:
        # Imported on first use: only this subcommand needs it, and every command pays for
        # what the CLI imports at startup.
        import shtab  # noqa: PLC0415
    except ImportError as exc:
        raise ProxgpuError(f"shell completion needs shtab (pip install shtab): {exc}") from exc
    script: str = shtab.complete(parser or _parser(), shell=shell)
    return script if script.endswith("\n") else script + "\n"


def man_page(parser: argparse.ArgumentParser | None = None) -> str:
    """The roff source of the proxgpu(1) manual page, from ``parser`` (default: proxgpu's).

    It holds no date and no version, so that it changes only when the parser does.

    >>> man_page().startswith(".TH PROXGPU")
    True

    :raises ProxgpuError: when argparse-manpage (a development tool) is not installed.
    """
    try:
        # argparse-manpage ships no type information.
        from argparse_manpage.manpage import Manpage  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError as exc:
        raise ProxgpuError(f"the man page needs argparse-manpage: {exc}") from exc
    # argparse wraps usage lines to the terminal's width (COLUMNS first): fix it, so that the
    # page is the same in every terminal and in CI.
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        parser = parser or _parser()
        page = Manpage(parser)
        # NAME's one line, as whatis(1) and apropos(1) show it.
        page.description = (parser.description or "").rstrip(".")
        page.date = ""
        page.source = "proxgpu"
        page.manual = "User Commands"
        # The epilog's exit-code table is EXIT STATUS's short form: the page gives it in full.
        page.add_section("comments", "=", page.format_text(TYPICAL))
        for heading, roff in roff_sections().items():
            page.add_section(heading, "=", roff)
        text = str(page)
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return text if text.endswith("\n") else text + "\n"


def cmd_completion(args: argparse.Namespace) -> int:
    r"""``proxgpu completion SHELL``: print the completion script.

    >>> import contextlib, io
    >>> out = io.StringIO()
    >>> with contextlib.redirect_stdout(out):
    ...     status = cmd_completion(argparse.Namespace(shell="zsh"))
    >>> status, out.getvalue()[:16]
    (0, '#compdef proxgpu')
    >>> out.getvalue().endswith("\n")
    True
    """
    sys.stdout.write(completion_script(args.shell))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m proxgpu.cli.completion man|bash|zsh``: print the man page or a script."""
    what = (sys.argv[1:] if argv is None else argv) or ["man"]
    sys.stdout.write(man_page() if what[0] == "man" else completion_script(what[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
