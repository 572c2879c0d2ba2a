"""What the hostile tier (``tests/hostile``) shares: a scratch folder beside files that must never
change, and a check that they did not.

Each case puts the host's tree in ``scratch`` (a folder of the test's tmp directory) and what an
attacker would aim at (a file, a directory) beside it, in ``outside``. :func:`state_outside`
hashes everything in the tmp directory but ``scratch``: names, file types, bytes, link targets
and modes, so a case asserts that nothing outside its scratch folder was written, created,
removed, chmodded or followed into.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from tests.support.trees import copy_example


def state_outside(parent: Path, scratch: Path) -> dict[str, tuple[str, str, int]]:
    """Every entry under ``parent`` except ``scratch``'s: its kind, content hash (a link: its
    target) and mode, by path relative to ``parent``."""
    found: dict[str, tuple[str, str, int]] = {}
    for directory, dirs, files in os.walk(parent):
        here = Path(directory)
        if here == scratch or scratch in here.parents:
            dirs[:] = []
            continue
        for name in [*dirs, *files]:
            path = here / name
            if path == scratch:
                continue
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                found[str(path.relative_to(parent))] = ("link", os.readlink(path), 0)
            elif stat.S_ISREG(info.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[str(path.relative_to(parent))] = ("file", digest, info.st_mode & 0o7777)
            else:
                found[str(path.relative_to(parent))] = ("dir", "", info.st_mode & 0o7777)
    return found


@dataclass
class Scene:
    """One case's folders: ``tree`` (the host, in ``scratch``) and ``outside`` (the target)."""

    parent: Path
    scratch: Path
    tree: Path
    outside: Path

    def __post_init__(self) -> None:
        self.before = state_outside(self.parent, self.scratch)

    def victim(self, name: str, content: bytes = b"do not touch\n", mode: int = 0o600) -> Path:
        """A file outside the scratch folder, that nothing proxgpu does may change."""
        path = self.outside / name
        path.write_bytes(content)
        path.chmod(mode)
        self.settle()
        return path

    def link_out(self, inside: str) -> Path:
        """Replace the tree's directory ``inside`` by a symlink to an empty directory outside
        holding nothing (its old content is moved out of the way, beside it in scratch)."""
        target = self.outside / inside.replace("/", "_")
        target.mkdir()
        path = self.tree / inside
        if path.is_dir() and not path.is_symlink():
            path.rename(self.scratch / f"moved-{inside.replace('/', '_')}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
        self.settle()
        return target

    def settle(self) -> None:
        """Take what is outside now as what must stay (after the case set its targets up)."""
        self.before = state_outside(self.parent, self.scratch)

    def assert_outside_unchanged(self) -> None:
        """Nothing outside the scratch folder changed since the scene (or its last victim)."""
        assert state_outside(self.parent, self.scratch) == self.before


def scene(tmp_path: Path, example: str = "ct200") -> Scene:
    """A copy of an example host in ``tmp_path/scratch/host``, with ``tmp_path/outside`` beside."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    tree = copy_example(scratch, example, dest="host")
    outside = tmp_path / "outside"
    outside.mkdir()
    return Scene(tmp_path, scratch, tree, outside)
