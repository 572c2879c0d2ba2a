"""proxgpu's version, as installed, or as the source checkout's pyproject.toml says.

>>> version() != ""
True
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

# The checkout's pyproject.toml, when this module runs from a source tree that was never installed.
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def version() -> str:
    """The installed distribution's version; in an uninstalled source checkout the one in its
    ``pyproject.toml`` with ``+source`` (it may not be what a build would stamp); else
    ``0+unknown``, never an exception: ``--version`` must not fail.

    >>> import re
    >>> bool(re.match(r"\\d+\\.\\d+", version()))
    True
    """
    try:
        return metadata.version("proxgpu")
    except metadata.PackageNotFoundError:
        pass
    try:
        project = tomllib.loads(PYPROJECT.read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"
    if project.get("name") != "proxgpu" or not isinstance(project.get("version"), str):
        return "0+unknown"
    return f"{project['version']}+source"
