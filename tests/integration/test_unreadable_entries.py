"""The device entries a plan says Proxmox cannot read are exactly those Proxmox's own parsers
(qemu-server's and pve-container's, through tests/proxmox/harness) refuse to load."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from proxgpu.planning import SplitPolicy, plan_split
from tests.support.pvevalidate import Mode, validate
from tests.support.trees import inspect_example

HOSTPCI = [
    "0000:81:00.0,pcie=1",
    "81:00",
    "0000:81:00.0;0000:81:00.1",
    "mapping=gpus,pcie=1",
    "0000:81:0",
    "0000:C1:00.0",
    "0000:81:00.0;81",
    "host=0000:81:00.0,pcie",
]
DEV = ["/dev/nvidia0,mode=0666", "/dev/dri/renderD128,gid=44", "/dev/../etc/shadow", "nvidia0"]


def refused_keys(kind: Mode, path: Path) -> set[str]:
    """The keys Proxmox's parser leaves out of the config at ``path``, by its own messages."""
    failures = validate([(kind, path)], parser_only=True)[path].failures
    return {m[1] for message in failures for m in re.finditer(r"value of '(\w+)'", message)}


@pytest.mark.parametrize(
    ("kind", "policy", "key", "values"),
    [
        ("qemu", SplitPolicy(lxc=200, vms=[(300, None)]), "hostpci", HOSTPCI),
        ("lxc", SplitPolicy(lxc=200, vms=[(300, None)]), "dev", DEV),
    ],
)
def test_the_entries_said_unreadable_are_those_proxmox_leaves_out(
    tmp_path: Path, kind: Mode, policy: SplitPolicy, key: str, values: list[str]
) -> None:
    inventory = inspect_example("ct200")
    path = "/etc/pve/qemu-server/300.conf" if kind == "qemu" else "/etc/pve/lxc/200.conf"
    # Numbers past any entry the plan writes (qemu-server has hostpci0 to hostpci15).
    lines = [f"{key}{8 + n}: {value}" for n, value in enumerate(values)]
    text = "\n".join(lines) + "\n" + inventory.guest_configs[path]
    config = tmp_path / Path(path).name
    config.write_text(text)
    configs = {**inventory.guest_configs, path: text}
    plan = plan_split(replace(inventory, guest_configs=configs), policy)
    said = {m[1] for w in plan.warnings if (m := re.search(r"^(?:VM|CT) \d+: (\w+): ", w))}
    refused = refused_keys(kind, config)
    assert refused, "Proxmox refuses some of these values"
    assert said == refused
