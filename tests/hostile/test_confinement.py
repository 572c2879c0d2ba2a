"""Confinement, whole: every path proxgpu reads or writes under ``--root`` stays under it at the
moment of the operation (issue 21, point 2).

Each case is a real copy of the ct200 example in a scratch folder, real host scripts run with
``sh`` on it (``DirectoryHost``), and an attacker's target beside the scratch folder: a symlink
at any component, a directory swapped for one after preflight, a journal's backup field naming
``..`` or an absolute path, a backup swapped during rollback, a temp file's name planted as a
link. Each asserts the exact outcome and that nothing outside the scratch folder changed. The
swaps "after preflight" are made from a wrapper around the real ``run_script`` (pytest-mock),
just before the real step runs: the only way to land a change between two steps every time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from pytest_mock import MockerFixture

from proxgpu.apply import ApplyOptions, apply_changes, read_journal, rollback
from proxgpu.apply import transaction as transaction_module
from proxgpu.errors import (
    ApplyError,
    CommandError,
    JournalError,
    PreflightError,
    RollbackError,
)
from proxgpu.host import DirectoryHost
from proxgpu.host import scripts as host_scripts
from proxgpu.pipeline import propose
from proxgpu.planning import SplitPolicy
from tests.support.hostile import scene, state_outside
from tests.support.trees import tree_bytes

POLICY = SplitPolicy(lxc=200, vms=[(300, None)])
MODPROBE_D = "etc/modprobe.d"
JOURNAL = "var/lib/proxgpu/journal"
BACKUPS = "var/lib/proxgpu/backups"


def apply_split(tree: Path) -> str:
    """Apply the ct200 split to ``tree``; its journal id."""
    with DirectoryHost(str(tree)) as host:
        proposal = propose(host, POLICY)
        plan, changes = proposal.plan, proposal.changes
        result = apply_changes(host, changes, plan=plan)
    assert result.journal_id is not None
    return result.journal_id


def swap_before(mocker: MockerFixture, step: str, swap: Callable[[], None]) -> None:
    """Run ``swap`` just before the apply's real ``step`` script runs."""
    real = host_scripts.run_script

    def wrapper(host: Any, name: str, *args: str, **kwargs: Any) -> Any:
        if name == step:
            swap()
        return real(host, name, *args, **kwargs)

    mocker.patch.object(transaction_module, "run_script", side_effect=wrapper)


def planned(tree: Path) -> tuple[Any, Any]:
    """The ct200 split's plan and changes for ``tree``, as read now."""
    with DirectoryHost(str(tree)) as host:
        proposal = propose(host, POLICY)
        plan, changes = proposal.plan, proposal.changes
    return plan, changes


# --- a symlink at any component, found when the apply looks -------------------------------------


@pytest.mark.parametrize(
    ("inside", "named"),
    [
        (MODPROBE_D, "/etc/modprobe.d/00-proxgpu-vfio.conf"),
        ("etc/pve/lxc", "/etc/pve/lxc/200.conf"),
        ("usr", "/usr/local/sbin/proxgpu-vfio-bind"),  # an ancestor of directories it creates
        ("var/lib/proxgpu", "/var/lib/proxgpu/journal"),
        ("var/lib", "/var/lib/proxgpu/journal"),
    ],
)
def test_a_directory_linked_out_of_the_tree_after_planning_is_refused_before_any_write(
    tmp_path: Path, inside: str, named: str
) -> None:
    hostile = scene(tmp_path)
    plan, changes = planned(hostile.tree)
    target = hostile.link_out(inside)
    with DirectoryHost(str(hostile.tree)) as host, pytest.raises(PreflightError) as refused:
        apply_changes(host, changes, plan=plan)
    message = str(refused.value)
    assert f"{hostile.tree}{named}" in message and f"resolves to {target}" in message
    assert message.endswith("fix the link")
    assert list(target.iterdir()) == []
    assert not (hostile.tree / "run/lock/proxgpu").exists(), "the lock is released"
    hostile.assert_outside_unchanged()


def test_the_lock_directory_linked_out_of_the_tree_is_refused_and_no_lock_is_made(
    tmp_path: Path,
) -> None:
    hostile = scene(tmp_path)
    plan, changes = planned(hostile.tree)
    target = hostile.link_out("run/lock")
    with DirectoryHost(str(hostile.tree)) as host, pytest.raises(CommandError) as refused:
        apply_changes(host, changes, plan=plan)
    assert str(refused.value) == (
        f"{host.name}: the probe step exited with 1: {hostile.tree}/run/lock: resolves to "
        f"{target}, outside the host root {hostile.tree}; proxgpu writes only inside the root: "
        "fix the link"
    )
    assert list(target.iterdir()) == []
    hostile.assert_outside_unchanged()


