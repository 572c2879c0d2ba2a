"""The journal (proxgpu.apply.journal) as later versions read it: entries written by earlier
versions still read, and still roll back."""

from __future__ import annotations

import json
from pathlib import Path

from proxgpu.apply import signing
from proxgpu.apply.journal import history
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.host.local import DirectoryHost
from proxgpu.rendering.changes import Action
from tests.support.trees import changeset, snapshot


def test_a_journal_written_when_actions_had_a_kind_still_reads(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    apply_changes(host, changeset(root, actions=[["update-initramfs", "-u", "-k", "all"]]))
    [entry] = history(host)
    path = root / "var/lib/proxgpu/journal" / f"{entry.id}.json"
    data = json.loads(path.read_text())
    data["changeset"]["actions"] = [{**a, "kind": "post"} for a in data["changeset"]["actions"]]
    # Signed as the release that wrote the field signed it: over the document with the field.
    path.write_text(json.dumps(signing.sign(data, signing.load_key()), indent=2))
    [old] = history(host)
    assert old.changeset.actions == [Action(argv=["update-initramfs", "-u", "-k", "all"])]
    rollback(host)
    assert snapshot(root) == original
