"""The ``proxgpu`` command: parse options, call the library, map its errors to exit codes.

Each error's exit code comes from its class in :mod:`proxgpu.errors` (docs/exit-codes.md lists
them); ``--detailed-exitcode`` follows Terraform instead: 0 nothing to change, 2 changes pending,
1 any error. With ``--json`` a failure also prints ``{"error": {...}}`` on stdout.

Only the parser is imported before the options are read, so that ``--help`` and a mistyped
option cost little more than starting Python; :mod:`~proxgpu.cli.dispatch` runs the command.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from importlib import import_module

from proxgpu.cli.parser import parser_for
from proxgpu.errors import UsageError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser_for(arguments).parse_args(arguments)
    except UsageError as exc:
        return int(import_module("proxgpu.cli.dispatch").refuse(exc, arguments))
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0)
    detailed = "--detailed-exitcode" in arguments
    return int(import_module("proxgpu.cli.dispatch").run(args, detailed))


def entry() -> int:
    """The installed ``proxgpu`` command and ``python -m proxgpu``: :func:`main`, then the
    process ends. Everything the command made lives until then, so the collector is told to
    leave it alone (``gc.freeze``): it would otherwise walk every object once more as the
    interpreter shuts down, about 20 ms of each command's exit. Not in :func:`main`, which
    tests and scripts call in a process that goes on."""
    code = main()
    gc.freeze()
    return code
