"""``.ci/venv``: README's second command works after its first whatever python3 made ``.venv``.

Each test runs the real script with a real python3 (this interpreter's base, a pyenv build on
this project's machines) first on PATH. A venv command 1 made with another working interpreter
(Debian's /usr/bin/python3) is reused; one whose ``pyvenv.cfg`` and ``bin/python`` name a pyenv
Python that is not there (removed since, or another machine's) is remade.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.trees import REPO

SCRIPT = REPO / ".ci" / "venv"
#: README's command 1 runs Debian's python3 on a fresh machine.
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def path(tmp_path: Path) -> str:
    """PATH with this interpreter's base python3 first (never the project's own venv)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (bin_dir / "python3").symlink_to(base)
    return f"{bin_dir}:/usr/bin:/bin"


def run(command: list[str], cwd: Path, path: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PATH": path}
    environment.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300, check=False
    )


def foreign_venv(checkout: Path) -> Path:
    venv = checkout / ".venv"
    (venv / "bin").mkdir(parents=True)
    gone = "/opt/pyenv/versions/3.12.1/bin"
    (venv / "pyvenv.cfg").write_text(f"home = {gone}\ninclude-system-site-packages = false\n")
    (venv / "bin" / "python").symlink_to(f"{gone}/python3.12")
    (venv / "bin" / "python3").symlink_to("python")
    return venv


def pip_version(checkout: Path, path: str) -> subprocess.CompletedProcess[str]:
    return run([str(checkout / ".venv/bin/python"), "-m", "pip", "--version"], checkout, path)


def test_a_venv_of_an_interpreter_that_is_gone_is_remade(tmp_path: Path, path: str) -> None:
    checkout = tmp_path / "checkout"
    venv = foreign_venv(checkout)
    # What .ci/run did before: venv over it dies in ensurepip.
    assert run(["python3", "-m", "venv", ".venv"], checkout, path).returncode != 0

    result = run(["bash", str(SCRIPT), str(checkout)], tmp_path, path)

    assert result.returncode == 0, result.stderr
    assert "remade" in result.stdout
    home = (venv / "pyvenv.cfg").read_text()
    assert f"home = {path.split(':', maxsplit=1)[0]}\n" in home
    assert pip_version(checkout, path).returncode == 0


def test_a_working_venv_of_another_interpreter_is_reused_as_it_is(
    tmp_path: Path, path: str
) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    assert run([SYSTEM_PYTHON, "-m", "venv", ".venv"], checkout, path).returncode == 0
    installed = checkout / ".venv" / "installed-by-command-1"
    installed.write_text("kept\n")

    result = run(["bash", str(SCRIPT), str(checkout)], tmp_path, path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(".venv: reused")
    assert installed.read_text() == "kept\n"
    assert "home = /usr/bin\n" in (checkout / ".venv" / "pyvenv.cfg").read_text()


def test_a_venv_without_pip_is_remade_with_it(tmp_path: Path, path: str) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    run(["python3", "-m", "venv", "--without-pip", ".venv"], checkout, path)
    assert pip_version(checkout, path).returncode != 0

    result = run(["bash", str(SCRIPT), str(checkout)], tmp_path, path)

    assert result.returncode == 0, result.stderr
    assert pip_version(checkout, path).returncode == 0
