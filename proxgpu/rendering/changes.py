"""Change sets: the files a plan rewrites and the actions that must follow, as data first.

A :class:`ChangeSet` is what rendering produces and what apply consumes. Its diff is data
(before/after text per file); :func:`unified_diff` and :meth:`ChangeSet.ansible_diff` are two
renderings of it.

>>> change = FileChange(path="/etc/modules", before="a\\n", after="a\\nb\\n", mode=0o644)
>>> print(unified_diff(change), end="")
--- /etc/modules
+++ /etc/modules
@@ -1 +1,2 @@
 a
+b
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from proxgpu.model import FrozenModel
from proxgpu.paths import check_host_path


class FileChange(FrozenModel):
    """One file: its text before and after. ``None`` means absent (created or removed).

    ``mode`` is the permission to write with; ``None`` keeps the filesystem's own (``/etc/pve``
    accepts no chmod). ``why`` says in a few words what the change is for.
    """

    path: Annotated[str, AfterValidator(check_host_path)]
    before: str | None
    after: str | None
    mode: int | None = None
    why: str = ""

    @property
    def changed(self) -> bool:
        """Whether applying this changes the file."""
        return self.before != self.after


class Action(FrozenModel):
    """A command to run on the host after the files are written; ``why`` says what it is for.

    Journals written before actions lost their ``kind`` (always ``post``) still read:

    >>> Action.model_validate({"argv": ["update-grub"], "kind": "post"})
    Action(argv=['update-grub'], why='')
    """

    argv: list[str]
    why: str = ""

    @model_validator(mode="before")
    @classmethod
    def _drop_old_kind(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "post":
            return {key: value for key, value in data.items() if key != "kind"}
        return data


class ChangeSet(FrozenModel):
    """Everything a plan changes on one host."""

    host: str
    files: list[FileChange] = Field(default_factory=list)
    actions: list[Action] = Field(default_factory=list)
    reboot_required: bool = False
    warnings: list[str] = Field(default_factory=list)
    #: What the change does or assumes, asking nothing of the admin (warnings ask something).
    notes: list[str] = Field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether any file changes (actions alone never count as a change)."""
        return any(f.changed for f in self.files)

    def changed_files(self) -> list[FileChange]:
        """The files that differ, in order."""
        return [f for f in self.files if f.changed]

    def ansible_diff(self) -> list[dict[str, str]]:
        """The diff in Ansible's format: one dict per changed file.

        >>> cs = ChangeSet(host="h", files=[FileChange(path="/x", before=None, after="1\\n")])
        >>> cs.ansible_diff()[0]["before_header"]
        '/x (absent)'
        """
        return [
            {
                "before": f.before or "",
                "after": f.after or "",
                "before_header": f.path if f.before is not None else f"{f.path} (absent)",
                "after_header": f.path if f.after is not None else f"{f.path} (removed)",
            }
            for f in self.changed_files()
        ]

    def unified_diff(self, color: bool = False) -> str:
        """Every changed file as a unified diff, one after another (what ``plan`` shows), for
        a review or a change ticket; ``color`` for a terminal.

        >>> changes = ChangeSet(host="pve1", files=[FileChange(path="/etc/a", before="x\\n",
        ...                                                      after="y\\n", why="w")])
        >>> print(changes.unified_diff(), end="")
        --- /etc/a
        +++ /etc/a
        @@ -1 +1 @@
        -x
        +y
        """
        return "\n".join(unified_diff(change, color) for change in self.changed_files())

    def summary(self) -> str:
        """One line: how many files change, which actions follow, whether to reboot."""
        if not self.changed:
            return "Nothing to do: the host already matches the plan."
        actions = "; ".join(" ".join(a.argv) for a in self.actions) or "none"
        reboot = "reboot required" if self.reboot_required else "no reboot needed"
        count = len(self.changed_files())
        files = "1 file" if count == 1 else f"{count} files"
        return f"{files} to change; then: {actions}; {reboot}."


def unified_diff(change: FileChange, color: bool = False) -> str:
    """A unified diff of one file, optionally coloured for a terminal."""
    before = (change.before or "").splitlines(keepends=True)
    after = (change.after or "").splitlines(keepends=True)
    lines = []
    for line in difflib.unified_diff(
        before,
        after,
        fromfile=change.path if change.before is not None else "/dev/null",
        tofile=change.path if change.after is not None else "/dev/null",
    ):
        complete = line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        lines.append(_colour(complete) if color else complete)
    return "".join(lines)


def _colour(line: str) -> str:
    codes = {"+": "32", "-": "31", "@": "36"}
    code = codes.get(line[:1])
    if code is None or line.startswith(("+++", "---")):
        return line
    return f"\x1b[{code}m{line.rstrip(chr(10))}\x1b[0m\n"