def test_a_target_file_that_is_a_symlink_out_of_the_tree_is_never_written_through(
    tmp_path: Path,
) -> None:
    hostile = scene(tmp_path)
    victim = hostile.victim("200.conf", (hostile.tree / "etc/pve/lxc/200.conf").read_bytes())
    plan, changes = planned(hostile.tree)
    (hostile.tree / "etc/pve/lxc/200.conf").unlink()
    (hostile.tree / "etc/pve/lxc/200.conf").symlink_to(victim)
    with DirectoryHost(str(hostile.tree)) as host, pytest.raises(PreflightError) as refused:
        apply_changes(host, changes, plan=plan)
    assert str(refused.value) == (
        f"{host.name}: /etc/pve/lxc/200.conf: is not a regular file; proxgpu only replaces files"
    )
    hostile.assert_outside_unchanged()


# --- a directory swapped for a link after preflight ---------------------------------------------


@pytest.mark.parametrize("step", ["stage", "commit"])
def test_a_directory_swapped_for_a_link_after_preflight_is_refused_and_the_apply_undone(
    tmp_path: Path, mocker: MockerFixture, step: str
) -> None:
    hostile = scene(tmp_path)
    plan, changes = planned(hostile.tree)
    before = tree_bytes(hostile.tree)
    outside = hostile.outside / "modprobe.d"

    def swap() -> None:
        real = hostile.scratch / "real-modprobe.d"
        (hostile.tree / MODPROBE_D).rename(real)
        outside.mkdir()
        (hostile.tree / MODPROBE_D).symlink_to(outside)

    swap_before(mocker, step, swap)
    with DirectoryHost(str(hostile.tree)) as host, pytest.raises(ApplyError) as failed:
        apply_changes(host, changes, plan=plan)
    # The file behind the swapped link is left alone, and the apply left for a rollback once
    # the link is fixed; every other file is back.
    assert not failed.value.restored
    message = str(failed.value)
    assert f"{hostile.tree}/{MODPROBE_D}: resolves to {outside}, outside the host root" in message
    assert (
        "restoring did not finish (/etc/modprobe.d/00-proxgpu-vfio.conf: its directory now "
        "leads out of the host's root through a symlink; left alone)"
    ) in message
    assert list(outside.iterdir()) == [], "nothing was written through the swapped link"
    # Every file the tree had is back as it was (the journal records the failure).
    after = tree_bytes(hostile.tree)
    moved = {k for k in before if k.startswith(MODPROBE_D)}
    assert {k: v for k, v in after.items() if not k.startswith("var/lib/proxgpu")} == {
        k: v for k, v in before.items() if k not in moved
    }
    assert state_outside(hostile.parent, hostile.scratch).keys() - hostile.before.keys() == {
        "outside/modprobe.d"
    }


# --- the journal's backup field, and a backup swapped during rollback ----------------------------


def entry_file(tree: Path, journal_id: str) -> Path:
    return tree / JOURNAL / f"{journal_id}.json"


@pytest.mark.parametrize("backup", ["../../../../../outside/victim", "/etc/shadow", "..", "a/b"])
def test_a_backup_name_that_is_not_one_plain_name_makes_the_entry_unreadable(
    tmp_path: Path, backup: str
) -> None:
    hostile = scene(tmp_path)
    hostile.victim("victim")
    journal_id = apply_split(hostile.tree)
    path = entry_file(hostile.tree, journal_id)
    entry = json.loads(path.read_text())
    edited = next(f for f in entry["files"] if f["backup"] is not None)
    edited["backup"] = backup
    path.write_text(json.dumps(entry, indent=2))
    lxc = (hostile.tree / "etc/pve/lxc/200.conf").read_bytes()
    with DirectoryHost(str(hostile.tree)) as host:
        journal = read_journal(host)
        assert journal.entries == []
        assert journal.unreadable == {
            f"{hostile.tree}/{JOURNAL}/{journal_id}.json": "unreadable: files.8.backup: "
            f"Value error, not a plain file name: {backup!r}"
        }
        with pytest.raises(JournalError, match="not a plain file name"):
            rollback(host, options=ApplyOptions(force=True, trust_unsigned=True), to=journal_id)
    assert (hostile.tree / "etc/pve/lxc/200.conf").read_bytes() == lxc
    hostile.assert_outside_unchanged()


def test_a_backup_swapped_for_a_link_during_rollback_is_refused_not_followed(
    tmp_path: Path,
) -> None:
    hostile = scene(tmp_path)
    original = (hostile.tree / "etc/pve/lxc/200.conf").read_bytes()
    # The link's target holds exactly the backup's bytes: following it would pass every hash.
    victim = hostile.victim("same-bytes", original)
    journal_id = apply_split(hostile.tree)
    applied_bytes = (hostile.tree / "etc/pve/lxc/200.conf").read_bytes()
    entry = json.loads(entry_file(hostile.tree, journal_id).read_text())
    name = next(f["backup"] for f in entry["files"] if f["path"] == "/etc/pve/lxc/200.conf")
    backup = hostile.tree / BACKUPS / journal_id / name
    backup.unlink()
    backup.symlink_to(victim)
    with DirectoryHost(str(hostile.tree)) as host, pytest.raises(RollbackError) as failed:
        rollback(host)
    assert "/etc/pve/lxc/200.conf: its backup is damaged; left alone" in str(failed.value)
    assert (hostile.tree / "etc/pve/lxc/200.conf").read_bytes() == applied_bytes
    assert not list((hostile.tree / "etc/pve/lxc").glob(".*.tmp")), "no temp file left"
    hostile.assert_outside_unchanged()


