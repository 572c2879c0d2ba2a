"""The machine proxgpu runs on, and a directory laid out like a host (a snapshot, an image).

>>> host = LocalHost()
>>> host.run(["echo", "hello"]).stdout
b'hello\\n'
"""

from __future__ import annotations

import os
import subprocess

from proxgpu.errors import CommandTimeoutError, UsageError
from proxgpu.host.base import CommandResult, Host


class LocalHost(Host):
    """The machine proxgpu runs on."""

    def __init__(self, root: str = "/") -> None:
        super().__init__()
        self.root = root
        self.name = "localhost" if root == "/" else f"localhost:{root}"

    def _run(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                argv, input=stdin, capture_output=True, timeout=timeout, check=False
            )
        except FileNotFoundError:
            return CommandResult(argv, 127, b"", f"{argv[0]}: command not found".encode())
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeoutError(self.name, list(argv), timeout or 0) from exc
        return CommandResult(argv, proc.returncode, proc.stdout, proc.stderr)


class DirectoryHost(LocalHost):
    """A directory laid out like a host's absolute paths (a snapshot, an offline image).

    Reading commands run locally against the tree; nothing runs *on* the captured host, so live
    steps and post-actions are listed rather than run.
    """

    is_live = False

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.name = f"dir:{root}"
        if not os.path.isdir(root):
            raise UsageError(f"{root}: no such directory (--root names a host's tree)")
