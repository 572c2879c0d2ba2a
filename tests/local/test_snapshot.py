"""Snapshots: what inspection reads, written as a tree that reproduces the same inventory."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from proxgpu.errors import SysfsError, UsageError
from proxgpu.host.local import DirectoryHost, LocalHost
from proxgpu.inspection import inspect
from proxgpu.inspection.capture import gather, parse_gather_output, write_tree
from tests.support.trees import EXAMPLES, copy_example


def _without_source(inventory_json: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in inventory_json.items() if k != "source"}


def test_snapshot_of_an_example_reproduces_its_inventory(
    example_host: Path, tmp_path: Path
) -> None:
    original = DirectoryHost(str(example_host))
    write_tree(gather(original), str(tmp_path / "snap"))
    again = inspect(DirectoryHost(str(tmp_path / "snap")))
    assert _without_source(asdict(again)) == _without_source(asdict(inspect(original)))


def test_snapshot_of_this_machine_reproduces_its_inventory(tmp_path: Path) -> None:
    write_tree(gather(LocalHost()), str(tmp_path / "snap"))
    again = inspect(DirectoryHost(str(tmp_path / "snap")))
    assert _without_source(asdict(again)) == _without_source(asdict(inspect(LocalHost())))


def test_snapshot_keeps_driver_and_iommu_group_as_symlinks(tmp_path: Path) -> None:
    write_tree(gather(DirectoryHost(str(EXAMPLES / "ct200"))), str(tmp_path / "snap"))
    device = tmp_path / "snap/sys/bus/pci/devices/0000:81:00.0"
    assert (device / "driver").is_symlink()
    assert str((device / "driver").readlink()).endswith("/nvidia")
    assert str((device / "iommu_group").readlink()).endswith("/60")


def test_raw_files_keep_exact_bytes(tmp_path: Path) -> None:
    root = copy_example(tmp_path, dest="host")
    odd = b"arch: amd64\r\nlxc.cgroup2.devices.allow = c 195:0 rwm\n#no final newline"
    (root / "etc/pve/lxc/201.conf").write_bytes(odd)
    write_tree(gather(DirectoryHost(str(root))), str(tmp_path / "snap"))
    assert (tmp_path / "snap/etc/pve/lxc/201.conf").read_bytes() == odd


def test_secrets_are_never_captured(tmp_path: Path) -> None:
    root = copy_example(tmp_path, dest="host")
    for secret in (
        "etc/pve/priv/authkey.key",
        "etc/pve/priv/shadow.cfg",
        "etc/ssh/ssh_host_rsa_key",
        "root/.ssh/id_ed25519",
        "etc/pve/pve-root-ca.pem",
    ):
        (root / secret).parent.mkdir(parents=True, exist_ok=True)
        (root / secret).write_text("SECRET\n")
    write_tree(gather(DirectoryHost(str(root))), str(tmp_path / "snap"))
    captured = [p.read_bytes() for p in (tmp_path / "snap").rglob("*") if p.is_file()]
    assert not any(b"SECRET" in content for content in captured)
    assert not (tmp_path / "snap/etc/pve/priv").exists()


def test_writer_refuses_paths_outside_the_whitelist(tmp_path: Path) -> None:
    capture = parse_gather_output(
        b"#proxgpu-gather\t1\n#section\traw\netc/pve/priv/authkey.key\0U0VDUkVU\n#end\n"
    )
    with pytest.raises(SysfsError, match="refusing"):
        write_tree(capture, str(tmp_path / "snap"))


def test_snapshot_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        write_tree(gather(DirectoryHost(str(EXAMPLES / "ct200"))), str(tmp_path / "snap"))
    assert (tmp_path / "snap" / "keep.txt").read_text() == "mine"


def test_cloud_init_password_hashes_are_redacted_in_snapshots(tmp_path: Path) -> None:
    root = copy_example(tmp_path, dest="host")
    vm = root / "etc/pve/qemu-server/300.conf"
    vm.write_text(vm.read_text() + "cipassword: $5$salt$hash\n\n[snap1]\ncipassword: $5$old$hash\n")
    write_tree(gather(DirectoryHost(str(root))), str(tmp_path / "snap"))
    written = (tmp_path / "snap/etc/pve/qemu-server/300.conf").read_text()
    assert "$5$" not in written
    assert written.count("cipassword: <redacted by proxgpu>") == 2
    assert written.replace("<redacted by proxgpu>", "X") == vm.read_text().replace(
        "$5$salt$hash", "X"
    ).replace("$5$old$hash", "X"), "nothing else changes"