def test_a_backup_directory_linked_out_of_the_tree_is_refused_at_rollback(
    tmp_path: Path,
) -> None:
    hostile = scene(tmp_path)
    journal_id = apply_split(hostile.tree)
    applied_bytes = tree_bytes(hostile.tree)
    target = hostile.link_out(BACKUPS)
    with DirectoryHost(str(hostile.tree)) as host, pytest.raises(PreflightError) as refused:
        rollback(host, to=journal_id)
    assert f"{hostile.tree}/{BACKUPS}: resolves to {target}" in str(refused.value)
    after = tree_bytes(hostile.tree)
    assert {k: v for k, v in after.items() if not k.startswith("var/lib/proxgpu")} == {
        k: v for k, v in applied_bytes.items() if not k.startswith("var/lib/proxgpu")
    }
    hostile.assert_outside_unchanged()


# --- temp files: never through a planted link, gone when the script is killed -------------------

PRELUDE = resources.files("proxgpu").joinpath("scripts/prelude.sh").read_text(encoding="utf-8")


def prelude_sh(root: Path, body: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``body`` behind the real prelude, with ``root`` as the host's root, as run_script sends."""
    script = f"proxgpu_prefix='{root}'\n{PRELUDE}\n{body}"
    return subprocess.run(["sh", "-c", script, "sh", *args], capture_output=True, check=False)


def test_a_temp_file_name_planted_as_a_link_is_replaced_not_written_through(
    tmp_path: Path,
) -> None:
    hostile = scene(tmp_path)
    victim = hostile.victim("victim")
    tmp = hostile.tree / "etc/.modules.proxgpu-1.tmp"
    tmp.symlink_to(victim)
    body = 'enter "$1" && put_tmp ./.modules.proxgpu-1.tmp 644 077 - printf new'
    done = prelude_sh(hostile.tree, body, f"{hostile.tree}/etc")
    assert done.returncode == 0, done.stderr
    assert not tmp.is_symlink() and tmp.read_bytes() == b"new"
    assert oct(tmp.stat().st_mode & 0o777) == "0o644"
    hostile.assert_outside_unchanged()


def test_mkdir_never_goes_through_a_link_out_of_the_tree(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    target = hostile.link_out("usr/local")
    done = prelude_sh(hostile.tree, 'enter "$1" make', f"{hostile.tree}/usr/local/sbin/new")
    assert done.returncode == 4
    assert done.stderr.decode() == (
        f"{hostile.tree}/usr/local/sbin/new: resolves to {target}, outside the host root "
        f"{hostile.tree}; proxgpu writes only inside the root: fix the link\n"
    )
    assert list(target.iterdir()) == []
    hostile.assert_outside_unchanged()


def test_a_killed_restore_removes_its_temp_file(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    conf = hostile.tree / "etc/modules"
    before = conf.read_bytes()
    tmp = f"{hostile.tree}/etc/.modules.proxgpu-1.restore.tmp"
    staged = f"{hostile.tree}/etc/.modules.proxgpu-1.tmp"
    text = host_scripts.script_text("restore")
    script = f"proxgpu_prefix='{hostile.tree}'\n{text}"
    # One file whose content ("=") is 1000 bytes of stdin, of which only 10 ever come.
    args = [str(conf), staged, tmp, "=", "0" * 64, "644", "077", "-", "any", "-", "1000"]
    proc = subprocess.Popen(
        ["sh", "-c", script, "sh", "1", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"0123456789")
    proc.stdin.flush()
    deadline = time.monotonic() + 10
    while not os.path.exists(tmp) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert os.path.exists(tmp), "the restore wrote its temp file"
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=10)
    assert proc.returncode == 143
    assert not os.path.exists(tmp), "the EXIT trap removed it"
    assert conf.read_bytes() == before
    hostile.assert_outside_unchanged()


def test_commit_and_restore_make_no_temp_directory_outside_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = scene(tmp_path)
    tmpdir = hostile.outside / "tmp"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))  # where mktemp would put one
    hostile.settle()
    journal_id = apply_split(hostile.tree)
    with DirectoryHost(str(hostile.tree)) as host:
        assert rollback(host, to=journal_id).journal_id == journal_id
    assert list(tmpdir.iterdir()) == []
    hostile.assert_outside_unchanged()
