"""Stop a daemonized test-host QEMU once the pytest process that started it is gone.

Usage: python qemu_watchdog.py PARENT_PID QEMU_PID PIDFILE

pytest's fixture teardown stops QEMU on normal ends, failures and Ctrl-C, but a pytest killed
by SIGTERM (``timeout``) or SIGKILL runs no teardown, and a daemonized QEMU would then keep both
CPU cores busy indefinitely. The harness starts one watchdog per QEMU launch, in a session of
its own so that signals aimed at pytest's process group do not take it down as well.

Both processes are identified by more than their PID, as PIDs get reused: the parent by its
start time, QEMU by the pidfile path on its command line.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

POLL_S = 1.0
TERM_GRACE_S = 10.0


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), None if gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # After the ")" the fields start at number 3 (state); starttime is number 22.
    return None if fields[0] == "Z" else fields[19]


def is_our_qemu(pid: int, pidfile: str) -> bool:
    """Whether ``pid`` is still the QEMU that was started with ``pidfile``."""
    if start_time(pid) is None:
        return False
    try:
        return pidfile.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False


def stop(pid: int, pidfile: str) -> None:
    """SIGTERM, then SIGKILL if QEMU is still there after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not is_our_qemu(pid, pidfile):
            return
        os.kill(pid, sig)
        deadline = time.monotonic() + TERM_GRACE_S
        while is_our_qemu(pid, pidfile) and time.monotonic() < deadline:
            time.sleep(0.2)


def watch(parent: int, qemu: int, pidfile: str) -> None:
    """Return when QEMU has exited, stopping it first if the parent went away."""
    parent_started = start_time(parent)
    while is_our_qemu(qemu, pidfile):
        if parent_started is None or start_time(parent) != parent_started:
            stop(qemu, pidfile)
            return
        time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    """Entry point: parse the three arguments and watch."""
    parent, qemu, pidfile = int(argv[1]), int(argv[2]), argv[3]
    watch(parent, qemu, pidfile)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
