"""The journal as a chain of signed entries (issue 21, point 3): ``verify`` and ``history`` check
each entry's signature as rollback does, each entry is chained to the one before it, and an
entry acts only on the host and root it was made for.

Each case applies the ct200 split (and rolls back and applies again, for a journal of two
entries) on a copy of the example in a scratch folder through the command line, in process,
then does to the journal what someone who can write it but not read the admin's key could:
edit an entry, delete one, copy in one from another host's journal, or move the whole tree.
It asserts the exact outcome and that nothing outside the scratch folder changed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from proxgpu.apply import signing
from proxgpu.cli import main
from tests.support.hostile import Scene, scene
from tests.support.trees import copy_example, tree_bytes

SPLIT = ["--lxc", "200", "--vm", "300"]
JOURNAL = "var/lib/proxgpu/journal"
#: The exit code of a journal entry refused (JournalError).
REFUSED = 15


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run proxgpu in process: exit code, stdout, stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def entries(tree: Path) -> list[Path]:
    """The journal's entry files, oldest first (their ids sort by time)."""
    return sorted((tree / JOURNAL).glob("*.json"))


def two_entries(hostile: Scene, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    """Apply, roll back, apply again: the first entry (rolled back) and the second (applied)."""
    for argv in (["apply", *SPLIT], ["rollback"], ["apply", *SPLIT]):
        code, _, err = cli(capsys, argv[0], "--root", str(hostile.tree), *argv[1:], "--yes")
        assert code == 0, err
    first, second = entries(hostile.tree)
    return first, second


def refusal(tree: Path, entry: Path, why: str) -> str:
    """The one line a refused entry gets, naming the host, the entry's file and the way out."""
    return (
        f"proxgpu: dir:{tree}: {entry}: {why}; refused: act on it from the machine whose key "
        f"({signing.key_path()}) wrote it, or pass --trust-unsigned if you have checked the "
        "entry by hand\n"
    )


def refused(hostile: Scene, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``argv`` on the tree, expecting a refusal that writes nothing: its stderr."""
    before = tree_bytes(hostile.tree)
    code, out, err = cli(capsys, argv[0], "--root", str(hostile.tree), *argv[1:])
    assert (code, out) == (REFUSED, ""), err
    assert tree_bytes(hostile.tree) == before, "nothing written"
    hostile.assert_outside_unchanged()
    return err


def history(capsys: pytest.CaptureFixture[str], tree: Path) -> tuple[list[dict[str, str]], str]:
    """``history --json``: each entry's id and ``untrusted`` field, and what went to stderr."""
    code, out, err = cli(capsys, "history", "--root", str(tree), "--json")
    assert code == 0, err
    return [{"id": e["id"], "untrusted": e["untrusted"]} for e in json.loads(out)], err


def edit_hash(entry: Path) -> None:
    """Edit a backup's hash in ``entry``, as one would to have a backup of one's own restored."""
    document = json.loads(entry.read_text())
    next(f for f in document["files"] if f["backup"] is not None)["sha256_before"] = "0" * 64
    entry.write_text(json.dumps(document, indent=2))


# --- verify and history check the signature -----------------------------------------------------


def test_verify_refuses_an_entry_edited_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    code, _, err = cli(capsys, "apply", "--root", str(hostile.tree), *SPLIT, "--yes")
    assert code == 0, err
    (entry,) = entries(hostile.tree)
    edit_hash(entry)
    err = refused(hostile, capsys, "verify")
    why = "its signature does not match: edited since proxgpu wrote it"
    assert err == refusal(hostile.tree, entry, why)


def test_verify_compares_with_an_edited_entry_only_with_trust_unsigned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    code, _, err = cli(capsys, "apply", "--root", str(hostile.tree), *SPLIT, "--yes")
    assert code == 0, err
    (entry,) = entries(hostile.tree)
    edit_hash(entry)
    argv = ["verify", "--root", str(hostile.tree), "--trust-unsigned"]
    code, out, err = cli(capsys, *argv)
    assert code == 0, err
    assert out.startswith(f"dir:{hostile.tree}: no drift")
    hostile.assert_outside_unchanged()


def test_history_marks_an_entry_edited_by_hand_in_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    first, second = two_entries(hostile, capsys)
    edit_hash(first)
    shown, err = history(capsys, hostile.tree)
    why = "its signature does not match: edited since proxgpu wrote it"
    assert shown == [
        {"id": first.stem, "untrusted": why},
        {"id": second.stem, "untrusted": None},
    ]
    assert err == f"proxgpu: dir:{hostile.tree}: {first}: UNTRUSTED: {why}\n"
    code, out, err = cli(capsys, "history", "--root", str(hostile.tree))
    assert code == 0
    assert err == f"proxgpu: dir:{hostile.tree}: {first}: UNTRUSTED: {why}\n"
    rows = [line.split() for line in out.splitlines()]
    assert [(row[0], row[-1]) for row in rows] == [
        ("ID", "TRUSTED"),
        (first.stem, "NO"),
        (second.stem, "yes"),
    ]
    hostile.assert_outside_unchanged()


# --- the chain -----------------------------------------------------------------------------------


def test_each_entry_is_chained_to_the_one_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    first, second = two_entries(hostile, capsys)
    assert json.loads(first.read_text())["previous"] == "start"
    assert json.loads(second.read_text())["previous"].startswith(f"{first.stem}:")
    # Rolling the first back rewrote it; the second is still in its place.
    assert history(capsys, hostile.tree) == (
        [{"id": first.stem, "untrusted": None}, {"id": second.stem, "untrusted": None}],
        "",
    )
    hostile.assert_outside_unchanged()


def test_an_entry_deleted_from_the_journal_is_detected_by_rollback_verify_and_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    first, second = two_entries(hostile, capsys)
    first.unlink()
    why = f"the entry before it, {first.stem}, is gone from the journal: deleted since"
    assert refused(hostile, capsys, "rollback", "--yes") == refusal(hostile.tree, second, why)
    assert refused(hostile, capsys, "verify") == refusal(hostile.tree, second, why)
    assert history(capsys, hostile.tree)[0] == [{"id": second.stem, "untrusted": why}]


def test_an_entry_damaged_in_the_middle_of_the_journal_is_detected_by_the_next(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    first, second = two_entries(hostile, capsys)
    first.write_text("{cut short")
    why = f"the entry before it, {first.stem}, can no longer be read: damaged since"
    assert refused(hostile, capsys, "rollback", "--yes") == refusal(hostile.tree, second, why)
    shown, err = history(capsys, hostile.tree)
    assert shown == [{"id": second.stem, "untrusted": why}]
    assert f"{first}: unreadable" in err


def test_an_entry_copied_in_from_another_hosts_journal_is_refused_even_when_trusted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    first, second = two_entries(hostile, capsys)
    # Another host of the same admin, so its entry is signed with the same key.
    donor = copy_example(hostile.scratch, "ct200", dest="donor")
    code, _, err = cli(capsys, "apply", "--root", str(donor), *SPLIT, "--yes")
    assert code == 0, err
    (theirs,) = entries(donor)
    replayed = hostile.tree / JOURNAL / theirs.name
    shutil.copy2(theirs, replayed)
    hostile.settle()
    why = f"it began the journal, yet {second.stem} lies before it: put there since"
    assert history(capsys, hostile.tree)[0] == [
        {"id": first.stem, "untrusted": None},
        {"id": second.stem, "untrusted": None},
        {"id": replayed.stem, "untrusted": why},
    ]
    assert refused(hostile, capsys, "rollback", "--yes") == refusal(hostile.tree, replayed, why)
    err = refused(hostile, capsys, "rollback", "--yes", "--trust-unsigned")
    assert err == (
        f"proxgpu: dir:{hostile.tree}: {replayed}: made for root {donor}, not "
        f"{hostile.tree}: copied from another tree, or use --root {donor}; refused\n"
    )


def test_a_tree_moved_elsewhere_is_not_rolled_back_from_its_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    code, _, err = cli(capsys, "apply", "--root", str(hostile.tree), *SPLIT, "--yes")
    assert code == 0, err
    moved = Path(shutil.copytree(hostile.tree, hostile.scratch / "moved", symlinks=True))
    (entry,) = entries(moved)
    hostile.tree = moved
    for extra in ([], ["--trust-unsigned"]):
        err = refused(hostile, capsys, "rollback", "--yes", *extra)
        assert err == (
            f"proxgpu: dir:{moved}: {entry}: made for root {tmp_path}/scratch/host, not "
            f"{moved}: copied from another tree, or use --root {tmp_path}/scratch/host; "
            "refused\n"
        )


def test_a_root_is_one_root_however_it_is_spelled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applied as ``--root .``, the tree's entry is its own under its absolute name and with a
    trailing slash; a copy of it elsewhere, named ``.`` in turn, is still another tree."""
    hostile = scene(tmp_path)
    monkeypatch.chdir(hostile.tree)
    code, _, err = cli(capsys, "apply", "--root", ".", *SPLIT, "--yes")
    assert code == 0, err
    for spelling in (str(hostile.tree), f"{hostile.tree}/", "./"):
        code, _, err = cli(capsys, "verify", "--root", spelling)
        assert code == 0, (spelling, err)
    moved = Path(shutil.copytree(hostile.tree, hostile.scratch / "moved", symlinks=True))
    (entry,) = entries(moved)
    monkeypatch.chdir(moved)
    code, _, err = cli(capsys, "rollback", "--root", ".", "--yes")
    assert code != 0 and f"{entry.name}: made for root {hostile.tree}, not {moved}:" in err, err
    hostile.assert_outside_unchanged()


def as_an_earlier_release_wrote_it(entry: Path) -> None:
    """Rewrite ``entry`` as the release before the chain wrote it: signed with the same key,
    with no link to the entry before it, no root (recorded since), and its plan's groups
    without ``vgpus`` (a field added since, which today's model fills in with its default)."""
    document = json.loads(entry.read_text())
    document.pop("previous")
    document.pop("root")
    for group in document["plan"]["groups"]:
        group.pop("vgpus")
    entry.write_text(json.dumps(signing.sign(document, signing.load_key()), indent=2))


def test_an_entry_an_earlier_release_signed_still_rolls_back_after_the_upgrade(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = scene(tmp_path)
    original = tree_bytes(hostile.tree)
    code, _, err = cli(capsys, "apply", "--root", str(hostile.tree), *SPLIT, "--yes")
    assert code == 0, err
    (entry,) = entries(hostile.tree)
    as_an_earlier_release_wrote_it(entry)
    assert history(capsys, hostile.tree)[0] == [{"id": entry.stem, "untrusted": None}]
    code, _, err = cli(capsys, "verify", "--root", str(hostile.tree))
    assert code in (0, 17), err  # checked (a tree's drivers never change), not refused
    code, _, err = cli(capsys, "rollback", "--root", str(hostile.tree), "--yes")
    assert code == 0, err
    after = tree_bytes(hostile.tree)
    assert {k: v for k, v in after.items() if not k.startswith("var/lib/proxgpu")} == original
    hostile.assert_outside_unchanged()


def test_an_unchained_entry_after_a_chained_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry of the earlier release's form put after entries of the chain: put in since."""
    hostile = scene(tmp_path)
    first, second = two_entries(hostile, capsys)
    as_an_earlier_release_wrote_it(second)
    why = (
        f"it is not chained, yet lies after {first.stem}, which is: an entry of an earlier "
        "release put in since"
    )
    assert refused(hostile, capsys, "rollback", "--yes") == refusal(hostile.tree, second, why)
    code, _, err = cli(capsys, "rollback", "--root", str(hostile.tree), "--yes", "--trust-unsigned")
    assert code == 0, err


def test_a_folder_where_the_signing_key_belongs_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory in the key's place is said as the key's problem (exit 2), before the lock
    is taken: nothing is written, and nothing claims that files were restored."""
    tree = copy_example(tmp_path)
    config = tmp_path / "config"
    (config / "proxgpu" / "key").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    before = tree_bytes(tree)
    for argv in (["apply", *SPLIT, "--yes"], ["rollback", "--trust-unsigned", "--yes"]):
        code, _, err = cli(capsys, argv[0], "--root", str(tree), *argv[1:])
        assert code == 2, err
        said = f"proxgpu: {config}/proxgpu/key: the signing key is not a regular file"
        assert err.splitlines()[-1] == said
        assert "restored" not in err
        assert tree_bytes(tree) == before, "nothing written, no lock left"


def test_an_unreadable_newest_entry_is_named_not_read_as_an_empty_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cut short, the newest entry is not passed over: rollback and verify name it (exit 15)
    instead of "nothing to roll back"."""
    tree = copy_example(tmp_path)
    code, _, err = cli(capsys, "apply", "--root", str(tree), *SPLIT, "--yes")
    assert code == 0, err
    [entry] = entries(tree)
    entry.write_bytes(entry.read_bytes()[:100])
    before = tree_bytes(tree)
    for argv in (["rollback", "--yes"], ["verify"]):
        code, out, err = cli(capsys, argv[0], "--root", str(tree), *argv[1:])
        assert (code, out) == (REFUSED, ""), err
        assert f"/var/lib/proxgpu/journal/{entry.name}: unreadable: " in err
        assert "it is the journal's newest entry, so the latest apply is not known" in err
    assert tree_bytes(tree) == before, "nothing written"


def test_a_journal_copied_onto_another_machine_is_refused_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same admin's key signs the journals of all their hosts, so a journal copied whole
    onto another host (a clone of one golden image) checks there: the machine it was made on
    (hostname and /etc/machine-id) is compared, and rollback, even --force, refuses it (exit
    15) until told --trust-unsigned."""
    tree = copy_example(tmp_path)
    (tree / "etc/machine-id").write_text("4c4c454400000000000000000000a001\n")
    (tree / "etc/hostname").write_text("pve-a\n")
    code, _, err = cli(capsys, "apply", "--root", str(tree), *SPLIT, "--yes")
    assert code == 0, err
    # The same files on another machine: the golden image's clone, renamed, same machine-id.
    (tree / "etc/hostname").write_text("pve-b\n")
    before = tree_bytes(tree)
    for argv in (["rollback", "--force", "--yes"], ["verify"]):
        code, out, err = cli(capsys, argv[0], "--root", str(tree), *argv[1:])
        assert (code, out) == (REFUSED, ""), err
        assert "made on pve-a (machine-id 4c4c454400000000000000000000a001), not on pve-b" in err
    assert tree_bytes(tree) == before, "nothing written"
    code, _, err = cli(capsys, "rollback", "--root", str(tree), "--trust-unsigned", "--yes")
    assert code == 0, err
