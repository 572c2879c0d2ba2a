"""What the tests' pinned outside sources share (Proxmox VE's code in tests/proxmox, the kmod
releases in tests/kmod): the cache they are kept in, outside the tree, and the one line of a
failed command's output that says why."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def cache_dir(name: str, environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/proxgpu/NAME`` (``~/.cache`` without it).

    >>> cache_dir("kmod", {"XDG_CACHE_HOME": "/var/cache/me"})
    PosixPath('/var/cache/me/proxgpu/kmod')
    """
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")) / ".cache")
    return Path(base).expanduser() / "proxgpu" / name


def last_line(text: str) -> str:
    """The last line of a command's output that is not blank: where git, make and meson say
    what failed.

    >>> last_line("configure: checking\\nerror: no cc\\n\\n"), last_line("")
    ('error: no cc', 'no message')
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"
