"""AMD and Intel GPUs in a container: the real /dev/dri nodes by PCI address, /dev/kfd for amdgpu,
and each vendor's device variable, checked with Proxmox's own container parser.

The host is ct200's shape with MI300X-like GPUs on amdgpu (or Intel ones on xe): no AMD or
Intel GPU is here, so the inventory is built field by field as inspection reads it. Where a
container takes raw ``lxc.*`` lines, the boot unit's script runs for real under a directory
standing in for ``/`` at a later boot (its ``/proc/devices``, a ``/dev/kfd`` made as the kernel
makes it, and a stand-in ``modprobe`` that registers kfd as loading amdgpu does), as root.
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.planning import SplitPolicy, plan_split
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering import RenderOptions, render
from proxgpu.rendering.changes import ChangeSet
from proxgpu.rendering.nodes import NODES_SCRIPT, NODES_UNIT, rules_file
from tests.support.factories import ct200
from tests.support.pvevalidate import assert_all_ok, validate_tree, write_tree
from tests.support.tools import require_tool

CT_200 = "/etc/pve/lxc/200.conf"
CONTAINER = """\
arch: amd64
cores: 64
hostname: llm
memory: 262144
ostype: ubuntu
rootfs: local-zfs:subvol-200-disk-0,size=200G
dev0: /dev/dri/renderD200,mode=0660
"""
KFD_MAJOR = 234


def on(gpu: Gpu, index: int, vendor: str, driver: str) -> Gpu:
    functions = [replace(f, vendor_id=vendor, driver=driver) for f in gpu.function_info]
    return replace(
        gpu,
        vendor_id=vendor,
        driver=driver,
        nvidia_minor=None,
        function_info=functions,
        drm_nodes=[f"card{index + 1}", f"renderD{128 + index + 1}"],
    )


def host(vendor: str = "1002", driver: str = "amdgpu", kfd: bool = True) -> Inventory:
    base = ct200({CT_200: CONTAINER})
    gpus = [on(gpu, i, vendor, driver) for i, gpu in enumerate(base.gpus)]
    return replace(
        base,
        gpus=gpus,
        pve_version="8.4.1",
        char_majors={"drm": 226, "kfd": KFD_MAJOR},
        device_nodes=["/dev/kfd"] if kfd else ["/dev/dri/card0"],
    )


def container(inventory: Inventory) -> tuple[GuestConfig, list[str]]:
    plan = plan_split(inventory, SplitPolicy(lxc=200))
    changes = render(inventory, plan)
    (text,) = [f.after for f in changes.files if f.path == CT_200]
    assert text is not None
    return GuestConfig.parse(text), changes.warnings


def dev_entries(config: GuestConfig) -> list[str]:
    return [value for key, value in config.entries() if key.startswith("dev")]


def test_the_container_gets_the_real_nodes_of_its_amd_gpus_and_kfd() -> None:
    config, _ = container(host())
    assert dev_entries(config) == [
        "/dev/dri/renderD200,mode=0660",  # another card the admin gave it: kept as it is
        *(
            f"/dev/dri/{node}"
            for n in range(1, 5)
            for node in (f"card{n}", f"renderD{128 + n},mode=0666")
        ),
        "/dev/kfd,mode=0666",
    ]


def test_proxmox_accepts_the_container(tmp_path: Path) -> None:
    config, _ = container(host())
    tree = write_tree(tmp_path / "host", {CT_200: config.render()})
    assert_all_ok(validate_tree(tree, "pve1"))


def test_the_gpus_leaving_for_vfio_drop_their_nodes_and_the_renumbering_is_told() -> None:
    inventory = host()
    config, warnings = container(inventory)
    leaving = [gpu for gpu in inventory.gpus if gpu.numa_node == 1]
    assert not any(f"/dev/dri/{leaving[0].drm_nodes[1]}" in v for v in dev_entries(config))
    # Node 1's GPUs come after node 0's, so node 0's numbers stay: no warning.
    assert not any("/dev/dri numbers may change" in w for w in warnings)
    kept_last = replace(inventory, gpus=list(reversed_numbers(inventory.gpus)))
    _, warnings = container(kept_last)
    assert any("/dev/dri numbers may change" in w for w in warnings)


def reversed_numbers(gpus: list[Gpu]) -> list[Gpu]:
    """The same GPUs with node 1's probed first (lower DRM numbers than node 0's)."""
    names = [gpu.drm_nodes for gpu in gpus]
    return [replace(gpu, drm_nodes=n) for gpu, n in zip(gpus, names[::-1], strict=True)]


def test_a_missing_kfd_is_told_not_given() -> None:
    config, warnings = container(host(kfd=False))
    assert not any(v.startswith("/dev/kfd") for v in dev_entries(config))
    assert any("/dev/kfd is missing" in w for w in warnings)


def test_intel_gpus_get_no_kfd() -> None:
    config, _ = container(host("8086", "xe"))
    assert [v for v in dev_entries(config) if "kfd" in v] == []
    assert "/dev/dri/renderD129,mode=0666" in dev_entries(config)


@pytest.mark.parametrize(
    ("vendor", "driver", "variable", "ordering"),
    [
        ("1002", "amdgpu", "HIP_VISIBLE_DEVICES", ""),  # KFD's order: no variable sets it
        ("8086", "xe", "ZE_AFFINITY_MASK", "ZE_ENABLE_PCI_ID_DEVICE_ORDER=1"),
    ],
)
def test_the_advice_names_the_vendors_variable(
    vendor: str, driver: str, variable: str, ordering: str
) -> None:
    plan = plan_split(host(vendor, driver), SplitPolicy(lxc=200))
    assert {advice.variable for advice in plan.tensor_parallel} == {variable}
    assert {advice.ordering for advice in plan.tensor_parallel} == {ordering}


def test_nodes_without_captured_names_fall_back_to_by_path_with_a_warning() -> None:
    inventory = host()
    gpus = [replace(gpu, drm_nodes=[]) for gpu in inventory.gpus]
    config, warnings = container(replace(inventory, gpus=gpus))
    assert "/dev/dri/by-path/pci-0000:01:00.0-render" in dev_entries(config)
    assert any("node names were not captured" in w for w in warnings)


# --- raw lxc.* containers: kfd's rule is written at each boot, with that boot's major -----------

#: pve-container before 5.0.7 takes no devN entries: the container gets raw lxc.* lines.
RAW: dict[str, Any] = {"pve_container_version": "5.0.6"}
#: What a modprobe of amdgpu adds to /proc/devices: kfd's character device, at a major the
#: kernel picks as amdgpu loads (register_chrdev with major 0 in amdkfd's kfd_chardev.c).
STANDIN_MODPROBE = """\
#!/bin/sh
echo "$1" >> "$PROXGPU_ROOT/modprobe.log"
if [ "$1" = amdgpu ] && [ -n "${LOADS_KFD_AT-}" ]; then
    sed -i "s/^Character devices:$/&\\n$LOADS_KFD_AT kfd/" "$PROXGPU_ROOT/proc/devices"
