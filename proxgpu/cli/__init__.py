"""The ``proxgpu`` command: parse options, call the library, map its errors to exit codes.

Exit codes: 0 success, 1 other errors, 2 usage, 3 host unreachable, 4 authentication failed,
5 host key unknown or changed, 6 not root, 7 a command on the host failed, 8 a sysfs file
missing or unparsable, 9 plan refused, 10 apply refused before writing (preflight), 11 another
apply holds the lock, 12 apply failed (everything restored), 13 rollback failed, 14 live rebind
failed, 15 journal unreadable, 16 plan cannot be rendered, 17 verify found drift.
``plan --detailed-exitcode`` follows Terraform instead: 0 nothing to change, 2 changes pending,
1 any error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from proxgpu.cli.parser import Handler, build_parser
from proxgpu.errors import ProxgpuError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    detailed = "--detailed-exitcode" in arguments
    try:
        args = build_parser().parse_args(arguments)
    except SystemExit as exc:
        # argparse has printed the problem; with --detailed-exitcode, 2 would mean "changes".
        return 1 if detailed and exc.code else int(exc.code or 0)
    handler: Handler = args.handler
    try:
        return handler(args)
    except ProxgpuError as exc:
        print(f"proxgpu: {exc}", file=sys.stderr)
        return 1 if detailed else exc.exit_code
    except BrokenPipeError:
        # The reader went away (proxgpu ... | head): stop quietly, as other tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("proxgpu: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # A bug, not bad input: still one line, with the traceback one variable away.
        if os.environ.get("PROXGPU_DEBUG"):
            raise
        print(
            f"proxgpu: internal error: {type(exc).__name__}: {exc} "
            "(set PROXGPU_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
