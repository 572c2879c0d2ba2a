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
import signal
import subprocess
import time

from proxgpu.errors import UsageError
from proxgpu.host.base import CommandResult, Host
from proxgpu.host.pipes import exchange
from proxgpu.paths import MEMBERS, PCI_DEVICES


class LocalHost(Host):
    """The machine proxgpu runs on."""

    def __init__(self, root: str = "/") -> None:
        super().__init__()
        self.root = root
        self.name = "localhost" if root == "/" else f"localhost:{root}"

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float) -> CommandResult:
        deadline = time.monotonic() + timeout
        try:
            code, stdout, stderr = run_bounded(argv, stdin, deadline, self.max_output)
        except FileNotFoundError:
            return CommandResult(argv, 127, b"", f"{argv[0]}: command not found".encode())
        return CommandResult(argv, code, stdout, stderr)


def run_bounded(
    argv: tuple[str, ...], stdin: bytes | None, deadline: float, max_output: int
) -> tuple[int, bytes, bytes]:
    """Run ``argv`` here in a session of its own: its exit status, stdout and stderr, ``stdin``
    fed to it meanwhile. Stopped early (past ``deadline``, a ``time.monotonic`` value, or past
    ``max_output`` bytes), it is killed with every process it started.

    >>> run_bounded(("sh", "-c", "cat; exit 3"), b"hi", time.monotonic() + 10, 1 << 20)
    (3, b'hi', b'')

    :raises TimeoutError: past ``deadline``. :raises OverflowError: past ``max_output`` bytes.
    :raises OSError: when it cannot be started (``FileNotFoundError`` when there is no such
        program).
    """
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # one process group to kill, grandchildren included
    )
    try:
        stdout, stderr = _bounded_read(proc, stdin, deadline, max_output)
    finally:
        if proc.returncode is None:  # stopped early (or interrupted): kill the whole session
            _kill_session(proc)
    return proc.returncode, stdout, stderr


def _bounded_read(
    proc: subprocess.Popen[bytes], stdin: bytes | None, deadline: float, max_output: int
) -> tuple[bytes, bytes]:
    """stdout and stderr of ``proc`` until both close and it exits.

    :raises TimeoutError: past ``deadline``. :raises OverflowError: past ``max_output`` bytes.
    """
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    outputs = (proc.stdout.fileno(), proc.stderr.fileno())
    feed = proc.stdin.fileno()
    read = exchange(
        feed, proc.stdin.close, stdin, outputs, deadline=deadline, max_output=max_output
    )
    try:
        proc.wait(max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        raise TimeoutError from None
    return read


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
    steps and post-actions are listed rather than run. A cluster snapshot (``DIR/NODE/`` trees,
    as ``snapshot --cluster`` writes) is no host's tree: read as one it would fail deep in
    inspection ("no PCI devices found"), so it is refused here, naming its nodes.

    >>> DirectoryHost("examples/hosts/cluster-3")
    Traceback (most recent call last):
    ...
    proxgpu.errors.UsageError: examples/hosts/cluster-3: a cluster snapshot (nodes pve1, pve2, \
pve3): add --cluster, or name one node's tree (--root examples/hosts/cluster-3/pve1)

    :raises UsageError: when ``root`` is no directory, or a cluster snapshot.
    """

    is_live = False

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.name = f"dir:{root}"
        if not os.path.isdir(root):
            what = "not a directory" if os.path.lexists(root) else "no such directory"
            raise UsageError(f"{root}: {what} (--root names a host's tree)")
        _refuse_cluster_snapshot(root)


def snapshot_node_trees(root: str) -> list[str]:
    """The nodes whose trees the directory ``root`` holds, as a cluster snapshot lays them out
    (``NODE/etc/pve/.members``), sorted.

    >>> snapshot_node_trees("examples/hosts/cluster-3")
    ['pve1', 'pve2', 'pve3']
    """
    members = MEMBERS.lstrip("/")
    with os.scandir(root) as entries:
        return sorted(e.name for e in entries if os.path.isfile(os.path.join(e.path, members)))


def _refuse_cluster_snapshot(root: str) -> None:
    # A few stat calls: a host's tree has its PCI devices; a snapshot has NODE/.members trees.
    if os.path.isdir(os.path.join(root, PCI_DEVICES.strip("/"))):
        return
    nodes = snapshot_node_trees(root)
    if nodes:
        raise UsageError(
            f"{root}: a cluster snapshot (nodes {', '.join(nodes)}): add --cluster, "
            f"or name one node's tree (--root {os.path.join(root, nodes[0])})"
        )


def process_running(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs: one that exited but was not reaped
    yet (a zombie, as a killed proxgpu is until its parent waits for it) does not; another
    user's, which may not be signalled, does.

    >>> process_running(os.getpid())
    True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")
