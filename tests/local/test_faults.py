"""Fault injection: applies and rollbacks killed at random points, a full disk.

Each run works on its own copy of an example host, through the real command line in a child
process group that is killed with SIGKILL (the harshest cut short of a power failure: no handler,
no cleanup, the shell scripts killed with it). Afterwards every target file must be wholly old or
wholly new, and a plain ``proxgpu rollback`` must bring the tree back to what it was, byte for
byte. The delays come from a seeded generator, so a failure can be replayed.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proxgpu.host import DirectoryHost
from proxgpu.pipeline import propose
from proxgpu.planning import SplitPolicy
from tests.support.trees import copy_example, tree_bytes

POLICY = SplitPolicy(lxc=200, vms=[(300, None)])
APPLY = ["apply", "--lxc", "200", "--vm", "300", "--yes"]
KILLS = 10  # per scenario: bounded, each one costs about a second
OURS = ("var/lib/proxgpu", "run/lock")


def cli(root: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "proxgpu", *args, "--root", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: the kill takes the scripts with it
    )


def run_cli(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "proxgpu", *args, "--root", str(root)],
        capture_output=True,
        timeout=120,
        check=False,
    )


def kill_after(process: subprocess.Popen[bytes], seconds: float) -> None:
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def host_files(tree: dict[str, bytes]) -> dict[str, bytes]:
    """The tree without proxgpu's own journal, backups and lock."""
    return {p: b for p, b in tree.items() if not p.startswith(OURS)}


def planned(root: Path) -> dict[str, tuple[bytes | None, bytes | None]]:
    with DirectoryHost(str(root)) as host:
        changes = propose(host, POLICY).changes
    return {
        f.path.lstrip("/"): (
            None if f.before is None else f.before.encode(),
            None if f.after is None else f.after.encode(),
        )
        for f in changes.changed_files()
    }


def assert_old_or_new(root: Path, targets: dict[str, tuple[bytes | None, bytes | None]]) -> None:
    for path, (old, new) in targets.items():
        file = root / path
        now = file.read_bytes() if file.exists() else None
        assert now in (old, new), f"{path} is neither the old nor the new file"


def timing(tmp_path: Path) -> float:
    """How long one whole apply takes here, to spread the kills over it."""
    root = copy_example(tmp_path, dest="timing")
    start = time.perf_counter()
    assert run_cli(root, *APPLY).returncode == 0
    return time.perf_counter() - start


def test_an_apply_killed_anywhere_leaves_old_or_new_and_rollback_recovers(tmp_path: Path) -> None:
    rng = random.Random(20261130)
    span = timing(tmp_path)
    for n in range(KILLS):
        root = copy_example(tmp_path, dest=f"kill{n}")
        pristine = host_files(tree_bytes(root))
        targets = planned(root)
        kill_after(cli(root, *APPLY), rng.uniform(0.0, span))
        assert_old_or_new(root, targets)
        back = run_cli(root, "rollback", "--yes")
        assert back.returncode == 0, back.stderr.decode()
        assert host_files(tree_bytes(root)) == pristine, f"kill {n}: rollback did not recover"


def test_a_rollback_killed_anywhere_is_finished_by_the_next_one(tmp_path: Path) -> None:
    rng = random.Random(11302026)
    span = timing(tmp_path)
    for n in range(KILLS):
        root = copy_example(tmp_path, dest=f"back{n}")
        pristine = host_files(tree_bytes(root))
        assert run_cli(root, *APPLY).returncode == 0
        targets = planned(copy_example(tmp_path, dest=f"plan{n}"))
        kill_after(cli(root, "rollback", "--yes"), rng.uniform(0.0, span))
        assert_old_or_new(root, targets)
        again = run_cli(root, "rollback", "--yes")
        assert again.returncode == 0, again.stderr.decode()
        assert host_files(tree_bytes(root)) == pristine, f"kill {n}: not recovered"


def small_tmpfs(where: Path, kib: int) -> bool:
    """Mount a tmpfs of ``kib`` KiB at ``where``; False where this machine allows no mount."""
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    return mounted.returncode == 0


@pytest.mark.parametrize("free_pages", [1, 8, 12, 13, 40])
def test_a_full_disk_fails_the_apply_cleanly(tmp_path: Path, free_pages: int) -> None:
    # With more or less room left, the disk fills up at a different step: the journal, the
    # backups, the staged files, the journal's final record.
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not small_tmpfs(disk, 16 * 1024):
        pytest.skip("this machine allows no tmpfs mount (needs root and CAP_SYS_ADMIN)")
    try:
        root = copy_example(disk, dest="host")
        pristine = host_files(tree_bytes(root))
        targets = planned(root)
        filler = disk / "filler"
        with contextlib.suppress(OSError), filler.open("wb", buffering=0) as out:
            while True:
                out.write(b"\0" * 4096)
        os.truncate(filler, max(0, filler.stat().st_size - free_pages * 4096))
        outcome = run_cli(root, *APPLY)
        assert_old_or_new(root, targets)
        if outcome.returncode != 0:
            assert b"No space left" in outcome.stderr, outcome.stderr.decode()
            assert host_files(tree_bytes(root)) == pristine, "nothing of the apply stays"
        assert not (root / "run/lock/proxgpu").exists(), "no stray lock"
        temps = [p.name for p in root.rglob("*.tmp") if ".proxgpu-" in p.name]
        locks = [p.name for p in (root / "run/lock").glob("proxgpu*")]
        assert temps == [] and locks == [], "no stray temp files or half-made locks"
    finally:
        subprocess.run(["umount", str(disk)], check=False)
