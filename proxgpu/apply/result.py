"""What an apply did, or (with ``dry_run``) would do."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from proxgpu.apply.rebind import Binding
from proxgpu.rendering.changes import Action

#: What an apply with nothing to write says, in its text and in its JSON alike.
NO_CHANGES = "nothing to do: the host already matches the plan"


@dataclass(frozen=True, kw_only=True)
class ApplyResult:
    """What an apply did (or, with ``dry_run``, would do).

    ``files`` are the paths written; ``actions`` every action of the change set, ``actions_run``
    those that ran (none on a directory tree or in a dry run).

    >>> ApplyResult(host="pve1", changed=False).messages
    []
    """

    host: str
    changed: bool
    dry_run: bool = False
    journal_id: str | None = None
    files: list[str] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    actions_run: list[list[str]] = field(default_factory=list)
    live: list[Binding] = field(default_factory=list)
    reboot_required: bool = False
    messages: list[str] = field(default_factory=list)

    @classmethod
    def unchanged(cls, host: str, live: bool, notes: Sequence[str] = ()) -> ApplyResult:
        """The result of an apply with nothing to write (``live``: one asked to rebind too).

        >>> ApplyResult.unchanged("pve1", live=False).messages
        ['nothing to do: the host already matches the plan']
        """
        messages = [NO_CHANGES, *notes]
        if live:
            # The journal ties a runtime rebind to the files it goes with; with none to write
            # there is no entry to roll it back by.
            messages.append("nothing was rebound: --live acts together with an apply that writes")
        return cls(host=host, changed=False, messages=messages)
