"""Waiting for an event in a test: poll it to a deadline, never sleep a guess of how long it
takes (a loaded machine, both cores busy with QEMU or two workers, breaks the guess)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, poll: float = 0.02) -> bool:
    """Poll ``condition`` every ``poll`` seconds until it holds (True) or ``timeout`` seconds
    pass (False).

    >>> wait_for(lambda: True)
    True
    >>> wait_for(lambda: False, timeout=0.05)
    False
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True
