"""``inspect``: the inventory as text or JSON, or (``--tree``, ``--format svg``) as a picture.

It loads only what reading a host needs: the planner, the renderer and Jinja2 come in with the
picture, when one is asked for.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from proxgpu.cli.commandline import CommandLine
from proxgpu.cli.shown import Shown
from proxgpu.cli.text import render_inventory
from proxgpu.host.base import Host
from proxgpu.inspection import inspect
from proxgpu.inspection.document import inventory_document

if TYPE_CHECKING:
    # Only a type here: the fleet's engine (threads, futures) loads with several hosts.
    from proxgpu.fleet import Say


def host_inspect(line: CommandLine, host: Host, say: Say) -> Shown:
    """One host's inventory: its JSON document with ``--json`` (all that is printed then), else
    as text or a picture."""
    inventory = inspect(host, line.gpus)
    if line.json:
        return Shown("", inventory_document(inventory))
    if line.tree or line.format == "svg":
        text = import_module("proxgpu.cli.report").picture_of(inventory, tree=line.tree)
    else:
        text = render_inventory(inventory) + "\n"
    return Shown(text)
