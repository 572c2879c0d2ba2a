"""The storages of ``/etc/pve/storage.cfg``, and where on the host a container's root file
system lies while the container is stopped.

Proxmox keeps a container's rootfs as a volume ``STORAGE:VOLNAME``. A ZFS subvolume, or a
``.subvol`` directory on a dir, btrfs, NFS or CIFS storage, is a directory the host mounts; a
disk image or a block device (LVM, LVM-thin, Ceph RBD, zvols, ``.raw`` files) is not, and the host
sees no files in it unless the container runs. This module only reads text; it opens nothing.

>>> cfg = StorageConfig.parse("zfspool: local-zfs\\n\\tpool rpool/data\\n\\tcontent rootdir\\n")
>>> rootfs_location(cfg, "local-zfs:subvol-200-disk-0,size=8G", "pve1")
HostDir(path='/rpool/data/subvol-200-disk-0')
>>> rootfs_location(cfg, "local-lvm:vm-200-disk-0", "pve1").reason
"storage 'local-lvm' is not in /etc/pve/storage.cfg"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from proxgpu.pve.config import parse_property_string

#: Where Proxmox keeps the cluster's storage definitions.
STORAGE_CFG = "/etc/pve/storage.cfg"

# pve-common SectionConfig: comments anywhere, a ``TYPE: ID`` header, indented ``key value``
# properties; pve-storage lowercases the type and checks the ID (Plugin.pm parse_section_header).
_COMMENT_RE = re.compile(r"\s*#", re.ASCII)
_HEADER_RE = re.compile(r"(\S+):\s*(\S+)\s*", re.ASCII)
_PROPERTY_RE = re.compile(r"\s+(\S+)(?:\s+(.*\S))?\s*", re.ASCII)
_STORAGE_ID_RE = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]", re.ASCII | re.IGNORECASE)
# PVE::Storage::parse_volume_id.
_VOLUME_ID_RE = re.compile(r"([a-z][a-z0-9\-_.]*[a-z0-9]):(.+)", re.ASCII | re.IGNORECASE | re.S)
# ZFSPoolPlugin parse_volname: an optional base (linked clones), then the volume's own name.
_ZFS_VOLNAME_RE = re.compile(r"(?:(?:base|basevol)-\d+-\S+/)?((base|basevol|vm|subvol)-\d+-\S+)")
# Plugin.pm parse_volname for images: ``VMID/NAME`` or ``BASEVMID/BASENAME/VMID/NAME``.
_DIR_VOLNAME_RE = re.compile(r"(?:\d+/\S+/)?(\d+)/(\S+)", re.ASCII)
# Plugin.pm parse_name_dir: the format is the file name's suffix.
_DIR_NAME_RE = re.compile(r"[^/\s]+\.(raw|qcow2|vmdk|subvol)", re.ASCII)
# PVE::Tools::split_list.
_LIST_SEP_RE = re.compile(r"[\0\s,;]+")
# PVE::JSONSchema::parse_boolean's false spellings; a bare ``disable`` line means true.
_FALSE = frozenset(("0", "no", "off", "false"))

#: The storage types whose container volumes the host mounts as directories.
_DIRECTORY_TYPES = frozenset(("dir", "btrfs", "nfs", "cifs"))
#: Why the host sees no files of a container on a storage of each other known type.
_OPAQUE_TYPES = {
    "lvm": "an LVM logical volume (a block device)",
    "lvmthin": "an LVM-thin volume (a block device)",
    "rbd": "a Ceph RBD image (a block device)",
    "zfs": "a ZFS-over-iSCSI volume (a remote block device)",
    "iscsi": "an iSCSI LUN (a block device)",
    "iscsidirect": "an iSCSI LUN (a block device)",
    "cephfs": "a CephFS storage, which holds no container volumes",
    "pbs": "a Proxmox Backup Server storage, which holds no container volumes",
    "esxi": "an ESXi import storage, which holds no container volumes",
}


@dataclass(frozen=True)
class Storage:
    """One storage of ``storage.cfg``: its ID, its type and its properties as written (a key
    without a value reads as ``""``).

    >>> Storage("nas", "nfs", {"path": "/mnt/pve/nas", "nodes": "pve1,pve2"}).on("pve3")
    False
    """

    storage_id: str
    kind: str
    props: Mapping[str, str] = field(default_factory=dict)

    def on(self, node: str) -> bool:
        """Whether the storage exists on ``node``: no ``nodes`` list means every node."""
        nodes = self.props.get("nodes")
        return nodes is None or node in _split_list(nodes)

    @property
    def disabled(self) -> bool:
        """Whether ``disable`` switches the storage off.

        >>> Storage("a", "dir", {"path": "/a", "disable": ""}).disabled
        True
        """
        disable = self.props.get("disable")
        return disable is not None and disable.lower() not in _FALSE

    def images_dir(self) -> str | None:
        """The directory holding the ``images`` volumes of a dir-like storage (``content-dirs``
        may move it below ``path``), or ``None`` when the storage has no ``path``.

        >>> Storage("a", "dir", {"path": "/srv", "content-dirs": "images=vm"}).images_dir()
        '/srv/vm'
        """
        path = self.props.get("path")
        if not path:
            return None
        overrides = dict(
            item.split("=", 1)
            for item in _split_list(self.props.get("content-dirs", ""))
            if "=" in item
        )
        return f"{path}/{overrides.get('images', 'images')}"


@dataclass(frozen=True)
class StorageConfig:
    """The storages ``storage.cfg`` defines, read the way Proxmox reads it: comments anywhere,
    a blank line ends a section, a header that names no valid storage ID skips its section, the
    first of a repeated property counts, and ``local`` is always the dir storage at
    ``/var/lib/vz`` on every node (pve-storage replaces any other ``local``).

    >>> cfg = StorageConfig.parse("dir: local\\n\\tpath /srv\\n\\tnodes pve9\\n")
    >>> cfg.storages["local"]
    Storage(storage_id='local', kind='dir', props={'path': '/var/lib/vz'})
    """

    storages: Mapping[str, Storage]

    @classmethod
    def parse(cls, text: str) -> StorageConfig:
        """Read the text of ``storage.cfg``; nothing in it is an error, as for Proxmox, which
        warns and skips what it cannot read."""
        storages: dict[str, Storage] = {}
        lines = iter(line for line in text.split("\n") if not _COMMENT_RE.match(line))
        for line in lines:
            header = _HEADER_RE.fullmatch(line)
            if header is None:
                continue  # a stray line outside a section: Proxmox ignores it
            props: dict[str, str] = {}
            # SectionConfig reads properties until a line Perl takes as false: "" or "0".
            for prop in iter(lambda: next(lines, ""), ""):
                if prop == "0":
                    break
                match = _PROPERTY_RE.fullmatch(prop)
                if match:
                    props.setdefault(match[1], match[2] or "")
            kind, storage_id = header[1].lower(), header[2]
            if _STORAGE_ID_RE.fullmatch(storage_id):
                storages[storage_id] = Storage(storage_id, kind, props)
        storages["local"] = _local(storages.get("local"))
        return cls(storages)


@dataclass(frozen=True)
class HostDir:
    """The host directory that holds a container's root file system."""

    path: str


