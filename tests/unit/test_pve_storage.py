"""Tests for proxgpu.pve.storage: storage.cfg read as Proxmox's SectionConfig reads it, and the
host directory (or the reason there is none) of each kind of container volume."""

from __future__ import annotations

import pytest

from proxgpu.pve.storage import HostDir, Storage, StorageConfig, Unseen, rootfs_location
from tests.support.pvevalidate import STORAGE_CFG

NAS = """\
# the cluster's storages
dir: bulk
\tpath /srv/bulk
\tcontent-dirs images=vm/disks
\tcontent rootdir,images

nfs: nas
 \tpath /mnt/pve/nas
\tserver 10.0.0.9
\texport /tank
\tnodes pve1, pve2
\tcontent rootdir

btrfs: fast
\tpath /mnt/fast
\tcontent rootdir

cifs: smb
\tpath /mnt/pve/smb
\tdisable

zfspool: tank
\tpool tank/ct
\tmountpoint /tank-ct

rbd: ceph
\tpool ct

mystery: other
\tpath /srv/other
"""


def test_a_fresh_install_maps_zfs_subvolumes_and_not_lvm_thin() -> None:
    cfg = StorageConfig.parse(STORAGE_CFG)
    assert sorted(cfg.storages) == ["local", "local-lvm", "local-zfs"]
    assert rootfs_location(cfg, "local-zfs:subvol-200-disk-0,size=8G", "pve1") == HostDir(
        "/rpool/data/subvol-200-disk-0"
    )
    unseen = rootfs_location(cfg, "local-lvm:vm-200-disk-0,size=8G", "pve1")
    assert unseen == Unseen(
        "volume 'local-lvm:vm-200-disk-0' is an LVM-thin volume (a block device)"
    )


@pytest.mark.parametrize(
    ("rootfs", "path"),
    [
        ("bulk:200/subvol-200-disk-0.subvol", "/srv/bulk/vm/disks/200/subvol-200-disk-0.subvol"),
        (
            "nas:201/subvol-201-disk-1.subvol,size=0",
            "/mnt/pve/nas/images/201/subvol-201-disk-1.subvol",
        ),
        ("fast:202/subvol-202-disk-0.subvol", "/mnt/fast/images/202/subvol-202-disk-0.subvol"),
        # A linked clone names its base first; the container's own volume is the last two parts.
        (
            "bulk:100/base-100-disk-0.subvol/203/subvol-203-disk-0.subvol",
            "/srv/bulk/vm/disks/203/subvol-203-disk-0.subvol",
        ),
        ("tank:subvol-204-disk-0", "/tank-ct/subvol-204-disk-0"),
        ("tank:basevol-100-disk-0/subvol-205-disk-0", "/tank-ct/subvol-205-disk-0"),
        ("tank:basevol-100-disk-0", "/tank-ct/basevol-100-disk-0"),
        ("volume=tank:subvol-206-disk-0,acl=1", "/tank-ct/subvol-206-disk-0"),
        ("/srv/ct207", "/srv/ct207"),
    ],
)
def test_directory_volumes_map_where_proxmox_keeps_them(rootfs: str, path: str) -> None:
    assert rootfs_location(StorageConfig.parse(NAS), rootfs, "pve1") == HostDir(path)


