"""Stand-ins for tools that cannot run here: Proxmox's pvesh, LXC's lxc-info and NVIDIA's
nvidia-smi, and the host over SSH (:class:`ToolsHost`) whose commands find them first.

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

from proxgpu.host.base import CommandResult
from proxgpu.host.ssh import SSHHost, SSHOptions

#: What sshd gives root's commands; the stand-ins go first.
REMOTE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def fake_tool(directory: Path, name: str, script: str) -> Path:
    """Write an executable shell script ``name`` into ``directory``."""
    directory.mkdir(exist_ok=True)
    tool = directory / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    return tool


class ToolsHost(SSHHost):
    """A tree over SSH taken as a live host, its commands finding the stand-ins in ``tools``
    first."""

    def __init__(self, target: str, options: SSHOptions | None, root: str, tools: Path) -> None:
        super().__init__(target, options, root=root, live=True)
        self.tools = tools

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float) -> CommandResult:
        return super()._run(("env", f"PATH={self.tools}:{REMOTE_PATH}", *argv), stdin, timeout)


_FAKE_PVESH = r"""
import hashlib, json, os, sys
from pathlib import Path

here = Path(__file__).resolve().parent


def sections(text):
    # pci.cfg as PVE::Mapping::PCI (a SectionConfig) reads it: {id: {key: value, map: [...]}}.
    found, current = {}, None
    for line in text.split("\n"):
        if not line.strip():
            current = None
        elif current is None and not line[0].isspace() and not line.startswith("#"):
            current = found.setdefault(line.strip(), {"map": []})
        elif current is not None and line[0].isspace():
            key, _, value = line.strip().partition(" ")
            if key == "map":
                current["map"].append(value.strip())
            else:
                current[key] = value.strip()
    return found


def written(found):
    # As SectionConfig's write_config writes it: the id, the required map lines, then the
    # optional keys sorted, a blank line after each id.
    out = ""
    for name, data in found.items():
        out += name + "\n" + "".join(f"\tmap {m}\n" for m in data["map"])
        out += "".join(f"\t{k} {v}\n" for k, v in sorted(data.items()) if k != "map")
        out += "\n"
    return out


def mapping(verb, name, options, maps):
    # /cluster/mapping/pci as pve-manager's PVE/API2/Cluster/Mapping/PCI.pm answers it.
    cfg = root / "etc/pve/mapping/pci.cfg"
    race = here / "mapping-race"
    if verb != "get" and race.exists():
        # Another admin's write lands just before this one takes pmxcfs' lock.
        cfg.write_text(cfg.read_text() + race.read_text())
        race.unlink()
    data = cfg.read_bytes() if cfg.exists() else b""
    found = sections(data.decode())
    digest = hashlib.sha1(data).hexdigest()
    bad = [m for m in maps if not {"node", "path", "id"} <= {p.split("=")[0] for p in m.split(",")}]
    if bad:
        sys.stderr.write(f"400 Parameter verification failed.\nmap: missing property - {bad[0]}\n")
        return 255
    if verb == "get":
        if name not in found:
            sys.stderr.write(f"mapping '{name}' not found\n")
            return 255
        print(json.dumps({**found[name], "type": "pci", "digest": digest}))
        return 0
    if verb == "create":
        if name in found:
            sys.stderr.write(f"create hardware mapping failed: pci ID '{name}' already defined\n")
            return 255
        found[name] = {**options, "map": maps}
    elif verb == "set":
        if options.get("digest", digest) != digest:
            sys.stderr.write(
                "update hardware mapping failed: detected modified configuration - file "
                "changed by other user? Try again.\n"
            )
            return 255
        if name not in found:
            sys.stderr.write(f"update hardware mapping failed: pci ID '{name}' does not exist\n")
            return 255
        options.pop("digest", None)
        for key in options.pop("delete", "").replace(";", ",").split(","):
            found[name].pop(key, None)
        found[name].update(options)
        if maps:
            found[name]["map"] = maps
    elif verb == "delete":
        found.pop(name, None)
    cfg.parent.mkdir(parents=True, exist_ok=True)
    tmp = cfg.with_name(f"{cfg.name}.tmp.{os.getpid()}")
    tmp.write_text(written(found))
    tmp.rename(cfg)
    return 0

root = Path(ROOT)
args = sys.argv[1:]
with open(here / "pvesh.log", "a") as log:
    log.write(json.dumps(args) + "\n")
