"""VM configs and the PCI mapping written through the Proxmox API during an apply, instead of
as files.

On a live host with pvesh, ``PUT /nodes/<node>/qemu/<vmid>/config`` with the main-section keys
that change, ``delete`` for those that go, and the ``digest`` of the config the plan was made
from, so that Proxmox itself refuses a concurrent edit and takes its own lock. The cluster-wide
``/etc/pve/mapping/pci.cfg`` likewise: ``/cluster/mapping/pci/<id>`` with the file's digest
(:func:`proxgpu.pve.cluster.write_mapping`), for the one mapping id a change set edits.
Proxmox rewrites the file in its own order, so the hash the journal keeps is read back
afterwards (:meth:`VmApiWriter.confirm`); until then the path is *unconfirmed*.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from proxgpu.apply.remote import Progress
from proxgpu.errors import FileChangedError, MappingChangedError, PveApiError
from proxgpu.host.base import Host
from proxgpu.paths import PCI_MAPPING, guest_of, is_vm_config
from proxgpu.pve.api import PveResource, config_digest, config_update, proxmox_api, pvesh_warnings
from proxgpu.pve.cluster import MAPPING_API, write_mapping
from proxgpu.pve.mapping import changed_ids
from proxgpu.rendering.changes import FileChange


class VmApiWriter:
    """The Proxmox API of one host (made on first use) and the VM configs and PCI mapping an
    apply sends to it."""

    def __init__(self, host: Host, say: Progress) -> None:
        self.host = host
        self.say = say
        self.node = ""
        #: The ``PUT .../config`` parameters of each VM config written through the API, by path.
        self.updates: dict[str, dict[str, str]] = {}
        #: The PCI mapping change written through the API, if any, and the id it changes.
        self.mapping: tuple[FileChange, str] | None = None
        #: Paths written through the API whose resulting hash is not known yet.
        self.unconfirmed: set[str] = set()
        self._api: PveResource | None = None

    def api(self) -> PveResource:
        """The host's Proxmox API, over the host's own connection."""
        if self._api is None:
            self._api = proxmox_api(self.host)
        return self._api

    def choose(self, node: str, changes: Iterable[FileChange]) -> None:
        """Take the VM configs and the PCI mapping among ``changes`` that the API can write, on
        Proxmox node ``node``."""
        self.node = node
        for change in changes:
            if change.path == PCI_MAPPING and change.after is not None:
                ids = changed_ids(change.before or "", change.after)
                # One call edits one id; proxgpu's change sets edit one (--mapping NAME).
                if len(ids) == 1:
                    self.mapping = (change, ids[0])
            if not is_vm_config(change.path) or change.before is None or change.after is None:
                continue
            update = config_update(change.before, change.after)
            if update is not None:
                # Proxmox refuses the write unless the file is still what the plan was made from.
                self.updates[change.path] = {**update, "digest": config_digest(change.before)}

    def covers(self, path: str) -> bool:
        """Whether ``path`` is written through the API."""
        return path in self.updates or (self.mapping is not None and path == PCI_MAPPING)

    def write(self, path: str) -> None:
        """Send one VM config's update (one pvesh call).

        :raises PveApiError: when Proxmox refused it: it checks the digest and the guest's lock
            before it writes, so the file is as it was. Any other failure leaves it unknown
            whether the call landed; the path then stays unconfirmed.
        """
        if path == PCI_MAPPING:
            self._write_mapping()
            return
        guest = guest_of(path)
        assert guest is not None  # only VM configs and the mapping are chosen
        self.say("api", f"setting VM {guest[1]}'s options through the Proxmox API")
        self.unconfirmed.add(path)
        try:
            self.api().nodes(self.node).qemu(guest[1]).config.put(**self.updates[path])
        except PveApiError:
            self.unconfirmed.discard(path)
            raise

    def _write_mapping(self) -> None:
        assert self.mapping is not None  # covers() said so
        change, name = self.mapping
        assert change.after is not None  # choose() took only such a change
        self.say("api", f"writing PCI mapping {name} through the Proxmox API")
        self.unconfirmed.add(change.path)
        try:
            write_mapping(self.host, name, change.before, change.after)
        except MappingChangedError as exc:
            self.unconfirmed.discard(change.path)
            raise FileChangedError(
                self.host.name,
                change.path,
                f"changed while being applied: Proxmox refused mapping {name} ({exc.detail}); "
                "plan again",
            ) from exc
        except PveApiError:
            self.unconfirmed.discard(change.path)
            raise

    def confirm(self, hashes: dict[str, str]) -> None:
        """The files Proxmox wrote were read back with these hashes."""
        self.unconfirmed -= set(hashes)

    def warnings(self) -> list[str]:
        """What pvesh printed on stderr in calls that succeeded (a lock wait, a deprecation)."""
        if self._api is None:
            return []
        return [f"pvesh warned: {line}" for line in pvesh_warnings(self._api)]

    def note(self, paths: Sequence[str]) -> list[str]:
        """A line naming which of ``paths`` go through the API, if any."""
        through = [p for p in paths if p in self.updates]
        lines = (
            [f"through the Proxmox API (PUT .../config): {', '.join(through)}"] if through else []
        )
        if self.mapping is not None and PCI_MAPPING in paths:
            lines.append(
                f"through the Proxmox API ({MAPPING_API}/{self.mapping[1]}): {PCI_MAPPING}"
            )
        return lines
