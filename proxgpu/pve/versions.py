"""Which Proxmox VE release brought the config options proxgpu writes, and versions compared
number by number (Proxmox's packages, the kernel's release).

>>> dev_entries("5.0.7", None), dev_entries("5.0.6", "8.4.1"), dev_entries(None, "8.2.4")
(True, False, True)
>>> version_at_least("7.2-3", VM_AFFINITY), version_at_least(None, VM_AFFINITY)
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


def version_at_least(version: str | None, release: tuple[int, ...]) -> bool:
    """Whether the version ``version`` (a Debian package's, ``5.1.11``, ``4.0-9``, or a kernel
    release, ``6.8.12-11-pve``) is ``release`` or later, its numbers compared in order; unknown
    is not.

    >>> version_at_least("4.0-9", DEV_ENTRIES), version_at_least("5.1.11", DEV_ENTRIES)
    (False, True)
    """
    numbers = _numbers(version)
    return bool(numbers) and numbers >= release


def version_before(version: str | None, release: tuple[int, ...]) -> bool:
    """Whether ``version`` is known and earlier than ``release`` (unknown is not: what a check
    assumes of a release it cannot read is the current behaviour).

    >>> version_before("5.15.158-2-pve", (6, 0)), version_before(None, (6, 0))
    (True, False)
    """
    numbers = _numbers(version)
    return bool(numbers) and numbers < release


def _numbers(version: str | None) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version or ""))


def dev_entries(pve_container: str | None, pve_manager: str | None) -> bool:
    """Whether the host's Proxmox parses ``devN`` container entries: by pve-container's version,
    or, where that is unknown, by the pve-manager release that requires a pve-container that
    does."""
    if pve_container is not None:
        return version_at_least(pve_container, DEV_ENTRIES)
    return version_at_least(pve_manager, DEV_ENTRIES_MANAGER)
