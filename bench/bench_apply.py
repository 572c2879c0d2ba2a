"""Wall time of an apply that rewrites one big VM config, against a floor from the same run.

An apply sends each new file's bytes to the host on stdin and the stage script copies them into
place; this measures that it does so at pipe speed, whatever the size. For configs of 1, 10 and
30 MB (a VM config with a long description), in a copy of the ct200 example tree:

* floor: the host's own transport piping the same bytes through ``sh -c 'cat > FILE'`` and
  hashing the result: the least any writer must do;
* proxgpu: ``apply_changes`` of a change set that replaces the config (probe, backup, stage,
  commit, journal), then the rollback that puts the old one back, on a fresh copy of the tree
  each time (so that the journal holds only this apply).

The ratio should stay flat as the size grows (it was 52 s for 10 MB when the script read its
input byte by byte). Run: python bench/bench_apply.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.timing import median_seconds  # noqa: E402
from proxgpu.apply import apply_changes, rollback  # noqa: E402
from proxgpu.host import DirectoryHost, LocalHost  # noqa: E402
from proxgpu.rendering.changes import ChangeSet, FileChange  # noqa: E402

RUNS = 3
CONFIG = "/etc/pve/qemu-server/300.conf"
SIZES_MB = (1, 10, 30)


def big_config(base: str, megabytes: int) -> str:
    """``base`` with a description comment of about ``megabytes`` MB in front, as Proxmox keeps
    descriptions: one ``#`` line per line of text."""
    line = "#" + "x" * 99 + "\n"
    return line * (megabytes * 1024 * 1024 // len(line)) + base


def floor(tree: Path, data: bytes) -> None:
    LocalHost().check(
        ["sh", "-c", 'cat > "$1" && sha256sum "$1" >/dev/null', "sh", str(tree / "floor.bin")],
        stdin=data,
    )


def apply_and_roll_back(pristine: Path, changes: ChangeSet) -> None:
    tree = pristine.with_name("run")
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(pristine, tree, symlinks=True)
    host = DirectoryHost(str(tree))
    apply_changes(host, changes)
    rollback(host)


def copy_only(pristine: Path) -> None:
    tree = pristine.with_name("run")
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(pristine, tree, symlinks=True)


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "host"
        shutil.copytree(REPO / "examples/hosts/ct200", tree, symlinks=True)
        base = (tree / CONFIG.lstrip("/")).read_text()
        print(f"{'size':>6} {'floor':>9} {'apply+rollback':>15} {'ratio':>7}")
        for megabytes in SIZES_MB:
            text = big_config(base, megabytes)
            (tree / CONFIG.lstrip("/")).write_text(text)
            change = FileChange(path=CONFIG, before=text, after=text + "numa: 1\n")
            changes = ChangeSet(host="bench", files=[change])
            data = text.encode()
            # The floor writes the bytes twice too: once for the apply, once for the rollback.
            low = 2 * median_seconds(partial(floor, tree, data), RUNS, warmups=1)
            copying = median_seconds(partial(copy_only, tree), RUNS, warmups=1)
            took = median_seconds(partial(apply_and_roll_back, tree, changes), RUNS, warmups=1)
            took -= copying
            print(f"{megabytes:>4}MB {low:>8.3f}s {took:>14.3f}s {took / low:>6.1f}x")


if __name__ == "__main__":
    main()
