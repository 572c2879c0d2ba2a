"""VM options through the Proxmox API (proxgpu.apply.vmapi), against a stand-in pvesh.

pvesh is not installable here. Where a live host must take a VM's options through the Proxmox
API, the stand-in ``pvesh`` of ``tests/support/standins.py`` goes first on PATH (``bin_dir``). It
answers only the two calls apply makes, the status query (the ``{"status": ...}`` object of the
Proxmox API) and ``set .../qemu/<vmid>/config``, which it carries out the way qemu-server does it:
``delete`` and ``digest`` honoured, a stale digest refused with a ``400 Parameter verification
failed`` on stderr and a non-zero exit, the file rewritten in Proxmox's own order (description,
then the main keys sorted, then the other sections) through a temp file and a rename.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.apply.journal import history
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.apply.verify import verify
from proxgpu.errors import ApplyError, HostUnreachableError
from proxgpu.host.local import DirectoryHost, LocalHost
from proxgpu.inspection import inspect
from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy
from proxgpu.pve.api import config_digest, same_config
from proxgpu.rendering import render
from proxgpu.rendering.changes import FileChange
from tests.support.faults import drop_after
from tests.support.standins import fake_tool, on_path, pvesh_calls
from tests.support.trees import LXC, VM, changeset, sha256, snapshot, text


def node() -> str:
    """This machine's Proxmox node name, which a LocalHost's pvesh calls use."""
    return os.uname().nodename.split(".")[0]


def set_calls(bin_dir: Path) -> list[tuple[str, dict[str, str]]]:
    """The ``pvesh set`` calls made: (API path, options)."""
    return [
        (call[1], dict(zip(call[2::2], call[3::2], strict=True)))
        for call in pvesh_calls(bin_dir)
        if call[0] == "set"
    ]


def test_a_vm_config_goes_through_the_api_and_a_container_config_as_a_file(
    root: Path, bin_dir: Path, live_host: LocalHost
) -> None:
    original = snapshot(root)
    cs = changeset(root)
    vm = cs.files[1]
    assert vm.path == VM and vm.before is not None and vm.after is not None
    result = apply_changes(live_host, cs)
    assert set_calls(bin_dir) == [
        (
            f"/nodes/{node()}/qemu/300/config",
            {
                "-hostpci0": "0000:81:00,pcie=1",
                "-digest": config_digest(vm.before),
                "--output-format": "json",
            },
        )
    ], "one PUT with the changed key and the digest of the file it was planned from"
    assert f"through the Proxmox API (PUT .../config): {VM}" in result.messages
    # The stand-in, like Proxmox, wrote the keys in its own order.
    now = text(root, VM)
    assert now is not None and now != vm.after and same_config(now, vm.after)
    assert now.index("hostpci0:") < now.index("machine:")
    assert text(root, LXC) == cs.files[0].after, "raw lxc.* keys: written as a file"
    assert live_host.commands_run == 7, "lock+read, 2 guest statuses, stage, PUT, commit, finish"
    [entry] = history(live_host)
    files = {f.path: f for f in entry.files}
    assert (files[VM].via, files[LXC].via) == ("api", "file")
    assert files[VM].sha256_after == sha256(root, VM), "the hash of what Proxmox wrote"
    assert not verify(live_host, entry).drifted
    again = apply_changes(live_host, cs)
    assert not again.changed, "the reordered file is recognised as already applied"
    assert len(set_calls(bin_dir)) == 1
    assert rollback(live_host).files
    assert snapshot(root) == original, "the VM config is restored byte for byte"


def test_what_pvesh_warns_about_is_shown_once(
    root: Path, bin_dir: Path, live_host: LocalHost
) -> None:
    # pvesh prints a line on stderr while it waits for a guest's lock, and succeeds.
    (bin_dir / "pvesh").rename(bin_dir / "pvesh-stand-in")
    fake_tool(
        bin_dir,
        "pvesh",
        'echo "trying to acquire lock..." >&2\nexec "${0%/*}/pvesh-stand-in" "$@"\n',
    )
    result = apply_changes(live_host, changeset(root))
    assert len(pvesh_calls(bin_dir)) == 3, "two guest statuses and one PUT, each warned"
    assert [m for m in result.messages if m.startswith("pvesh")] == [
        "pvesh warned: trying to acquire lock..."
    ]
    rollback(live_host)
    dry = apply_changes(live_host, changeset(root), options=ApplyOptions(dry_run=True))
    assert dry.messages[-1] == "pvesh warned: trying to acquire lock..."


def test_a_directory_tree_writes_vm_configs_as_files(root: Path, bin_dir: Path) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root)
    apply_changes(host, cs)
    assert pvesh_calls(bin_dir) == [] and text(root, VM) == cs.files[1].after
    assert {f.via for f in history(host)[0].files} == {"file"}


def test_without_pvesh_a_vm_config_is_written_as_a_file(root: Path) -> None:
    assert shutil.which("pvesh") is None
    host = LocalHost(str(root))
    cs = changeset(root)
    apply_changes(host, cs, options=ApplyOptions(skip_guest_check=True))
    assert text(root, VM) == cs.files[1].after


def test_a_stale_digest_is_refused_by_proxmox_and_everything_is_restored(
    root: Path, bin_dir: Path, live_host: LocalHost
) -> None:
    second = "/etc/pve/qemu-server/301.conf"
    vm = text(root, VM)
    assert vm is not None
    (root / second.lstrip("/")).write_text(vm.replace("name: train", "name: eval"))
    cs = changeset(root)
    before = text(root, second)
    assert before is not None
    cs = cs.model_copy(
        update={
            "files": [
                *cs.files,
                FileChange(path=second, before=before, after=before + "numa: 1\n"),
            ]
        }
    )
    edit = before + "description: edited in the GUI meanwhile\n"

    def meddle(step: str, message: str) -> None:
        if step == "api" and "VM 301" in message:
            (root / second.lstrip("/")).write_text(edit)

    original = snapshot(root, ignore=(second.lstrip("/"),))
    with pytest.raises(ApplyError, match="every file was restored from the backup") as err:
        apply_changes(live_host, cs, progress=meddle)
    assert (
        f"PUT /nodes/{node()}/qemu/301/config: 400 Parameter verification failed: digest: "
        "detected modified configuration - file changed by other user? Try again."
    ) in str(err.value)
    assert err.value.restored
    assert [path for path, _ in set_calls(bin_dir)] == [
        f"/nodes/{node()}/qemu/300/config",
        f"/nodes/{node()}/qemu/301/config",
    ], "VM 300 was written through the API before 301 was refused"
    assert snapshot(root, ignore=(second.lstrip("/"),)) == original, "VM 300 is back too"
    assert text(root, second) == edit, "the concurrent edit Proxmox refused to overwrite stays"
    assert not list(root.rglob("*.proxgpu-*.tmp"))
    [entry] = history(live_host)
    assert entry.status == "failed" and "digest" in entry.message


def test_a_connection_lost_after_an_api_write_is_recovered_by_rollback(
    root: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = LocalHost(str(root))
    cs = changeset(root)
    original = snapshot(root)
    # lock+read, two guest statuses, stage, PUT: the connection is gone before the read-back.
    drop_after(monkeypatch, host, 5)
    with pytest.raises((ApplyError, HostUnreachableError), match="connection lost"):
        apply_changes(host, cs)
    assert len(set_calls(bin_dir)) == 1
    now = text(root, VM)
    assert now is not None and now != cs.files[1].after, "Proxmox's rewrite, never read back"
    fresh = LocalHost(str(root))
    assert [e.status for e in history(fresh)] == ["in-progress"]
    rollback(fresh)
    assert snapshot(root) == original


def test_a_second_plan_after_an_api_write_changes_nothing(
    root: Path, bin_dir: Path, live_host: LocalHost
) -> None:
    for tool in ("update-initramfs", "proxmox-boot-tool", "update-grub", "systemctl"):
        fake_tool(bin_dir, tool, "exit 0\n")  # the post-actions must not touch this machine
    policy = SplitPolicy(lxc=200, vms=[(300, None)])
    inventory = inspect(DirectoryHost(str(root)))
    plan = plan_split(inventory, policy)
    changes = render(inventory, plan)
    [vm] = [f for f in changes.files if f.path == VM]
    assert vm.changed and vm.after is not None
    apply_changes(live_host, changes, plan=plan)
    assert set_calls(bin_dir), "the VM's options went through the API"
    reordered = text(root, VM)
    assert reordered is not None and reordered != vm.after, "Proxmox wrote its own order"
    again = inspect(DirectoryHost(str(root)))
    second = render(again, plan_split(again, policy))
    assert not second.changed, [f.path for f in second.changed_files()]
    assert next(f for f in second.files if f.path == VM).after == reordered
    assert not apply_changes(live_host, second, plan=plan).changed


def test_an_api_write_that_pvesh_answers_without_writing_is_not_believed(
    root: Path, bin_dir: Path, live_host: LocalHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pvesh (or a wrapper in its place) that answers the PUT with exit 0 and writes nothing
    leaves the config as it was, which the commit's read-back shows: the apply fails and puts
    everything back, never "files written"."""
    original = snapshot(root)
    # Before the stand-in on PATH: every call but the PUT goes on to it.
    liar = bin_dir.parent / "liar"
    fake_tool(liar, "pvesh", f'[ "$1" = set ] && exit 0\nexec {bin_dir}/pvesh "$@"\n')
    on_path(monkeypatch, liar)
    with pytest.raises(ApplyError) as failed:
        apply_changes(live_host, changeset(root))
    message = str(failed.value)
    assert f"the host did not finish the config write through the API ({VM}) step" in message
    assert "every file was restored from the backup" in message
    assert snapshot(root) == original
    assert [e.status for e in history(live_host)] == ["failed"]
