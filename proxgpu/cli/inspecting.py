"""``inspect``: the inventory as text or JSON, or (``--tree``, ``--format svg``) as a picture.

It loads only what reading a host needs: the planner, the renderer and Jinja2 come in with the
picture, when one is asked for.
"""

from __future__ import annotations

import argparse
import json
from importlib import import_module

from proxgpu.cli.console import write_output
from proxgpu.cli.setup import read_inventory
from proxgpu.cli.text import render_inventory
from proxgpu.errors import UsageError
from proxgpu.inspection.document import inventory_document


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print the host's inventory."""
    inventory = read_inventory(args)
    if args.json and (args.tree or args.format != "text"):
        raise UsageError("--json prints the inventory: leave out --tree and --format svg")
    if args.json:
        text = json.dumps(inventory_document(inventory), indent=2) + "\n"
    elif args.tree or args.format == "svg":
        text = import_module("proxgpu.cli.report").picture_of(inventory, tree=args.tree)
    else:
        text = render_inventory(inventory) + "\n"
    write_output(text, args.output)
    return 0
