"""Which Proxmox VE release brought the config options proxgpu writes.

>>> pve_at_least("8.4.1", DEV_ENTRIES), pve_at_least("7.2-3", VM_AFFINITY)
(True, False)
>>> pve_at_least(None, DEV_ENTRIES)
False
"""

from __future__ import annotations

import re

#: ``devN:`` container entries: pve-container 5.0.7, in Proxmox VE 8.1.
DEV_ENTRIES = (8, 1)
#: The VM ``affinity`` option: qemu-server 7.3-1, in Proxmox VE 7.3.
VM_AFFINITY = (7, 3)


def pve_at_least(version: str | None, release: tuple[int, int]) -> bool:
    """Whether ``version`` (pve-manager's, ``8.4.1``) is ``release`` or later; unknown is not."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return match is not None and (int(match[1]), int(match[2])) >= release
