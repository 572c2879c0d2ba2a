"""``inspect``: the inventory as text or JSON, or (``--tree``, ``--format svg``) as a picture.

It loads only what reading a host needs: the planner, the renderer and Jinja2 come in with the
picture, when one is asked for.
"""

from __future__ import annotations

import argparse
from importlib import import_module
from typing import TYPE_CHECKING

from proxgpu.cli.setup import gpu_filter
from proxgpu.cli.shown import Shown, run_one
from proxgpu.cli.text import render_inventory
from proxgpu.errors import UsageError
from proxgpu.host.base import Host
from proxgpu.inspection import inspect
from proxgpu.inspection.document import inventory_document

if TYPE_CHECKING:
    # Only a type here: the fleet's engine (threads, futures) loads with several hosts.
    from proxgpu.fleet import Say


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print the host's inventory."""
    check_inspect(args)
    return run_one(args, host_inspect, args.output)


def check_inspect(args: argparse.Namespace) -> None:
    """Refuse options that cannot go together, before any host is read."""
    if args.json and (args.tree or args.format != "text"):
        raise UsageError("--json prints the inventory: leave out --tree and --format svg")


def host_inspect(args: argparse.Namespace, host: Host, say: Say) -> Shown:
    """One host's inventory: its JSON document with ``--json`` (all that is printed then), else
    as text or a picture."""
    inventory = inspect(host, gpu_filter(args))
    if args.json:
        return Shown("", inventory_document(inventory))
    if args.tree or args.format == "svg":
        text = import_module("proxgpu.cli.report").picture_of(inventory, tree=args.tree)
    else:
        text = render_inventory(inventory) + "\n"
    return Shown(text)
