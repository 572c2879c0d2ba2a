"""The follow-up actions of a change set (``update-initramfs``, ``proxmox-boot-tool refresh``...):
run on a live host, listed for a directory tree.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.rendering.changes import Action
>>> run_actions(DirectoryHost("examples/hosts/ct200"), [Action(argv=["update-grub"], why="")], [])
['listed, not run (a directory tree): update-grub']
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from proxgpu.apply.remote import Progress, quiet
from proxgpu.host.base import Host
from proxgpu.rendering.changes import Action

log = logging.getLogger(__name__)

#: Seconds a post-action may run (an initramfs rebuild for every kernel takes minutes).
ACTION_TIMEOUT = 900.0


def run_actions(
    host: Host,
    actions: Sequence[Action],
    ran: list[list[str]],
    say: Progress = quiet,
    timeout: float = ACTION_TIMEOUT,
) -> list[str]:
    """Run each action in order, appending it to ``ran`` once it succeeded, so that the caller
    knows what ran even when one fails; return messages (on a tree: the actions, listed).

    :raises CommandError: when an action fails (what ran before it is not undone here).
    """
    if not host.is_live:
        return [f"listed, not run (a directory tree): {' '.join(a.argv)}" for a in actions]
    for action in actions:
        say("action", " ".join(action.argv))
        start = time.monotonic()
        host.check(action.argv, timeout=timeout)
        log.info("%s: %s took %.1f s", host.name, " ".join(action.argv), time.monotonic() - start)
        ran.append(action.argv)
    return []
