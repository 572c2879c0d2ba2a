"""The machine proxgpu runs on, and a directory laid out like a host (a snapshot, an image).

Each command runs in a session of its own and is read with a deadline and a size limit for the
whole command: a script that answers forever, trickles or blocks on a FIFO is killed with every
process it started (its session), so none is left behind.

>>> host = LocalHost()
>>> host.run(["echo", "hello"]).stdout
b'hello\\n'
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from typing import IO

from proxgpu.errors import CommandOutputTooLargeError, CommandTimeoutError, UsageError
from proxgpu.host.base import DEFAULT_TIMEOUT, CommandResult, Host


class LocalHost(Host):
    """The machine proxgpu runs on."""

    def __init__(self, root: str = "/") -> None:
        super().__init__()
        self.root = root
        self.name = "localhost" if root == "/" else f"localhost:{root}"

    def _run(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None
    ) -> CommandResult:
        limit = DEFAULT_TIMEOUT if timeout is None else timeout
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # one process group to kill, grandchildren included
            )
        except FileNotFoundError:
            return CommandResult(argv, 127, b"", f"{argv[0]}: command not found".encode())
        try:
            stdout, stderr = _bounded_read(proc, stdin, time.monotonic() + limit, self.max_output)
        except TimeoutError:
            raise CommandTimeoutError(self.name, list(argv), limit) from None
        except OverflowError:
            raise CommandOutputTooLargeError(self.name, list(argv), self.max_output) from None
        finally:
            if proc.returncode is None:  # stopped early (or interrupted): kill the whole session
                _kill_session(proc)
        return CommandResult(argv, proc.returncode, stdout, stderr)


def _bounded_read(
    proc: subprocess.Popen[bytes], stdin: bytes | None, deadline: float, max_output: int
) -> tuple[bytes, bytes]:
    """stdout and stderr of ``proc`` until both close and it exits.

    :raises TimeoutError: past ``deadline``. :raises OverflowError: past ``max_output`` bytes.
    """
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin or b""), daemon=True)
    feeder.start()
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total = 0
    with selectors.DefaultSelector() as selector:
        for stream in chunks:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fd)
                    continue
                total += len(data)
                if total > max_output:
                    raise OverflowError
                chunks[key.fd].append(data)
    try:
        proc.wait(max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        raise TimeoutError from None
    return b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])


def _feed(pipe: IO[bytes], data: bytes) -> None:
    # A command that exits without reading all of its stdin is not an error of the transport.
    with contextlib.suppress(OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


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
            what = "not a directory" if os.path.lexists(root) else "no such directory"
            raise UsageError(f"{root}: {what} (--root names a host's tree)")
