"""The ``proxgpu.pve`` Ansible collection as the tests run it: real ansible-playbook, ansible,
ansible-doc and ansible-galaxy (beside the interpreter running the tests), finding the collection
through ANSIBLE_COLLECTIONS_PATH, and an inventory of loopback sshd hosts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support.sshd import Sshd
from tests.support.tools import require_tool
from tests.support.trees import REPO

#: What ANSIBLE_COLLECTIONS_PATH names for the collection kept in the repository.
COLLECTIONS = REPO / "collection"
COLLECTION = COLLECTIONS / "ansible_collections" / "proxgpu" / "pve"


def ansible(
    tool: str, scratch: Path, *args: str, collections: Path = COLLECTIONS, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``tool`` (``ansible-playbook``, ``ansible-doc``...) with the collection found in
    ``collections``; ``scratch`` holds Ansible's own files. The result whatever its status."""
    program = require_tool(tool, "ansible-core (pip install ansible-core)")
    # The SSH control sockets: a short directory, as a socket path has at most 107 bytes.
    with tempfile.TemporaryDirectory(prefix="cp", dir="/tmp") as control:
        return _run([program, *args], collections, scratch, control, env)


def _run(
    argv: list[str], collections: Path, scratch: Path, control: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_LOCAL_TEMP": str(scratch / "ansible-tmp"),
        "ANSIBLE_HOME": str(scratch / "ansible-home"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": control,
        # Masters that outlive the run close soon after it, not a minute later.
        "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=5s",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "PYTHONPATH": str(REPO),
        **env,
    }
    return subprocess.run(
        argv, capture_output=True, text=True, env=environment, timeout=300, check=False
    )


def ssh_config(path: Path, hosts: dict[str, tuple[Sshd, str | None]]) -> Path:
    """An ssh_config at ``path`` naming each host: its server and the host to jump through
    (ProxyJump), each server's key pinned."""
    blocks = [
        f"Host {name}\n  HostName 127.0.0.1\n  Port {server.port}\n  User {server.user}\n"
        f"  IdentityFile {server.identity_file}\n  UserKnownHostsFile {server.known_hosts}\n"
        "  StrictHostKeyChecking yes\n  BatchMode yes\n" + (f"  ProxyJump {jump}\n" if jump else "")
        for name, (server, jump) in hosts.items()
    ]
    path.write_text("".join(blocks))
    return path


def inventory(path: Path, config: Path, hosts: dict[str, dict[str, Any]]) -> Path:
    """An inventory (JSON is YAML) at ``path``: every host reached through ``config``, with its
    own variables."""
    document = {
        "all": {
            "vars": {"ansible_ssh_common_args": f"-F {config}", "ansible_become": False},
            "hosts": hosts,
        }
    }
    path.write_text(json.dumps(document, indent=1))
    return path


def recap(output: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP counters, by host."""
    counters = {}
    for line in output[output.index("PLAY RECAP") :].splitlines()[1:]:
        if " : " in line:
            name, _, rest = line.partition(" : ")
            counters[name.strip()] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", rest)}
    return counters


def adhoc_results(output: str) -> dict[str, dict[str, Any]]:
    r"""Each host's result in the output of an ad-hoc ``ansible`` run (``HOST | SUCCESS => {...}``).

    >>> adhoc_results('pve1 | SUCCESS => {\n    "changed": false\n}\nnoise\n')
    {'pve1': {'changed': False}}
    """
    decoder = json.JSONDecoder()
    return {
        match[1]: decoder.raw_decode(output, match.end())[0]
        for match in re.finditer(r"^(\S+) \| [A-Z!]+ => ", output, re.MULTILINE)
    }