@dataclass(frozen=True)
class Unseen:
    """Why the host sees no files of a container's root file system while it is stopped."""

    reason: str


def rootfs_location(config: StorageConfig, rootfs: str, node: str) -> HostDir | Unseen:
    """Where on ``node`` the host sees the files of the volume a container's ``rootfs:`` (or
    ``mpN:``) line names, as ``PVE::Storage::path`` finds it.

    >>> cfg = StorageConfig.parse("")
    >>> rootfs_location(cfg, "local:200/subvol-200-disk-0.subvol", "pve1")
    HostDir(path='/var/lib/vz/images/200/subvol-200-disk-0.subvol')
    >>> rootfs_location(cfg, "local:200/vm-200-disk-0.raw,size=8G", "pve1").reason
    "volume 'local:200/vm-200-disk-0.raw' is a raw disk image"
    >>> rootfs_location(cfg, "/srv/ct200", "pve1")
    HostDir(path='/srv/ct200')
    """
    try:
        volume = parse_property_string(rootfs, default_key="volume").get("volume", "")
    except ValueError:
        return Unseen(f"{rootfs!r} is no volume Proxmox can read")
    if volume.startswith("/dev/"):
        return Unseen(f"{volume} is a block device")
    if volume.startswith("/"):
        return HostDir(volume)  # a bind mount of a host directory
    match = _VOLUME_ID_RE.fullmatch(volume)
    if match is None:
        return Unseen(f"{volume!r} is no volume ID")
    storage = config.storages.get(match[1])
    if storage is None:
        return Unseen(f"storage {match[1]!r} is not in {STORAGE_CFG}")
    if not storage.on(node):
        return Unseen(f"storage {storage.storage_id!r} is not on node {node}")
    if storage.disabled:
        return Unseen(f"storage {storage.storage_id!r} is disabled")
    return _volume_path(storage, volume, match[2])


def _volume_path(storage: Storage, volume: str, volname: str) -> HostDir | Unseen:
    if storage.kind == "zfspool":
        return _zfs_path(storage, volume, volname)
    if storage.kind in _DIRECTORY_TYPES:
        return _dir_path(storage, volume, volname)
    opaque = _OPAQUE_TYPES.get(storage.kind)
    if opaque is not None:
        return Unseen(f"volume {volume!r} is {opaque}")
    return Unseen(f"storage {storage.storage_id!r} has type {storage.kind!r}, unknown to proxgpu")


def _zfs_path(storage: Storage, volume: str, volname: str) -> HostDir | Unseen:
    match = _ZFS_VOLNAME_RE.fullmatch(volname)
    pool = storage.props.get("pool")
    if match is None or not pool:
        return Unseen(f"volume {volume!r} is no ZFS volume Proxmox can read")
    if match[2] in ("vm", "base"):
        return Unseen(f"volume {volume!r} is a zvol (a block device)")
    return HostDir(f"{storage.props.get('mountpoint') or '/' + pool}/{match[1]}")


def _dir_path(storage: Storage, volume: str, volname: str) -> HostDir | Unseen:
    match = _DIR_VOLNAME_RE.fullmatch(volname)
    name = _DIR_NAME_RE.fullmatch(match[2]) if match else None
    images = storage.images_dir()
    if match is None or name is None or images is None:
        return Unseen(f"volume {volume!r} is no disk Proxmox can read")
    if name[1] != "subvol":
        return Unseen(f"volume {volume!r} is a {name[1]} disk image")
    return HostDir(f"{images}/{match[1]}/{match[2]}")


def _split_list(text: str) -> list[str]:
    return [item for item in _LIST_SEP_RE.split(text) if item]


def _local(local: Storage | None) -> Storage:
    """pve-storage's ``local``: a dir storage at /var/lib/vz on every node, keeping the other
    properties of a ``local`` already so; any other ``local`` is replaced."""
    if (
        local is None
        or local.kind != "dir"
        or local.props.get("path", "/var/lib/vz")
        not in (
            "",
            "/var/lib/vz",
        )
    ):
        return Storage("local", "dir", {"path": "/var/lib/vz"})
    props = {k: v for k, v in local.props.items() if k != "nodes"}
    return Storage("local", "dir", {**props, "path": "/var/lib/vz"})
