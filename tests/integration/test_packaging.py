"""proxgpu as installed: a wheel built and installed into a directory of its own, and
``python -m proxgpu``, each run as a separate process from another directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.trees import EXAMPLES, REPO

CT200 = str(EXAMPLES / "ct200")


def test_installed_wheel_works_from_any_directory(tmp_path: Path) -> None:
    """`pip install .` (not editable) must ship the gather script and the templates."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(REPO),
        ],
        check=True,
        cwd=tmp_path,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [
            target / "bin" / "proxgpu",
            "plan",
            "--root",
            CT200,
            "--lxc",
            "200",
            "--vm",
            "300",
            "--json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [g["role"] for g in document["groups"]] == ["host", "vfio"]
    assert document["changes"]["changed"], "the templates were found and rendered"
    location = subprocess.run(
        [sys.executable, "-c", "import proxgpu.templates as t; print(t.__path__[0])"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert location.startswith(str(target)), "the test must exercise the installed copy"


def test_python_dash_m_runs_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxgpu", "inspect", "--root", CT200],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0 and "ct200" in result.stdout
