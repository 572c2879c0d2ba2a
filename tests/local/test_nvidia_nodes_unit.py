"""The systemd unit that makes the container's NVIDIA device nodes before Proxmox starts guests.

What nvidia-modprobe makes for each command is its documented behaviour: ``-c N`` makes
``/dev/nvidiaN`` (N 255 is ``/dev/nvidiactl``), ``-u -c N`` loads nvidia-uvm and makes
``/dev/nvidia-uvm`` (minor N) and ``/dev/nvidia-uvm-tools`` (N+1), ``-m`` loads nvidia-modeset
and makes ``/dev/nvidia-modeset``. systemd's own ``systemd-analyze verify`` checks the files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

from proxgpu.apply import rollback
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.pipeline import split_host
from proxgpu.planning import SplitPolicy, plan_split
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering import RenderOptions, render
from proxgpu.rendering.changes import ChangeSet
from proxgpu.rendering.nodes import GUESTS_DROPIN, NODES_UNIT
from tests.support.tools import find_tool

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hosts"
CT_200 = "/etc/pve/lxc/200.conf"
WITH_UNIT = RenderOptions(nvidia_nodes_unit=True)


@cache
def ct200() -> Inventory:
    return inspect(DirectoryHost(str(EXAMPLES / "ct200")))


def rendered(policy: SplitPolicy, inventory: Inventory | None = None) -> ChangeSet:
    inventory = inventory or ct200()
    return render(inventory, plan_split(inventory, policy), WITH_UNIT)


def text(changes: ChangeSet, path: str) -> str | None:
    return next(f.after for f in changes.files if f.path == path)


def made_by(unit: str) -> set[str]:
    """The nodes the unit's nvidia-modprobe commands make, as nvidia-modprobe documents it."""
    made: set[str] = set()
    for line in re.findall(r"^ExecStart=/usr/bin/nvidia-modprobe (.*)$", unit, re.MULTILINE):
        words = line.split()
        minor = int(words[words.index("-c") + 1]) if "-c" in words else None
        if "-u" in words:
            made |= {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
        elif "-m" in words:
            made.add("/dev/nvidia-modeset")
        elif minor is not None:
            made.add("/dev/nvidiactl" if minor == 255 else f"/dev/nvidia{minor}")
    return made


def given_nodes(changes: ChangeSet) -> set[str]:
    config = GuestConfig.parse(text(changes, CT_200) or "")
    return {v.split(",")[0] for k, v in config.entries() if re.fullmatch(r"dev\d+", k)}


@pytest.mark.parametrize(
    "policy",
    [SplitPolicy(lxc=200), SplitPolicy(lxc=200, host_nodes=[1], vfio_nodes=[0])],
    ids=["same-minors", "renumbered-minors"],
)
def test_the_unit_makes_every_nvidia_node_the_container_is_given(policy: SplitPolicy) -> None:
    changes = rendered(policy)
    unit = text(changes, NODES_UNIT)
    assert unit is not None
    assert given_nodes(changes) == made_by(unit)


def test_the_dropin_pulls_the_unit_in_and_orders_the_guests_after_it() -> None:
    changes = rendered(SplitPolicy(lxc=200))
    dropin, unit = text(changes, GUESTS_DROPIN), text(changes, NODES_UNIT)
    assert dropin is not None and unit is not None
    assert GUESTS_DROPIN.startswith("/etc/systemd/system/pve-guests.service.d/")
    name = Path(NODES_UNIT).name
    assert re.search(rf"^Wants={re.escape(name)}$", dropin, re.MULTILINE)
    assert re.search(rf"^After={re.escape(name)}$", dropin, re.MULTILINE)
    assert re.search(r"^Before=pve-guests\.service$", unit, re.MULTILINE)
    assert ["systemctl", "daemon-reload"] in [a.argv for a in changes.actions]


def test_the_unit_is_written_unless_turned_off() -> None:
    inventory = ct200()
    plan = plan_split(inventory, SplitPolicy(lxc=200))
    assert {NODES_UNIT, GUESTS_DROPIN} <= {f.path for f in render(inventory, plan).files}
    off = render(inventory, plan, RenderOptions(nvidia_nodes_unit=False))
    assert {NODES_UNIT, GUESTS_DROPIN}.isdisjoint(f.path for f in off.files)


def test_a_container_left_without_nvidia_gpus_loses_the_unit() -> None:
    first = rendered(SplitPolicy(lxc=200))
    written = {path: text(first, path) or "" for path in (NODES_UNIT, GUESTS_DROPIN)}
    # As inspection sees the host once the unit is there and the GPUs moved to another driver.
    gpus = [g.model_copy(update={"driver": "amdgpu"}) for g in ct200().gpus]
    files = {**ct200().host_files, **written}
    inventory = ct200().model_copy(update={"host_files": files, "gpus": gpus})
    changes = rendered(SplitPolicy(lxc=200, host_gpus=["0000:01:00.0"]), inventory)
    assert text(changes, NODES_UNIT) is None and text(changes, GUESTS_DROPIN) is None


def test_systemd_accepts_the_unit_and_the_dropin(tmp_path: Path) -> None:
    analyze = find_tool("systemd-analyze")
    if analyze is None:
        message = "systemd-analyze not found: install Debian's systemd"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    root = tmp_path / "root"
    changes = rendered(SplitPolicy(lxc=200))
    for path in (NODES_UNIT, GUESTS_DROPIN):
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text(changes, path) or "")
    units = root / "usr/lib/systemd/system"
    units.mkdir(parents=True)
    for target in Path("/usr/lib/systemd/system").glob("*.target"):
        shutil.copy(target, units)
    (units / "pve-guests.service").write_text(
        "[Unit]\nDescription=PVE guests\n[Service]\nType=oneshot\nExecStart=/usr/bin/pvesh\n"
    )
    for tool in ("nvidia-modprobe", "pvesh"):
        stub = root / "usr/bin" / tool
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    for unit in (Path(NODES_UNIT).name, "pve-guests.service"):
        result = subprocess.run(
            [analyze, "verify", f"--root={root}", unit],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "proxgpu" not in result.stderr, result.stderr


def test_rollback_removes_the_unit_an_apply_wrote(tmp_path: Path) -> None:
    root = tmp_path / "ct200"
    shutil.copytree(EXAMPLES / "ct200", root, symlinks=True)
    host = DirectoryHost(str(root))
    split_host(host, SplitPolicy(lxc=200), WITH_UNIT, check=False)
    unit, dropin = root / NODES_UNIT.lstrip("/"), root / GUESTS_DROPIN.lstrip("/")
    assert unit.is_file() and dropin.is_file()
    rollback(host)
    assert not unit.exists() and not dropin.exists()
    assert not dropin.parent.exists(), "the drop-in directory the apply made goes too"
