"""Find the programs the tests run, the way a fresh CI machine has them.

CI runs with a plain PATH (``/usr/sbin:/usr/bin:/sbin:/bin``) and never activates the virtual
environment, so a tool that pip installed beside the interpreter (``ansible-playbook``) is looked
up in ``sys.executable``'s directory first; Debian's tools are found on PATH or in the sbin
directories that a non-login PATH may lack. :func:`require_tool` skips a test whose tool is
absent, or fails it under CI (``CI`` set), where a skip would hide a broken setup.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import pytest

SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def search_path() -> str:
    """The interpreter's own bin directory, then PATH, then the sbin directories."""
    # Not resolved: a venv's python is a symlink to the base interpreter, whose directory
    # holds none of the venv's tools.
    venv_bin = str(Path(sys.executable).parent)
    return os.pathsep.join([venv_bin, os.environ.get("PATH", ""), *SBIN_DIRS])


def find_tool(name: str) -> str | None:
    """The full path of ``name`` (a command name or an absolute path), or None if it is absent."""
    if os.path.isabs(name):
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name, path=search_path())


def require_tool(path: str, package: str) -> str:
    """The full path of a tool (see :func:`find_tool`); else skip, or fail under CI."""
    found = find_tool(path)
    if found:
        return found
    unavailable(f"{path} not found: install Debian's {package}")


def unavailable(message: str) -> NoReturn:
    """Skip the test for want of something it runs, saying how to get it; fail it under CI."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
