"""proxgpu's own command line run against a test host, as an admin runs it: over SSH, with the
host key pinned, each command timed as a phase of the running test (``phases.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .phases import phase
from .testhost import QemuTestHost

COMMAND_TIMEOUT_S = 600.0


def proxgpu(
    host: QemuTestHost, tmp_path: Path, *args: str, timeout: float = COMMAND_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run the real ``proxgpu`` command line against ``host``; its phase is "proxgpu COMMAND"."""
    ssh_config = tmp_path / "empty_ssh_config"
    ssh_config.touch()
    target = ["--host", f"{host.user}@127.0.0.1:{host.port}", "-i", str(host.identity_file)]
    target += ["--known-hosts", str(host.known_hosts), "--ssh-config", str(ssh_config)]
    argv = [sys.executable, "-m", "proxgpu", *args, *target]
    with phase(f"proxgpu {args[0]}"):
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def json_of(result: subprocess.CompletedProcess[str]) -> Any:
    """The JSON document a command printed, once it is known to have exited 0."""
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
