"""A command's pipes read to their end, its input fed meanwhile: one deadline and one output
bound for the whole command, whatever runs it (a local process, a session on an OpenSSH master).

>>> import subprocess
>>> proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
...                         stderr=subprocess.PIPE)
>>> exchange(proc.stdin.fileno(), proc.stdin.close, b"hi", (proc.stdout.fileno(),
...          proc.stderr.fileno()), deadline=time.monotonic() + 10, max_output=1 << 20)
(b'hi', b'')
>>> proc.wait()
0
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable


def exchange(
    feed: int,
    close_feed: Callable[[], None],
    payload: bytes | None,
    outputs: tuple[int, int],
    *,
    deadline: float,
    max_output: int,
) -> tuple[bytes, bytes]:
    """What the descriptors ``outputs`` (stdout, stderr) give until both end, ``payload``
    written to ``feed`` meanwhile and ``feed`` then closed with ``close_feed`` (whoever opened
    it closes it, once). The writes never block: a command that stops reading its input cannot
    hold the exchange past ``deadline`` (a ``time.monotonic`` value).

    :raises TimeoutError: past ``deadline``. :raises OverflowError: past ``max_output`` bytes.
    """
    pending = memoryview(payload or b"")
    writers = [feed] if pending else []
    if pending:
        os.set_blocking(feed, False)
    else:
        close_feed()
    chunks: dict[int, list[bytes]] = {fd: [] for fd in outputs}
    readers = list(outputs)
    total = 0
    while readers:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        readable, writable, _ = select.select(readers, writers, [], remaining)
        if writable:
            try:
                pending = pending[os.write(feed, pending[: 1 << 16]) :]
            except BlockingIOError:
                pass  # the pipe filled between select and write: wait for room again
            except BrokenPipeError:
                pending = pending[:0]  # a command that exits without reading all of it
            if not pending:
                writers = []
                close_feed()
        for fd in readable:
            data = os.read(fd, 1 << 16)
            if not data:
                readers.remove(fd)
            chunks[fd].append(data)
            total += len(data)
            if total > max_output:
                raise OverflowError
    return b"".join(chunks[outputs[0]]), b"".join(chunks[outputs[1]])