@pytest.mark.parametrize(
    ("rootfs", "reason"),
    [
        (
            "bulk:200/vm-200-disk-0.raw,size=8G",
            "volume 'bulk:200/vm-200-disk-0.raw' is a raw disk image",
        ),
        ("fast:200/vm-200-disk-0.raw", "volume 'fast:200/vm-200-disk-0.raw' is a raw disk image"),
        (
            "bulk:200/vm-200-disk-0.qcow2",
            "volume 'bulk:200/vm-200-disk-0.qcow2' is a qcow2 disk image",
        ),
        ("tank:vm-200-disk-0", "volume 'tank:vm-200-disk-0' is a zvol (a block device)"),
        ("ceph:vm-200-disk-0", "volume 'ceph:vm-200-disk-0' is a Ceph RBD image (a block device)"),
        ("nas:200/subvol-200-disk-0.subvol", "storage 'nas' is not on node pve3"),
        ("smb:200/subvol-200-disk-0.subvol", "storage 'smb' is disabled"),
        (
            "other:200/subvol-200-disk-0.subvol",
            "storage 'other' has type 'mystery', unknown to proxgpu",
        ),
        ("gone:subvol-200-disk-0", "storage 'gone' is not in /etc/pve/storage.cfg"),
        ("/dev/sdb1", "/dev/sdb1 is a block device"),
        (
            "bulk:200/../../etc.subvol",
            "volume 'bulk:200/../../etc.subvol' is no disk Proxmox can read",
        ),
        ("tank:../../etc", "volume 'tank:../../etc' is no ZFS volume Proxmox can read"),
        ("size=8G", "'' is no volume ID"),
        ("a,a", "'a,a' is no volume Proxmox can read"),
    ],
)
def test_the_host_sees_no_files_of_images_and_block_devices(rootfs: str, reason: str) -> None:
    assert rootfs_location(StorageConfig.parse(NAS), rootfs, "pve3") == Unseen(reason)


def test_section_config_rules() -> None:
    text = (
        "zfspool:  a1\n\tpool p/one\n  # a comment inside a section does not end it\n"
        "\tpool p/two\n"
        "not indented: ignored\n\n"
        "dir: 9bad-\n\tpath /x\n\n"
        "Dir: b1\n\tpath /b   \n\n"
        "nothing here\n"
        "zfspool: c1\n0\n\tpool ignored\n"
    )
    cfg = StorageConfig.parse(text)
    # The first of a repeated property counts; a non-indented line inside a section is no
    # property; an invalid ID skips its section; the type is read in lower case; a line "0"
    # ends a section as a blank one does (Perl takes it as false).
    assert cfg.storages["a1"].props == {"pool": "p/one"}
    assert "9bad-" not in cfg.storages
    assert cfg.storages["b1"] == Storage("b1", "dir", {"path": "/b"})
    assert cfg.storages["c1"].props == {}
    # A blank line ended c1's section, so its "pool" line belongs to no section.
    assert set(cfg.storages) == {"a1", "b1", "c1", "local"}


@pytest.mark.parametrize(
    ("text", "props"),
    [
        ("", {"path": "/var/lib/vz"}),
        (
            "dir: local\n\tpath /var/lib/vz\n\tnodes pve9\n\tcontent-dirs images=x\n",
            {"path": "/var/lib/vz", "content-dirs": "images=x"},
        ),
        (
            "dir: local\n\tcontent-dirs images=x\n",
            {"content-dirs": "images=x", "path": "/var/lib/vz"},
        ),
        ("zfspool: local\n\tpool rpool\n", {"path": "/var/lib/vz"}),
        ("dir: local\n\tpath /elsewhere\n", {"path": "/var/lib/vz"}),
    ],
)
def test_local_is_always_the_dir_at_var_lib_vz_on_every_node(
    text: str, props: dict[str, str]
) -> None:
    local = StorageConfig.parse(text).storages["local"]
    assert (local.kind, dict(local.props)) == ("dir", props)
    assert local.on("any-node")


def test_zfs_without_mountpoint_is_assumed_mounted_at_the_pool_name() -> None:
    cfg = StorageConfig.parse("zfspool: zz\n\tpool tank/ct\n")
    assert rootfs_location(cfg, "zz:subvol-1-disk-0", "n") == HostDir("/tank/ct/subvol-1-disk-0")


def test_disable_reads_as_proxmox_booleans() -> None:
    assert not Storage("a", "dir", {"disable": "0"}).disabled
    assert not Storage("a", "dir", {"disable": "off"}).disabled
    assert Storage("a", "dir", {"disable": "1"}).disabled
    assert not Storage("a", "dir", {}).disabled
