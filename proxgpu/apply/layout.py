"""Where the write path keeps things on a host, and where each target file's temp file and
Proxmox config lock are, under the host's root prefix.

>>> layout = Layout("/srv/tree")
>>> layout.journal("1")
'/srv/tree/var/lib/proxgpu/journal/1.json'
>>> where(layout, "/etc/pve/lxc/200.conf", "1", is_live=True).guest_lock
'/srv/tree/run/lock/lxc/pve-config-200.lock'
"""

from __future__ import annotations

from dataclasses import dataclass

from proxgpu.host.base import Host
from proxgpu.paths import BACKUP_DIR, JOURNAL_DIR, LOCK_DIR, PVE_DIR, guest_config_lock


@dataclass(frozen=True)
class Layout:
    """The host's root prefix, and proxgpu's own directories under it."""

    prefix: str

    @classmethod
    def of(cls, host: Host) -> Layout:
        """The layout of ``host`` (its root without a trailing slash)."""
        return cls(host.root.rstrip("/"))

    def on_host(self, path: str) -> str:
        """``path`` as a command on the host names it."""
        return self.prefix + path

    @property
    def lock(self) -> str:
        """The host-wide lock directory."""
        return self.on_host(LOCK_DIR)

    @property
    def journal_dir(self) -> str:
        """The directory of journal entries."""
        return self.on_host(JOURNAL_DIR)

    def journal(self, journal_id: str) -> str:
        """One journal entry's file."""
        return f"{self.journal_dir}/{journal_id}.json"

    def backups(self, journal_id: str) -> str:
        """The directory of one apply's backups."""
        return self.on_host(f"{BACKUP_DIR}/{journal_id}")


@dataclass(frozen=True)
class Where:
    """A target file's paths on the host: itself, its temp file, Proxmox's lock for it."""

    path: str
    tmp: str
    guest_lock: str
    in_pve: bool

    @property
    def restore_tmp(self) -> str:
        """The temp file a restore writes: never the apply's own, which it may still write."""
        return self.tmp.removesuffix(".tmp") + ".restore.tmp"


def where(layout: Layout, path: str, journal_id: str, is_live: bool) -> Where:
    """Where ``path`` is on the host, with the temp file of journal entry ``journal_id``."""
    directory, _, name = layout.on_host(path).rpartition("/")
    # A leading dot and a suffix keep the temp file out of every *.conf and run-parts glob, and
    # pmxcfs only treats NNN.conf as a guest.
    tmp = f"{directory}/.{name}.proxgpu-{journal_id}.tmp"
    lock = guest_config_lock(path) if is_live else None
    guest_lock = layout.on_host(lock) if lock else "-"
    return Where(layout.on_host(path), tmp, guest_lock, path.startswith(PVE_DIR))


def mode_and_umask(wanted: int | None, current: str | None, where: Where) -> tuple[str, str]:
    """The mode to chmod a new temp file to, and the umask to create it under.

    pmxcfs refuses a chmod to anything but its own 0640, so in /etc/pve the mode comes from the
    umask alone (pmxcfs ignores it; a tree copy keeps the file's mode). Elsewhere the file is
    created private and then given its mode, which may carry bits no umask can give (0755).

    >>> mode_and_umask(0o755, None, Where("/x", "/.x.tmp", "-", in_pve=False))
    ('755', '077')
    """
    mode = wanted if wanted is not None else int(current or ("640" if where.in_pve else "644"), 8)
    if where.in_pve:
        return "-", f"{0o777 & ~mode:03o}"
    return f"{mode:o}", "077"
