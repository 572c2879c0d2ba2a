"""Stand-ins for tools that cannot run here: Proxmox's pvesh and NVIDIA's nvidia-smi.

Proxmox VE cannot be installed on this machine and there is no NVIDIA GPU, so the tests that need
these commands put small scripts first on PATH. Each prints only what the real tool prints (the
shapes pve-manager's pvesh and NVIDIA's nvidia-smi document), and says so where it is used.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest


def fake_tool(directory: Path, name: str, script: str) -> Path:
    """Write an executable shell script ``name`` into ``directory``."""
    directory.mkdir(exist_ok=True)
    tool = directory / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    return tool


_FAKE_PVESH = r"""
import hashlib, json, os, sys
from pathlib import Path

here = Path(__file__).resolve().parent
root = Path(ROOT)
args = sys.argv[1:]
with open(here / "pvesh.log", "a") as log:
    log.write(json.dumps(args) + "\n")
verb, parts, rest = args[0], args[1].strip("/").split("/"), args[2:]
options = {}
while rest:
    name, value, rest = rest[0], rest[1], rest[2:]
    if name != "--output-format":
        options[name.lstrip("-")] = value
if verb == "get" and len(parts) == 6 and parts[4:] == ["status", "current"]:
    status = here / f"status-{parts[3]}"
    print(json.dumps({"status": status.read_text().strip() if status.exists() else "stopped"}))
    sys.exit(0)
if verb == "set" and len(parts) == 5 and parts[2] == "qemu" and parts[4] == "config":
    conf = root / "etc/pve/qemu-server" / f"{parts[3]}.conf"
    data = conf.read_bytes()
    if options.pop("digest", None) not in (None, hashlib.sha1(data).hexdigest()):
        sys.stderr.write(
            "400 Parameter verification failed.\n"
            "digest: detected modified configuration - file changed by other user? Try again.\n"
        )
        sys.exit(255)
    lines = data.decode().split("\n")
    end = next((i for i, l in enumerate(lines) if l.startswith("[")), len(lines))
    comments = [l for l in lines[:end] if l.startswith("#")]
    keys = dict(l.split(": ", 1) for l in lines[:end] if ": " in l and not l.startswith("#"))
    for key in options.pop("delete", "").split(","):
        keys.pop(key, None)
    keys.update(options)
    out = "".join(f"{l}\n" for l in comments) + "".join(f"{k}: {keys[k]}\n" for k in sorted(keys))
    if end < len(lines):
        out += "\n" + "\n".join(lines[end:])
    tmp = conf.with_name(f"{conf.name}.tmp.{os.getpid()}")
    tmp.write_text(out)
    tmp.rename(conf)
    sys.exit(0)
sys.stderr.write(f"the stand-in pvesh does not answer {args}\n")
sys.exit(2)
"""


def fake_pvesh(directory: Path, root: Path | None = None) -> Path:
    """A stand-in for Proxmox's pvesh, which cannot be installed here (see the module docstring).

    The status of a guest is ``stopped`` unless a file ``status-<vmid>`` next to it says
    otherwise; ``set`` rewrites the VM configs under ``root`` (default: the tree ``host`` next to
    ``directory``, where the ``root`` fixture copies ct200). Every call is logged, one JSON
    argument list a line, to ``pvesh.log`` next to it.
    """
    directory.mkdir(exist_ok=True)
    where = root if root is not None else directory.parent / "host"
    tool = directory / "pvesh"
    tool.write_text(f"#!{sys.executable}\n" + _FAKE_PVESH.replace("ROOT", repr(str(where)), 1))
    tool.chmod(0o755)
    return tool


def pvesh_calls(directory: Path) -> list[list[str]]:
    """The argument lists the stand-in pvesh in ``directory`` was called with, in order."""
    log = directory / "pvesh.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def on_path(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Put ``directory`` first on PATH for the commands a LocalHost runs."""
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")


def fake_nvidia_smi(directory: Path, persistence: dict[str, str]) -> None:
    """A stand-in for nvidia-smi: it prints only what ``--query-gpu=pci.bus_id,persistence_mode
    --format=csv,noheader`` prints, the bus id with its 8-digit upper-case domain."""
    rows = "".join(f"00000000:{a[5:].upper()}, {mode}\\n" for a, mode in persistence.items())
    fake_tool(directory, "nvidia-smi", f"printf '{rows}'\n")
