"""proxgpu installed as a user installs it, for the start-up benchmarks: a fresh virtual
environment with ``pip install .``, not the checkout's editable install, whose import finder
(a ``.pth`` file run at every start) adds about 10 ms to every Python process, the floor's too,
and so shrinks every ratio to it.

The environment gets the checkout's dependencies by copying its ``site-packages`` without the
editable install (so nothing is downloaded and the versions are the tested ones), then
``pip install --no-deps --no-build-isolation .`` builds and installs proxgpu from the checkout.
"""

from __future__ import annotations

import compileall
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@contextmanager
def plain_install() -> Iterator[Path]:
    """The ``bin`` folder of a fresh environment holding a plain install of the checkout."""
    with tempfile.TemporaryDirectory(prefix="proxgpu-plain-") as folder:
        env = Path(folder) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
        site = Path(sysconfig.get_paths()["purelib"])
        (target,) = env.glob("lib/python*/site-packages")
        shutil.copytree(site, target, dirs_exist_ok=True, ignore=_editable)
        python = env / "bin" / "python"
        install = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        subprocess.run([*install, "--no-build-isolation", str(REPO)], check=True, cwd=folder)
        # Byte-compiled as pip compiles what it installs: where PYTHONDONTWRITEBYTECODE is set
        # (as in some CI and container environments) each run would compile every module again.
        compileall.compile_dir(target, quiet=1)
        yield env / "bin"


def _editable(folder: str, names: list[str]) -> set[str]:
    """The editable install's files (and proxgpu's own metadata), left out of the copy."""
    return {n for n in names if n.startswith(("__editable__", "proxgpu-"))}
