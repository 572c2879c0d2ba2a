"""The write path loses nothing: rollback at the granularity verify judges, paths confined to the
root, the lock, durability of each step's own files, hostile host data and big configs.

Everything runs the real shell scripts on real files in a copy of an example host
(``DirectoryHost``). The one stand-in is a failing ``mv`` (see ``failing_mv``): no real
filesystem here can be made to refuse one rename and not the others.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions, apply_changes, history, read_journal, rollback, verify
from proxgpu.errors import (
    ConcurrentApplyError,
    FileChangedError,
    HostUnreachableError,
    JournalError,
    PreflightError,
    RenderError,
    SysfsError,
)
from proxgpu.host import DirectoryHost, LocalHost, connect
from proxgpu.inspection import inspect
from proxgpu.pipeline import propose
from proxgpu.planning import SplitPolicy
from proxgpu.rendering.changes import ChangeSet, FileChange
from tests.support.faults import drop_after
from tests.support.trees import changeset, contents, copy_example, tree_bytes

POLICY = SplitPolicy(lxc=200, vms=[(300, None)])
VM = "etc/pve/qemu-server/300.conf"
LXC = "etc/pve/lxc/200.conf"
LOCK = "run/lock/proxgpu"


def applied(root: Path) -> str:
    """Apply the ct200 split to the tree at ``root``; return the journal id."""
    with DirectoryHost(str(root)) as host:
        proposal = propose(host, POLICY)
        plan, changes = proposal.plan, proposal.changes
        result = apply_changes(host, changes, plan=plan)
    assert result.journal_id is not None
    return result.journal_id


def snapshot_vm(root: Path) -> str:
    """What `qm snapshot 300 before-upgrade` does to the config: ``parent:`` and a section."""
    config = root / VM
    text = config.read_text()
    snap = "\n[before-upgrade]\n" + text.replace("#", "#snap ", 1) + "snaptime: 1764500000\n"
    config.write_text("parent: before-upgrade\n" + text + snap)
    return config.read_text()


# --- rollback undoes what the apply changed, and keeps what came later --------------------------


def test_rollback_keeps_a_snapshot_taken_after_the_apply(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    original = (root / VM).read_text()
    journal_id = applied(root)
    with_snapshot = snapshot_vm(root)
    with DirectoryHost(str(root)) as host:
        entry = next(e for e in history(host) if e.id == journal_id)
        # Before the reboot the drivers are not yet as planned; the files are exactly so.
        assert [line for line in verify(host, entry).drift if ".conf" in line] == []
        result = rollback(host)
    now = (root / VM).read_text()
    assert "[before-upgrade]" in now and "parent: before-upgrade" in now
    assert "hostpci" not in now.split("[before-upgrade]")[0], "the apply's entries are undone"
    # The snapshot section is exactly as qm wrote it, and the rest is the original config.
    assert now.split("\n[before-upgrade]")[1] == with_snapshot.split("\n[before-upgrade]")[1]
    assert now.split("\n[before-upgrade]")[0] == "parent: before-upgrade\n" + original
    assert any("what changed since is kept" in m for m in result.messages)


def test_rollback_refuses_naming_an_entry_of_the_apply_changed_since(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    applied(root)
    config = root / VM
    text = config.read_text()
    assert "numa: 1" in text
    config.write_text(text.replace("numa: 1", "numa: 0"))
    before = tree_bytes(root)
    with DirectoryHost(str(root)) as host, pytest.raises(FileChangedError) as refused:
        rollback(host)
    assert "/etc/pve/qemu-server/300.conf" in str(refused.value)
    assert 'numa is now "0"' in str(refused.value)
    assert tree_bytes(root) == before, "a refused rollback writes nothing"


def test_rollback_of_a_container_keeps_lines_added_later(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    original = (root / LXC).read_text()
    applied(root)
    config = root / LXC
    config.write_text(config.read_text() + "lxc.apparmor.profile: unconfined\n")
    with DirectoryHost(str(root)) as host:
        rollback(host)
    assert config.read_text() == original + "lxc.apparmor.profile: unconfined\n"


# --- paths never leave the root -------------------------------------------------------------------


def test_a_journal_path_with_dot_dot_is_unreadable_not_followed(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    journal_id = applied(root)
    victim = tmp_path / "outside.txt"
    victim.write_text("keep me\n")
    entry = root / "var/lib/proxgpu/journal" / f"{journal_id}.json"
    escape = "/" + "/".join([".."] * 8) + str(victim)
    entry.write_text(
        entry.read_text().replace('"/etc/modprobe.d/00-proxgpu-vfio.conf"', f'"{escape}"')
    )
    with DirectoryHost(str(root)) as host:
        journal = read_journal(host)
        assert journal.entries == [] and "not a plain absolute path" in str(journal.unreadable)
        with pytest.raises(JournalError, match="not a plain absolute path"):
            rollback(host, options=ApplyOptions(force=True), to=journal_id)
        # Nor is it passed over for "nothing to roll back": it is the newest entry.
        with pytest.raises(JournalError, match="it is the journal's newest entry"):
            rollback(host)
    assert victim.read_text() == "keep me\n"


def test_apply_refuses_a_tree_whose_directory_links_outside(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(root / "etc/modprobe.d")
    (root / "etc/modprobe.d").symlink_to(elsewhere)
    with DirectoryHost(str(root)) as host:
        proposal = propose(host, POLICY)
        plan, changes = proposal.plan, proposal.changes
        with pytest.raises(PreflightError, match="outside") as refused:
            apply_changes(host, changes, plan=plan)
    assert "/etc/modprobe.d/00-proxgpu-vfio.conf" in str(refused.value)
    assert list(elsewhere.iterdir()) == []
    assert not (root / LOCK).exists(), "the lock is released after a refusal"


def test_any_spelling_of_slash_is_the_live_host() -> None:
    for spelling in ("/", "//", "/.", "/etc/.."):
        host = connect(root=spelling)
        assert isinstance(host, LocalHost) and host.is_live and host.root == "/", spelling


# --- the lock ---------------------------------------------------------------------------------


def failing_mv(tmp_path: Path) -> dict[str, str]:
    """A PATH whose ``mv`` refuses to move the lock away, as a read-only /run would.

    Stand-in: no filesystem here can be made to refuse that one rename and allow the others.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real = shutil.which("mv")
    (bin_dir / "mv").write_text(
        "#!/bin/sh\n"
        'for a; do case $a in *.released.*) echo "mv: Read-only file system" >&2; exit 1;; '
        "esac; done\n"
        f'exec {real} "$@"\n'
    )
    (bin_dir / "mv").chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_a_lock_that_cannot_be_released_does_not_undo_the_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = copy_example(tmp_path)
    for name, value in failing_mv(tmp_path).items():
        monkeypatch.setenv(name, value)
    with DirectoryHost(str(root)) as host:
        proposal = propose(host, POLICY)
        plan, changes = proposal.plan, proposal.changes
        result = apply_changes(host, changes, plan=plan)
        assert [e.status for e in history(host)] == ["applied"]
    assert "numa: 1" in (root / VM).read_text(), "the files stay applied"
    assert any("--break-lock" in m for m in result.messages)
    assert (root / LOCK / "owner").exists(), "the lock stayed"
    monkeypatch.undo()
    # Left by this very process, which no longer applies: stale, so the next command takes it.
    with DirectoryHost(str(root)) as host:
        back = rollback(host)
    assert any("took over" in m for m in back.messages)
    assert "numa: 1" not in (root / VM).read_text()
    assert not (root / LOCK).exists()


