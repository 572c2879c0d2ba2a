"""The proxgpu(1) manual page, generated from the argument parser by argparse-manpage (a
development tool, not a dependency): ``python tools/manpage.py > man/proxgpu.1``. The page is
committed and shipped in the sdist; a test fails when it no longer matches the parser.

Beside the options, the page gives in full what ``--help`` ends with in short (the exit codes of
:data:`proxgpu.cli.manual.EXIT_CODES`), and the environment, files and examples below.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable

from proxgpu.cli.manual import EXIT_CODES, TYPICAL
from proxgpu.cli.parser import build_parser
from proxgpu.errors import ProxgpuError

#: The environment variables proxgpu reads, and what each does.
ENVIRONMENT = (
    ("NO_COLOR", "no colour with --color auto (an explicit --color always still colours)"),
    ("TERM", "dumb: no colour with --color auto"),
    ("PROXGPU_DEBUG", "set: an internal error prints its traceback instead of one line"),
    ("XDG_CONFIG_HOME", "where this machine's signing key is kept (default ~/.config)"),
    ("SSH_AUTH_SOCK", "the ssh-agent whose keys SSH offers"),
)

#: The files proxgpu reads or writes, and why.
FILES = (
    ("~/.ssh/config", "SSH settings for --host (or --ssh-config FILE)"),
    ("~/.ssh/known_hosts", "the host keys SSH verifies against (or --known-hosts FILE)"),
    ("~/.config/proxgpu/key", "this machine's key, signing saved plans and journal entries"),
    ("/var/lib/proxgpu/journal/", "on the host: one entry per apply and rollback"),
    ("/var/lib/proxgpu/backups/", "on the host: the files as they were before each apply"),
    ("/run/lock/proxgpu", "on the host: held while an apply or rollback runs"),
    ("/etc/pve/lxc/VMID.conf", "the container's config: its GPUs, cpuset and cores"),
    ("/etc/pve/qemu-server/VMID.conf", "the VM's config: its hostpci entries and pinning"),
    ("/etc/modprobe.d/00-proxgpu-vfio.conf", "the boot-time binding to vfio-pci"),
)

#: Commands a new user starts from, with what each does.
EXAMPLES = (
    ("proxgpu inspect --host root@pve1", "the GPUs, NUMA nodes and IOMMU groups of pve1"),
    (
        "proxgpu plan --host root@pve1 --lxc 200 --vm 300",
        "the split and every file change it needs, changing nothing",
    ),
    ("proxgpu apply --host root@pve1 --lxc 200 --vm 300", "the same, applied after asking"),
    ("proxgpu verify --host root@pve1", "exit 17 when the host drifted from the last apply"),
    ("proxgpu rollback --host root@pve1", "undo the last apply"),
    ("proxgpu run --tp 4 -- vllm serve MODEL", "run on 4 GPUs of one NUMA node, bound to it"),
    (
        "proxgpu completion fish > ~/.config/fish/completions/proxgpu.fish",
        "tab completion for fish (bash and zsh too)",
    ),
)


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
        parser = parser or build_parser()
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


def roff_sections() -> dict[str, str]:
    """The man page's EXIT STATUS, ENVIRONMENT, FILES and EXAMPLES, as roff."""
    return {
        "exit status": _tagged((str(code), meaning) for code, _, meaning in EXIT_CODES),
        "environment": _tagged(ENVIRONMENT),
        "files": _tagged(FILES),
        "examples": _tagged(EXAMPLES),
    }


def _tagged(items: Iterable[tuple[str, str]]) -> str:
    return "\n".join(f".TP\n.B {_roff(tag)}\n{_roff(text)}" for tag, text in items)


def _roff(text: str) -> str:
    # A backslash and a leading dot or quote are roff's; hyphens in options are minus signs.
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def main() -> int:
    """Print the page."""
    sys.stdout.write(man_page())
    return 0


if __name__ == "__main__":
    sys.exit(main())
