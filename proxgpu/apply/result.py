"""What an apply did, or (with ``dry_run``) would do."""

from __future__ import annotations

from pydantic import Field

from proxgpu.apply.rebind import Binding
from proxgpu.model import FrozenModel
from proxgpu.rendering.changes import Action


class ApplyResult(FrozenModel):
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
    files: list[str] = Field(default_factory=list)
    actions: list[Action] = Field(default_factory=list)
    actions_run: list[list[str]] = Field(default_factory=list)
    live: list[Binding] = Field(default_factory=list)
    reboot_required: bool = False
    messages: list[str] = Field(default_factory=list)
