"""A clone with neither network nor an offline copy of Proxmox's sources: README's test command
stops at once with one line saying how to get them, and a test that needs them fails, never skips.

Each runs pytest itself in a subprocess, as a newcomer would, with ``PROXGPU_PROXMOX_SRC``
naming an empty folder (so neither ``../shared/proxmox-src`` nor the cache is looked at).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.proxmox.sources import ENV, FETCH_COMMAND
from tests.support.trees import REPO


def _pytest(tmp_path: Path, *arguments: str) -> tuple[subprocess.CompletedProcess[str], float]:
    empty = tmp_path / "no-sources"
    empty.mkdir()
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    environment[ENV] = str(empty)
    # A folder of its own for pytest's temporary files: in the shared one, pytest first removes
    # the oldest runs' folders, and after the e2e tier that alone can outlast the timeout.
    basetemp = tmp_path / "basetemp"
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"--basetemp={basetemp}",
            *arguments,
        ],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result, time.monotonic() - started


def test_the_whole_suite_stops_at_once_with_one_line(tmp_path: Path) -> None:
    result, seconds = _pytest(tmp_path)

    assert result.returncode == 4, result.stdout[-2000:]
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ERROR: Proxmox VE's sources")
    assert f"`{FETCH_COMMAND}`" in lines[0] and f"{ENV}=DIR" in lines[0]
    # Before collecting anything: a fresh machine's import of the test modules takes seconds.
    assert seconds < 15


def test_a_named_test_that_needs_them_fails_saying_why_even_outside_ci(tmp_path: Path) -> None:
    result, _ = _pytest(tmp_path, "-q", "tests/unit/test_pve_config.py", "-k", "is_complete")

    assert result.returncode == 1
    assert "1 failed" in result.stdout and "skipped" not in result.stdout
    assert f"set {ENV}=DIR" in result.stdout
