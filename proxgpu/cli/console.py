"""The terminal conventions: colour only where it helps, logging levels, one-line or JSON errors.

Colour follows https://no-color.org and modern CLIs: ``--color auto`` (the default) colours only
a terminal, never with ``NO_COLOR`` set or ``TERM=dumb``; ``always`` and ``never`` override.

>>> wants_color("never", tty=True, environ={})
False
>>> wants_color("auto", tty=True, environ={"NO_COLOR": "1"})
False
>>> wants_color("auto", tty=True, environ={"TERM": "xterm-256color"})
True
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from proxgpu.errors import ProxgpuError, UsageError
from proxgpu.redact import redact_secrets


def wants_color(choice: str, *, tty: bool, environ: Mapping[str, str]) -> bool:
    """Whether to colour output, for ``--color CHOICE`` on a terminal or not."""
    if choice != "auto":
        return choice == "always"
    return tty and "NO_COLOR" not in environ and environ.get("TERM") != "dumb"


class _RedactingFormatter(logging.Formatter):
    """Log lines without a guest config's secrets (``-vv`` may quote host text)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_secrets(super().format(record))


def setup_logging(verbose: int, quiet: bool) -> None:
    """``-v`` says what runs on the host and how long it takes, ``-vv`` more; ``-q`` only errors.

    Log lines go to stderr, so that ``--json`` output stays one document on stdout.
    """
    level = (
        logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter("proxgpu: %(message)s"))
    logger = logging.getLogger("proxgpu")
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False


def error_document(exc: ProxgpuError) -> dict[str, Any]:
    """The JSON document ``--json`` prints on stdout for a failure (same exit code).

    >>> from proxgpu.errors import SysfsError
    >>> error_document(SysfsError("pve1", "/sys/x", "missing"))["error"]["path"]
    '/sys/x'
    """
    return {"error": exc.document()}


def report_error(exc: ProxgpuError, as_json: bool) -> None:
    """Say what failed: one line on stderr, and with ``--json`` the document on stdout."""
    print(f"proxgpu: {exc}", file=sys.stderr)
    if as_json:
        print(json.dumps(error_document(exc), indent=2))


#: ``-o -``: stdout, as for tar, curl and git.
STDOUT = "-"


def write_output(text: str, path: str | None) -> None:
    """``text`` to ``path``, or to stdout without one or with ``-``.

    :raises UsageError: when the file cannot be written.

    >>> write_output("to stdout\\n", STDOUT)
    to stdout
    """
    if path is None or path == STDOUT:
        sys.stdout.write(text)
        return
    # Written beside it and renamed over it: a reader never sees half a file, an interrupted
    # run leaves the old one.
    folder = os.path.dirname(path) or "."
    try:
        descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".proxgpu-")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as out:
                out.write(text)
            os.chmod(temporary, 0o666 & ~_umask())
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        raise UsageError(f"{path}: cannot write: {exc.strerror}") from None


def _umask() -> int:
    # Read by setting it: called once output is written, after every host's thread ended.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
