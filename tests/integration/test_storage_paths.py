"""pve/storage.py against Proxmox's own code: ``PVE::Storage::path`` of pve-storage at the
pinned commit (``pve-check storage-path``), on a storage.cfg of every storage type a container's
rootfs can live on. Where Proxmox's volume is a subvolume, proxgpu names the same host directory;
every other volume (an image, a zvol, an LVM or RBD device) proxgpu says the host cannot see."""

from __future__ import annotations

import subprocess
from pathlib import Path

from proxgpu.pve.storage import HostDir, StorageConfig, Unseen, rootfs_location
from tests.support.pvevalidate import pve_check_command

STORAGE_CFG = """\
dir: bulk
\tpath /srv/bulk
\tcontent-dirs images=vm/disks
\tcontent rootdir,images

nfs: nas
\tpath /mnt/pve/nas
\tserver 10.0.0.9
\texport /tank
\tcontent rootdir,images

btrfs: fast
\tpath /mnt/fast
\tcontent rootdir,images

cifs: smb
\tpath /mnt/pve/smb
\tserver 10.0.0.8
\tshare ct
\tcontent rootdir,images

zfspool: tank
\tpool tank/ct
\tmountpoint /tank-ct
\tcontent rootdir,images

zfspool: local-zfs
\tpool rpool/data
\tcontent rootdir,images

lvmthin: local-lvm
\tvgname pve
\tthinpool data
\tcontent rootdir,images

rbd: ceph
\tpool ct
\tcontent rootdir,images
"""

VOLUMES = [
    "bulk:200/subvol-200-disk-0.subvol",
    "bulk:200/vm-200-disk-0.raw",
    "bulk:100/base-100-disk-0.subvol/203/subvol-203-disk-0.subvol",
    "nas:201/subvol-201-disk-1.subvol",
    "smb:201/subvol-201-disk-1.subvol",
    "smb:201/vm-201-disk-1.qcow2",
    "fast:202/subvol-202-disk-0.subvol",
    "fast:202/vm-202-disk-0.raw",
    "tank:subvol-204-disk-0",
    "tank:basevol-100-disk-0/subvol-205-disk-0",
    "tank:basevol-100-disk-0",
    "tank:vm-204-disk-0",
    "local-zfs:subvol-200-disk-0",
    "local:200/subvol-200-disk-0.subvol",
    "local-lvm:vm-200-disk-0",
    "ceph:vm-200-disk-0",
]


def test_subvolumes_map_where_proxmox_finds_them_and_nothing_else_does(tmp_path: Path) -> None:
    cfg, volumes = tmp_path / "storage.cfg", tmp_path / "volumes"
    cfg.write_text(STORAGE_CFG)
    volumes.write_text("".join(f"{volume}\n" for volume in VOLUMES))
    command = [*pve_check_command(), "--storage-cfg", str(cfg), "storage-path", str(volumes)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    found = [
        line.split(": ", 1)[1].split("\t")
        for line in result.stdout.splitlines()
        if line.startswith("PATH ")
    ]
    assert [volume for volume, _, _ in found] == VOLUMES
    config = StorageConfig.parse(STORAGE_CFG)
    for volume, kind, path in found:
        location = rootfs_location(config, volume, "pve1")
        if kind == "subvol":
            assert location == HostDir(path), volume
        else:
            assert isinstance(location, Unseen), (volume, path)
