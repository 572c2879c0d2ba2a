"""A journal that grows with every apply still rolls back: reading it costs what the command
needs (the newest entry, the one acted on and its link in the chain), not its whole history,
and its retention prunes what no rollback needs.

Each entry keeps the configs it changed whole, so with a guest config of 1 MiB (the largest
pmxcfs keeps) every apply adds megabytes: read whole, the journal passed the 64 MiB a host may
answer at the 25th rollback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxgpu.apply.journal import KEEP_ENTRIES
from proxgpu.cli import main
from tests.support.trees import copy_example, snapshot

CYCLES = 25
JOURNAL = "var/lib/proxgpu/journal"
BACKUPS = "var/lib/proxgpu/backups"


def history(tree: Path, capsys: pytest.CaptureFixture[str]) -> list[tuple[str, bool]]:
    """Each entry's status, and whether it is untrusted, oldest first."""
    capsys.readouterr()
    assert main(["history", "--root", str(tree), "--json"]) == 0
    return [(e["status"], bool(e["untrusted"])) for e in json.loads(capsys.readouterr().out)]


def test_25_apply_and_rollback_cycles_of_a_1_mib_config_all_roll_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An applied entry at the bottom of the journal is kept however old; the cycles above it
    are pruned to the newest KEEP_ENTRIES, each with its backups, and every entry left is
    trusted (the oldest kept follows one the retention removed, not one deleted by hand)."""
    tree = copy_example(tmp_path)
    config = tree / "etc/pve/lxc/200.conf"
    # A description of 1 MiB, as Proxmox writes one: each line a comment.
    lines = "".join(f"#line {n:07d} {'x' * 48}\n" for n in range(17_000))
    config.write_text(lines + config.read_text())
    assert config.stat().st_size > 1 << 20
    original = snapshot(tree)
    assert main(["apply", "--root", str(tree), "--lxc", "200", "--yes"]) == 0
    applied = snapshot(tree)
    for cycle in range(CYCLES):
        assert main(["apply", "--root", str(tree), "--lxc", "200", "--vm", "300", "--yes"]) == 0
        assert main(["rollback", "--root", str(tree), "--yes"]) == 0, cycle
        assert snapshot(tree) == applied, f"cycle {cycle}: every byte back"
    kept = [("applied", False)] + [("rolled-back", False)] * KEEP_ENTRIES
    assert history(tree, capsys) == kept
    assert len(list((tree / BACKUPS).iterdir())) == len(kept), "pruned with their backups"
    assert main(["rollback", "--root", str(tree), "--yes"]) == 0, "the applied entry is kept"
    assert snapshot(tree) == original
