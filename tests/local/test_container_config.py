"""The container's config after a split: device access for every user, cores as pinned.

Each test takes the ct200 example (inspected once) and changes the one fact it is about.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.planning import SplitPolicy, plan_split
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering import render
from proxgpu.rendering.changes import ChangeSet

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hosts"
CT_200 = "/etc/pve/lxc/200.conf"


@cache
def ct200() -> Inventory:
    return inspect(DirectoryHost(str(EXAMPLES / "ct200")))


def with_configs(configs: dict[str, str]) -> Inventory:
    return ct200().model_copy(update={"guest_configs": {**ct200().guest_configs, **configs}})


def rendered(inventory: Inventory, policy: SplitPolicy) -> ChangeSet:
    return render(inventory, plan_split(inventory, policy))


def after(changes: ChangeSet, path: str) -> str:
    return next(f.after for f in changes.files if f.path == path) or ""


def dev_entries(changes: ChangeSet) -> dict[str, str]:
    entries = GuestConfig.parse(after(changes, CT_200)).entries()
    return {v.split(",")[0]: v for k, v in entries if k.startswith("dev")}


def test_new_nvidia_nodes_are_open_to_every_user_of_the_container_as_on_the_host() -> None:
    devs = dev_entries(rendered(ct200(), SplitPolicy(lxc=200)))
    assert devs["/dev/nvidia0"] == "/dev/nvidia0,mode=0666"
    assert devs["/dev/nvidiactl"] == "/dev/nvidiactl,mode=0666"
    assert all(v.endswith(",mode=0666") for v in devs.values())


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("/dev/nvidia0", "/dev/nvidia0,mode=0666"),
        ("/dev/nvidia0,uid=0", "/dev/nvidia0,uid=0,mode=0666"),
        ("/dev/nvidia0,gid=44", "/dev/nvidia0,gid=44"),
        ("/dev/nvidia0,mode=0660", "/dev/nvidia0,mode=0660"),
        ("/dev/nvidia0,deny-write=1,mode=0640", "/dev/nvidia0,deny-write=1,mode=0640"),
    ],
)
def test_an_access_policy_the_config_states_stays(entry: str, expected: str) -> None:
    text = "arch: amd64\nostype: debian\ndev0: " + entry + "\n"
    devs = dev_entries(rendered(with_configs({CT_200: text}), SplitPolicy(lxc=200)))
    assert devs["/dev/nvidia0"] == expected


def test_new_nodes_take_the_policy_the_gpu_nodes_share() -> None:
    text = "arch: amd64\nostype: debian\ndev0: /dev/nvidia0,gid=44\ndev1: /dev/nvidiactl,gid=44\n"
    devs = dev_entries(rendered(with_configs({CT_200: text}), SplitPolicy(lxc=200)))
    assert devs["/dev/nvidia1"] == "/dev/nvidia1,gid=44"


# --- cores ---------------------------------------------------------------------------------------


def ct_with(line: str) -> Inventory:
    return with_configs({CT_200: f"arch: amd64\nostype: debian\n{line}\n"})


@pytest.mark.parametrize(
    ("before", "warned"), [("cores: 8", True), ("cores: 64", False), ("", False)]
)
def test_cores_match_the_cpus_the_container_is_pinned_to(before: str, warned: bool) -> None:
    changes = rendered(ct_with(before), SplitPolicy(lxc=200))
    config = GuestConfig.parse(after(changes, CT_200))
    pinned = config.get("lxc.cgroup2.cpuset.cpus")
    assert pinned == "0-31"  # ct200's NUMA node 0
    assert config.get("cores") == "32"
    assert any("CT 200: cores 8 becomes 32" in w for w in changes.warnings) == warned