def test_an_ownerless_lock_is_broken_with_a_message(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    (root / LOCK / "leftover").mkdir(parents=True)
    with DirectoryHost(str(root)) as host:
        proposal = propose(host, POLICY)
        plan, changes = proposal.plan, proposal.changes
        with pytest.raises(ConcurrentApplyError, match=r"no owner file.*--break-lock"):
            apply_changes(host, changes, plan=plan)
        result = apply_changes(host, changes, options=ApplyOptions(break_lock=True), plan=plan)
    assert result.changed and any("took over" in m for m in result.messages)
    assert not (root / LOCK).exists()


def test_a_lock_left_by_a_zombie_process_of_this_machine_is_stale(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # never waited for: a zombie
    stat = Path(f"/proc/{zombie.pid}/stat")
    deadline = time.monotonic() + 10
    while stat.read_text().rpartition(")")[2].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    lock = root / LOCK
    lock.mkdir(parents=True)
    (lock / "owner").write_text(
        f"id=20260101T000000.000000Z-dead\nop=apply\nclient={socket.gethostname()}\n"
        f"pid={zombie.pid}\nuser=root\nsince=2026-01-01T00:00:00+00:00\n"
    )
    try:
        with DirectoryHost(str(root)) as host:
            result = rollback(host)
    finally:
        zombie.wait()
    assert result.journal_id is None
    assert any("had written nothing" in m for m in result.messages)
    assert not lock.exists()


# --- the journal ------------------------------------------------------------------------------


def test_one_corrupt_journal_file_hides_no_other_entry(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    journal_id = applied(root)
    (root / "var/lib/proxgpu/journal/20000101T000000.000000Z-bad0.json").write_text("{cut sh")
    with DirectoryHost(str(root)) as host:
        journal = read_journal(host)
        assert [e.id for e in journal.entries] == [journal_id]
        assert list(journal.unreadable) == [
            f"{root}/var/lib/proxgpu/journal/20000101T000000.000000Z-bad0.json"
        ]
        assert rollback(host).journal_id == journal_id


def test_rollback_with_nothing_to_roll_back_is_not_a_failure(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    with DirectoryHost(str(root)) as host:
        result = rollback(host)
    assert result.journal_id is None and "nothing to roll back" in result.messages[-1]


# --- hostile host data --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "content", "message"),
    [
        ("sys/devices/system/node/node0/cpulist", "0-99999999999\n", "beyond any real machine"),
        ("sys/devices/system/node/node0/cpulist", "zero-three\n", "bad cpulist"),
        ("sys/bus/pci/devices/0000:81:00.0/numa_node", "7\n", "names NUMA node 7"),
        (
            "proc/driver/nvidia/gpus/0000:11:00.0/information",
            "Model: X\nDevice Minor: 0\nBus Location: 0000:11:00.0\n",
            "also that of 0000:01:00.0",
        ),
        (
            "proc/driver/nvidia/gpus/0000:11:00.0/information",
            "Model: X\nDevice Minor: 4096\nBus Location: 0000:11:00.0\n",
            "beyond /dev/nvidia254",
        ),
    ],
)
def test_host_data_that_cannot_be_is_refused_naming_the_file(
    tmp_path: Path, path: str, content: str, message: str
) -> None:
    root = copy_example(tmp_path)
    (root / path).write_text(content)
    with DirectoryHost(str(root)) as host, pytest.raises(SysfsError, match=message) as refused:
        inspect(host)
    assert refused.value.path == "/" + path
    assert refused.value.exit_code == 8


def test_a_file_name_holding_a_record_marker_is_skipped_with_a_warning(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    (root / "etc/modprobe.d/evil\n#section\tlines").write_text("blacklist nvidia\n")
    with DirectoryHost(str(root)) as host:
        inventory = inspect(host)
    assert any("newline or tab" in w for w in inventory.warnings)
    assert not any("evil" in p for p in inventory.host_files)


def test_a_config_that_is_not_utf8_is_refused_naming_the_byte(tmp_path: Path) -> None:
    """A byte that is not UTF-8 written after the plan: apply's preflight refuses the file."""
    root = copy_example(tmp_path)
    config = root / VM
    with DirectoryHost(str(root)) as host:
        proposal = propose(host, POLICY)
        plan, changes = proposal.plan, proposal.changes
        config.write_bytes(config.read_bytes().replace(b"train", b"tr\xe4in"))
        with pytest.raises(FileChangedError, match="not UTF-8 \\(byte 0xe4"):
            apply_changes(host, changes, plan=plan)


def test_a_plan_never_changes_a_config_that_is_not_utf8(tmp_path: Path) -> None:
    """Its text holds U+FFFD where the byte was, so a diff would rewrite a line the plan does
    not touch: the plan refuses it, in the words apply's preflight uses, before any diff."""
    root = copy_example(tmp_path)
    config = root / VM
    data = config.read_bytes().replace(b"train", b"tr\xe4in")
    config.write_bytes(data)
    offset = data.index(b"\xe4")
    with DirectoryHost(str(root)) as host, pytest.raises(RenderError) as refused:
        propose(host, POLICY)
    assert (refused.value.path, refused.value.exit_code) == ("/" + VM, 16)
    assert str(refused.value) == (
        f"dir:{root}: /{VM}: is not UTF-8 (byte 0xe4 at offset {offset}): proxgpu edits only "
        "UTF-8 text, as Proxmox writes it; fix that byte, then plan again"
    )
    # A plan that leaves the file alone still plans: only a change to it is refused.
    with DirectoryHost(str(root)) as host:
        changes = propose(host, SplitPolicy(lxc=200)).changes
    assert "/" + VM not in [f.path for f in changes.files if f.before != f.after]


# --- big configs --------------------------------------------------------------------------------


def test_a_config_of_megabytes_is_applied_and_rolled_back_byte_for_byte(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    config = root / VM
    description = ("#" + "x" * 99 + "\n") * 50_000  # 5 MB of description, as Proxmox keeps it
    original = description + config.read_text()
    config.write_text(original)
    change = FileChange(path="/" + VM, before=original, after=original + "tags: big\n")
    with DirectoryHost(str(root)) as host:
        apply_changes(host, ChangeSet(host=host.name, files=[change]))
        assert config.read_text() == original + "tags: big\n"
        rollback(host)
    assert config.read_text() == original


def test_a_connection_lost_while_recording_the_apply_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = copy_example(tmp_path)
    host = DirectoryHost(str(root))
    changes = changeset(root)
    # probe, stage, commit: the fourth command, the one that records the outcome, is lost.
    drop_after(monkeypatch, host, 3)
    with pytest.raises(HostUnreachableError, match="the apply is done") as lost:
        apply_changes(host, changes)
    assert "proxgpu history" in str(lost.value)
    for now, _, after in contents(root, changes):
        assert now == after, "nothing is undone: every file was written"
