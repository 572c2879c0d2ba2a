"""proxgpu's version: the installed distribution's, or the source checkout's pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from proxgpu.version import version
from tests.support.trees import REPO


def test_installed_version_is_the_distributions() -> None:
    assert version() == metadata.version("proxgpu")


def run_without_site(pythonpath: Path) -> str:
    """version() in an interpreter without site-packages, so with no installed proxgpu."""
    return subprocess.run(
        [sys.executable, "-S", "-c", "from proxgpu.version import version; print(version())"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(pythonpath)},
        cwd=pythonpath,
        timeout=60,
        check=True,
    ).stdout.strip()


def checkout(root: Path) -> Path:
    """A bare source tree: the version module in a package, no metadata beside it."""
    package = root / "proxgpu"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(REPO / "proxgpu" / "version.py", package / "version.py")
    return root


def test_a_source_checkout_reads_its_pyproject(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert run_without_site(root) == f"{project['version']}+source"


def test_without_metadata_or_pyproject_the_version_is_unknown_not_an_error(
    tmp_path: Path,
) -> None:
    root = checkout(tmp_path)
    (root / "pyproject.toml").write_text('[project]\nname = "something-else"\nversion = "9"\n')
    assert run_without_site(root) == "0+unknown"
    (root / "pyproject.toml").unlink()
    assert run_without_site(root) == "0+unknown"
