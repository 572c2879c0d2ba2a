"""Which Proxmox VE release brought the config options proxgpu writes.

>>> dev_entries("5.0.7", None), dev_entries("5.0.6", "8.4.1"), dev_entries(None, "8.2.4")
(True, False, True)
>>> pve_at_least("7.2-3", VM_AFFINITY), pve_at_least(None, VM_AFFINITY)
(False, False)
"""

from __future__ import annotations

import re

#: ``devN:`` container entries: pve-container 5.0.7 parses them ("allow passing raw device nodes
#: through to containers" in its debian/changelog; the ``dev%d`` keys of PVE::LXC::Config).
DEV_ENTRIES = (5, 0, 7)
#: pve-manager 8.2.4 and later depend on pve-container >= 5.1.11 (pve-manager's debian/control),
#: so they imply ``devN`` entries where pve-container's own version was not read (an older
#: snapshot). pve-manager 8.1, which shows them in its GUI, still accepts pve-container 5.0.5.
DEV_ENTRIES_MANAGER = (8, 2, 4)
#: The VM ``affinity`` option: qemu-server 7.3-1, in Proxmox VE 7.3.
VM_AFFINITY = (7, 3)


def pve_at_least(version: str | None, release: tuple[int, int]) -> bool:
    """Whether ``version`` (pve-manager's, ``8.4.1``) is ``release`` or later; unknown is not."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return match is not None and (int(match[1]), int(match[2])) >= release


def version_at_least(version: str | None, release: tuple[int, ...]) -> bool:
    """Whether the Debian package version ``version`` (``5.1.11``, ``4.0-9``) is ``release`` or
    later, its numbers compared in order; unknown is not.

    >>> version_at_least("4.0-9", DEV_ENTRIES), version_at_least("5.1.11", DEV_ENTRIES)
    (False, True)
    """
    numbers = tuple(int(n) for n in re.findall(r"\d+", version or ""))
    return bool(numbers) and numbers >= release


def dev_entries(pve_container: str | None, pve_manager: str | None) -> bool:
    """Whether the host's Proxmox parses ``devN`` container entries: by pve-container's version,
    or, where that is unknown, by the pve-manager release that requires a pve-container that
    does."""
    if pve_container is not None:
        return version_at_least(pve_container, DEV_ENTRIES)
    return version_at_least(pve_manager, DEV_ENTRIES_MANAGER)