fi
"""


def raw_changes(inventory: Inventory | None = None) -> ChangeSet:
    inventory = replace(inventory or host(), **RAW)
    return render(inventory, plan_split(inventory, SplitPolicy(lxc=200)), RenderOptions())


def boot(tmp_path: Path, kfd_major: int | None) -> Path:
    """A directory standing in for / at a boot where amdgpu registered kfd at ``kfd_major``
    (``None``: amdgpu not loaded yet), /dev/kfd as the kernel makes it then, and the stand-in
    modprobe."""
    root = tmp_path / "boot"
    (root / "proc").mkdir(parents=True)
    kfd = f"{kfd_major} kfd\n" if kfd_major is not None else ""
    (root / "proc/devices").write_text(
        f"Character devices:\n  1 mem\n 10 misc\n226 drm\n{kfd}\nBlock devices:\n  8 sd\n"
    )
    (root / "dev/dri").mkdir(parents=True)
    if kfd_major is not None:
        os.mknod(root / "dev/kfd", 0o666 | stat.S_IFCHR, os.makedev(kfd_major, 0))
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/modprobe").write_text(STANDIN_MODPROBE)
    (root / "usr/bin/modprobe").chmod(0o755)
    return root


def run_unit(changes: ChangeSet, root: Path, loads_kfd_at: int | None = None) -> str:
    """Run the rendered boot script against ``root``; its stderr (it must succeed)."""
    if os.geteuid() != 0:
        pytest.skip("the stand-in /dev/kfd needs mknod, which needs root")
    script = root / "proxgpu-nvidia-nodes"
    script.write_text(next(f.after or "" for f in changes.files if f.path == NODES_SCRIPT))
    env = {"PATH": f"{root}/usr/bin:/usr/bin:/bin", "PROXGPU_ROOT": str(root)}
    if loads_kfd_at is not None:
        env["LOADS_KFD_AT"] = str(loads_kfd_at)
    result = subprocess.run(
        ["sh", str(script)], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


def rules(root: Path) -> list[str]:
    return (root / rules_file(200).lstrip("/")).read_text().splitlines()


def raw_entries(changes: ChangeSet) -> list[tuple[str, str]]:
    text = next(f.after or "" for f in changes.files if f.path == CT_200)
    return [(k, v) for k, v in GuestConfig.parse(text).entries() if k.startswith("lxc.")]


def test_a_raw_container_gets_kfd_s_rule_at_boot_with_the_major_of_that_boot(
    tmp_path: Path,
) -> None:
    changes = raw_changes()
    entries = raw_entries(changes)
    assert ("lxc.include", rules_file(200)) in entries
    allowed = [v for k, v in entries if k == "lxc.cgroup2.devices.allow"]
    assert f"c {KFD_MAJOR}:0 rwm" not in allowed, "no kfd major fixed at plan time"
    assert "c 226:129 rwm" in allowed, "DRM's major is fixed: its rules stay in the config"
    assert ("lxc.mount.entry", "/dev/kfd dev/kfd none bind,optional,create=file") in entries
    root = boot(tmp_path, kfd_major=KFD_MAJOR + 277)
    run_unit(changes, root)
    assert rules(root) == [f"lxc.cgroup2.devices.allow = c {KFD_MAJOR + 277}:0 rwm"]
    assert not (root / "modprobe.log").exists(), "amdgpu was loaded: nothing to load"


def test_the_unit_loads_amdgpu_when_kfd_is_not_registered_yet(tmp_path: Path) -> None:
    root = boot(tmp_path, kfd_major=None)
    # As devtmpfs would make it once amdgpu registers kfd at 497.
    os.mknod(root / "dev/kfd", 0o666 | stat.S_IFCHR, os.makedev(497, 0))
    run_unit(raw_changes(), root, loads_kfd_at=497)
    assert (root / "modprobe.log").read_text().split() == ["amdgpu"]
    assert rules(root) == ["lxc.cgroup2.devices.allow = c 497:0 rwm"]


def test_a_boot_without_kfd_fails_the_unit_naming_it(tmp_path: Path) -> None:
    root = boot(tmp_path, kfd_major=None)
    with pytest.raises(AssertionError) as failed:
        run_unit(raw_changes(), root)
    assert f"{root}/dev/kfd: kfd is not in {root}/proc/devices" in str(failed.value)
    assert f"{root}/dev/kfd is missing" in str(failed.value)


def test_an_amd_only_host_gets_the_unit_only_for_raw_containers() -> None:
    unit = {f.path: f.after for f in raw_changes().files}.get(NODES_UNIT) or ""
    assert "Description=/dev/kfd cgroup rule for containers (proxgpu)" in unit
    with_dev_entries = replace(host(), pve_container_version="5.2.3")
    plan = plan_split(with_dev_entries, SplitPolicy(lxc=200))
    assert NODES_UNIT not in {f.path for f in render(with_dev_entries, plan).files}


def test_shellcheck_accepts_the_amd_only_script(tmp_path: Path) -> None:
    shellcheck = require_tool("shellcheck", "shellcheck")
    script = tmp_path / "nodes.sh"
    script.write_text(next(f.after or "" for f in raw_changes().files if f.path == NODES_SCRIPT))
    result = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_proxmox_accepts_the_raw_container(tmp_path: Path) -> None:
    text = next(f.after or "" for f in raw_changes().files if f.path == CT_200)
    assert_all_ok(validate_tree(write_tree(tmp_path / "host", {CT_200: text}), "pve1"))