verb, parts, rest = args[0], args[1].strip("/").split("/"), args[2:]
options = {}
maps = []  # an array parameter: pvesh takes one --map per item
while rest:
    name, value, rest = rest[0], rest[1], rest[2:]
    if name == "--map":
        maps.append(value)
    elif name != "--output-format":
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
if parts[:3] == ["cluster", "mapping", "pci"]:
    sys.exit(mapping(verb, parts[3] if len(parts) == 4 else options.pop("id", ""), options, maps))
sys.stderr.write(f"the stand-in pvesh does not answer {args}\n")
sys.exit(2)
"""


def fake_pvesh(directory: Path, root: Path | None = None) -> Path:
    """A stand-in for Proxmox's pvesh, which cannot be installed here (see the module docstring).

    The status of a guest is ``stopped`` unless a file ``status-<vmid>`` next to it says
    otherwise; ``set`` rewrites the VM configs under ``root`` (default: the tree ``host`` next to
    ``directory``, where the ``root`` fixture copies ct200). ``get``, ``set``, ``create`` and
    ``delete`` of ``/cluster/mapping/pci/ID`` read and rewrite ``root``'s
    ``etc/pve/mapping/pci.cfg`` as Proxmox does (the whole file in its own order; ``set``
    refused unless ``--digest`` is the SHA-1 of the file); a file ``mapping-race`` next to it
    is appended to the mapping file just before the next write, as another admin's edit that
    lands first. Every call is logged, one JSON argument list a line, to ``pvesh.log`` next to
    it.
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


# nvidia-smi's outputs with MIG devices, as NVIDIA's MIG user guide shows them ("Getting Started
# with MIG": the compute instances example, three MIG devices in GPU instance 1 whose table rows
# share one memory cell, with the guide's UUIDs; "CUDA Device Enumeration": the -L layout, each
# GPU's MIG devices under it).
MIG_GPU0 = "GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0"
MIG_GPU1 = "GPU-0aa11ebd-627f-af3f-1a0d-4e1fd92fd7b0"
MIG_CI = [
    "MIG-c7384736-a75d-5afc-978f-d2f1294409fd",
    "MIG-c376546e-7559-5610-9721-124e8dbb1bc8",
    "MIG-928edfb0-898f-53bd-bf24-c7e5d08a6852",
]
MIG_LISTING = f"""\
GPU 0: A100-SXM4-40GB (UUID: {MIG_GPU0})
  MIG 1c.3g.20gb  Device  0: (UUID: {MIG_CI[0]})
  MIG 1c.3g.20gb  Device  1: (UUID: {MIG_CI[1]})
  MIG 1c.3g.20gb  Device  2: (UUID: {MIG_CI[2]})
"""
MIG_TABLE = """\
+-----------------------------------------------------------------------------+
| MIG devices:                                                                |
+------------------+----------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |         Memory-Usage |        Vol|         Shared        |
|      ID  ID  Dev |                      | SM     Unc| CE  ENC  DEC  OFA  JPG|
|                  |                      |        ECC|                       |
|==================+======================+===========+=======================|
|  0    1   0   0  |     11MiB / 20224MiB | 14      0 |  3   0    2    0    0 |
+------------------+                      +-----------+-----------------------+
|  0    1   1   1  |                      | 14      0 |  3   0    2    0    0 |
+------------------+                      +-----------+-----------------------+
|  0    1   2   2  |                      | 14      0 |  3   0    2    0    0 |
+------------------+----------------------+-----------+-----------------------+
+-----------------------------------------------------------------------------+
| Processes:                                                                  |
|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |
|        ID   ID                                                   Usage      |
|=============================================================================|
|    0    1    0      59785      C   ./BlackScholes                   153MiB |
|    0    1    1      59796      C   ./BlackScholes                   153MiB |
+-----------------------------------------------------------------------------+
"""


def mig_nvidia_smi(directory: Path) -> None:
    """A stand-in for nvidia-smi on a host with MIG devices: ``-L`` prints
    :data:`MIG_LISTING`, a plain run :data:`MIG_TABLE`."""
    (directory / "nvidia-smi-L.txt").parent.mkdir(parents=True, exist_ok=True)
    (directory / "nvidia-smi-L.txt").write_text(MIG_LISTING)
    (directory / "nvidia-smi.txt").write_text(MIG_TABLE)
    fake_tool(
        directory,
        "nvidia-smi",
        f'if [ "$1" = -L ]; then cat {directory}/nvidia-smi-L.txt; '
        f"else cat {directory}/nvidia-smi.txt; fi\n",
    )
