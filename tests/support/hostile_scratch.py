"""A scratch folder for a hostile-input case, and the proof that nothing outside it changed.

Each case gets ``scratch/`` (the host tree, the sshd, the files it may touch) beside a ``canary``
path that a hostile name tries to create (``$(touch CANARY)``, ``;touch CANARY``): the canary
must never appear. :func:`fingerprint` takes the state of every other place a case could reach
(its own folder outside ``scratch/``, the example hosts it was copied from, the user's ``~/.ssh``);
:meth:`Scratch.assert_untouched` compares it with the state before the case ran.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.trees import EXAMPLES

#: What one path looks like: its kind, mode, size and content (a link's target, a file's hash).
Entry = tuple[str, int, int, str]


def fingerprint(*folders: Path, skip: Path | None = None) -> dict[str, Entry]:
    """Every path under ``folders`` (not following links), except those under ``skip``."""
    state: dict[str, Entry] = {}
    for folder in folders:
        if not folder.exists():
            state[str(folder)] = ("absent", 0, 0, "")
            continue
        for dirpath, dirnames, filenames in os.walk(folder):
            here = Path(dirpath)
            if skip is not None and (here == skip or skip in here.parents):
                dirnames[:] = []
                continue
            for name in [*dirnames, *filenames]:
                path = here / name
                if skip is not None and path == skip:
                    continue
                state[str(path)] = _entry(path)
    return state


def _entry(path: Path) -> Entry:
    info = path.lstat()
    if path.is_symlink():
        return ("link", info.st_mode, 0, os.readlink(path))
    if path.is_file():
        return ("file", info.st_mode, info.st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    return ("other", info.st_mode, 0, "")


@dataclass
class Scratch:
    """The folder a case may change (``root``) and the record of everything it may not."""

    folder: Path
    root: Path
    canary: Path
    before: dict[str, Entry] = field(default_factory=dict)

    def watched(self) -> tuple[Path, ...]:
        """The places outside ``root`` a case could reach."""
        return (self.folder, EXAMPLES, Path.home() / ".ssh")

    def assert_untouched(self) -> None:
        """Nothing outside ``root`` changed, and no hostile name ran as a command."""
        assert not self.canary.exists(), "a hostile name ran as a command"
        after = fingerprint(*self.watched(), skip=self.root)
        changed = sorted(p for p in before_and_after(self.before, after))
        assert not changed, f"changed outside the scratch folder: {changed}"


def before_and_after(before: dict[str, Entry], after: dict[str, Entry]) -> set[str]:
    """The paths whose entry differs between two fingerprints."""
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def make_scratch(folder: Path) -> Scratch:
    """A scratch folder under ``folder`` (a test's tmp_path), fingerprinted before the case."""
    scratch = Scratch(folder=folder, root=folder / "scratch", canary=folder / "canary")
    scratch.root.mkdir()
    scratch.before = fingerprint(*scratch.watched(), skip=scratch.root)
    return scratch


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` has exited (or is a zombie waiting for its reaper)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False
