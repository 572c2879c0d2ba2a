"""The follow-up actions of a change set (``update-initramfs``, ``proxmox-boot-tool refresh``...):
run on a live host, listed for a directory tree.

Every action runs through ``scripts/follow.sh``, so that its answer carries the end record
that proves the action ran to its end (see :mod:`proxgpu.host.scripts`): a host that answers
"exit 0" without running ``update-initramfs`` is not believed. An action can run for minutes;
with ``follow`` its output's last lines are said as ``output`` steps while it runs: it writes
into a log on the host whose new bytes a second command reads every ``POLL`` seconds, only the
last ``follow`` lines' worth of them each time, so neither side holds more than that tail.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.rendering.changes import Action
>>> run_actions(DirectoryHost("examples/hosts/ct200"), [Action(argv=["update-grub"], why="")], [])
['listed, not run (a directory tree): update-grub']
"""

from __future__ import annotations

import base64
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Iterator, Sequence

from proxgpu.apply.layout import Layout
from proxgpu.apply.options import ACTION_TIMEOUT
from proxgpu.apply.remote import Progress, quiet
from proxgpu.errors import CommandError, ProxgpuError
from proxgpu.host.base import Host
from proxgpu.host.scripts import ScriptRecord, run_script
from proxgpu.paths import OUTPUT_DIR
from proxgpu.rendering.changes import Action

log = logging.getLogger(__name__)

#: Seconds between two reads of a followed action's output.
POLL = 1.0
#: The most characters of one output line said (the rest is cut).
LINE_CHARS = 300
#: The exit code of ``follow.sh`` when it cannot make the log (the action did not run).
NO_LOG = 125


def run_actions(
    host: Host,
    actions: Sequence[Action],
    ran: list[list[str]],
    say: Progress = quiet,
    timeout: float = ACTION_TIMEOUT,
    *,
    follow: int = 0,
) -> list[str]:
    """Run each action in order, appending it to ``ran`` once it succeeded, so that the caller
    knows what ran even when one fails; return messages (on a tree: the actions, listed).
    ``follow``: how many of an action's last output lines to say (``say("output", line)``)
    while it runs; 0: none.

    :raises CommandError: when an action fails (what ran before it is not undone here).
    """
    if not host.is_live:
        return [f"listed, not run (a directory tree): {' '.join(a.argv)}" for a in actions]
    for action in actions:
        say("action", " ".join(action.argv))
        start = time.monotonic()
        run_followed(host, action.argv, say, lines=follow, timeout=timeout)
        log.info("%s: %s took %.1f s", host.name, " ".join(action.argv), time.monotonic() - start)
        ran.append(action.argv)
    return []


def run_followed(
    host: Host,
    argv: list[str],
    say: Progress,
    *,
    lines: int,
    timeout: float = ACTION_TIMEOUT,
    poll: float = POLL,
) -> None:
    """Run ``argv`` on ``host``, saying each new line of its output's tail as it comes (at most
    ``lines`` per read), the last ones once it ended; with ``lines`` 0, only run it.

    >>> from proxgpu.host import LocalHost
    >>> import tempfile
    >>> said = []
    >>> with tempfile.TemporaryDirectory() as root:
    ...     run_followed(LocalHost(root), ["printf", "a\\\\nb\\\\n"], lambda s, m: said.append(m),
    ...                  lines=5)
    >>> said
    ['a', 'b']

    :raises CommandError: when it fails (its output's end is the message).
    """
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}.log"
    path = Layout.of(host).on_host(f"{OUTPUT_DIR}/{name}")
    tail = _Tail(say, lines)
    with _reading(host, path, poll, tail) if lines else contextlib.nullcontext():
        output = run_script(
            host, "follow", "run", path, str(tail.most), *argv, timeout=timeout, check=False
        )
    if lines:
        tail.said(output.records, ended=True)
    if output.returncode == NO_LOG:
        raise CommandError(host.name, [f"the follow step of {argv[0]}"], NO_LOG, output.stderr)
    if output.returncode != 0:
        raise CommandError(host.name, argv, output.returncode, output.stderr)


class _Tail:
    """What was said so far of one action's output: the offset in its log up to which every
    line was said, so that each read says only the lines after it, and at most ``lines``."""

    def __init__(self, say: Progress, lines: int) -> None:
        self.say = say
        self.lines = lines
        self.offset = 0
        self.lock = threading.Lock()

    @property
    def most(self) -> int:
        """The most bytes one read asks for: the last ``lines`` lines, as cut for showing."""
        return self.lines * (LINE_CHARS + 1)

    def said(self, records: list[ScriptRecord], *, ended: bool = False) -> None:
        """Say the whole lines of one read that were not said yet (only its last ``lines``);
        a last line still being written waits for its newline, or for the action's end."""
        chunk = next((r for r in records if r.kind == "chunk"), None)
        if chunk is None:
            return
        try:
            start, data = int(chunk[0]), base64.b64decode(chunk[1], validate=True)
        except (ValueError, IndexError):  # binascii.Error is a ValueError
            log.debug("a read of the action's output was not a chunk: %r", chunk.fields[:1])
            return  # the tail is only shown: what cannot be read is not said
        with self.lock:
            if start < self.offset:
                data, start = data[self.offset - start :], self.offset
            elif start > self.offset and b"\n" in data:
                # The read began inside a line older than its tail: that line is not whole.
                cut = data.index(b"\n") + 1
                data, start = data[cut:], start + cut
            whole = len(data) if ended else data.rfind(b"\n") + 1
            self.offset = max(self.offset, start + whole)
            for line in data[:whole].decode("utf-8", "replace").splitlines()[-self.lines :]:
                self.say("output", line[:LINE_CHARS].replace("\t", " "))


@contextlib.contextmanager
def _reading(host: Host, path: str, poll: float, tail: _Tail) -> Iterator[None]:
    """Read the log's tail every ``poll`` seconds in a thread, while the block runs."""
    stop = threading.Event()
    reader = threading.Thread(
        target=_read_while, args=(host, path, poll), kwargs={"stop": stop, "tail": tail}
    )
    reader.daemon = True
    reader.start()
    try:
        yield
    finally:
        stop.set()
        reader.join()


def _read_while(host: Host, path: str, poll: float, *, stop: threading.Event, tail: _Tail) -> None:
    # Reading the tail is best effort: the action's own result is what counts.
    while not stop.wait(poll):
        try:
            since = str(tail.offset)
            found = run_script(host, "follow", "tail", path, since, str(tail.most), check=False)
            tail.said(found.records)
        except ProxgpuError as exc:
            log.debug("%s: reading %s stopped: %s", host.name, path, exc)
            return
