"""A real ansible-playbook run against this machine (``-c local``), with proxgpu importable from
the checkout and Python the interpreter running the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.tools import require_tool
from tests.support.trees import REPO


def ansible_playbook(
    playbook: Path,
    scratch: Path,
    *args: str,
    library: Path | str | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``playbook`` on localhost; ``library`` is ANSIBLE_LIBRARY, ``scratch`` holds Ansible's
    temp files. The result is returned whatever its exit status."""
    ansible = require_tool("ansible-playbook", "ansible-core (pip install ansible-core)")
    env = {
        **os.environ,
        "ANSIBLE_LOCAL_TEMP": str(scratch / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "1",
        "PYTHONPATH": str(REPO),
    }
    if library is not None:
        env["ANSIBLE_LIBRARY"] = str(library)
    argv = [ansible, "-i", "localhost,", "-c", "local"]
    # The tests run as whoever runs them; become would need sudo.
    argv += ["-e", "ansible_become=false", "-e", f"ansible_python_interpreter={sys.executable}"]
    return subprocess.run(
        [*argv, *args, str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
        cwd=cwd,
    )
