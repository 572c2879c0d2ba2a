"""AMD and Intel GPUs in a container: the real /dev/dri nodes by PCI address, /dev/kfd for amdgpu,
and each vendor's device variable, checked with Proxmox's own container parser.

The host is ct200's shape with MI300X-like GPUs on amdgpu (or Intel ones on xe): no AMD or
Intel GPU is here, so the inventory is built field by field as inspection reads it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.planning import SplitPolicy, plan_split
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering import render
from tests.support.factories import ct200
from tests.support.pvevalidate import assert_all_ok, validate_tree, write_tree

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
    functions = [
        f.model_copy(update={"vendor_id": vendor, "driver": driver}) for f in gpu.function_info
    ]
    return gpu.model_copy(
        update={
            "vendor_id": vendor,
            "driver": driver,
            "nvidia_minor": None,
            "function_info": functions,
            # card0 is the BMC's display; the GPUs follow in PCI order.
            "drm_nodes": [f"card{index + 1}", f"renderD{128 + index + 1}"],
        }
    )


def host(vendor: str = "1002", driver: str = "amdgpu", kfd: bool = True) -> Inventory:
    base = ct200({CT_200: CONTAINER})
    gpus = [on(gpu, i, vendor, driver) for i, gpu in enumerate(base.gpus)]
    return base.model_copy(
        update={
            "gpus": gpus,
            "pve_version": "8.4.1",
            "char_majors": {"drm": 226, "kfd": KFD_MAJOR},
            "device_nodes": ["/dev/kfd"] if kfd else ["/dev/dri/card0"],
        }
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
    kept_last = inventory.model_copy(update={"gpus": list(reversed_numbers(inventory.gpus))})
    _, warnings = container(kept_last)
    assert any("/dev/dri numbers may change" in w for w in warnings)


def reversed_numbers(gpus: list[Gpu]) -> list[Gpu]:
    """The same GPUs with node 1's probed first (lower DRM numbers than node 0's)."""
    names = [gpu.drm_nodes for gpu in gpus]
    return [
        gpu.model_copy(update={"drm_nodes": n}) for gpu, n in zip(gpus, names[::-1], strict=True)
    ]


def test_a_missing_kfd_is_told_not_given() -> None:
    config, warnings = container(host(kfd=False))
    assert not any(v.startswith("/dev/kfd") for v in dev_entries(config))
    assert any("/dev/kfd is missing" in w for w in warnings)


def test_intel_gpus_get_no_kfd() -> None:
    config, _ = container(host("8086", "xe"))
    assert [v for v in dev_entries(config) if "kfd" in v] == []
    assert "/dev/dri/renderD129,mode=0666" in dev_entries(config)


@pytest.mark.parametrize(
    ("vendor", "driver", "variable"),
    [("1002", "amdgpu", "HIP_VISIBLE_DEVICES"), ("8086", "xe", "ZE_AFFINITY_MASK")],
)
def test_the_advice_names_the_vendors_variable(vendor: str, driver: str, variable: str) -> None:
    plan = plan_split(host(vendor, driver), SplitPolicy(lxc=200))
    assert {advice.variable for advice in plan.tensor_parallel} == {variable}


def test_nodes_without_captured_names_fall_back_to_by_path_with_a_warning() -> None:
    inventory = host()
    gpus = [gpu.model_copy(update={"drm_nodes": []}) for gpu in inventory.gpus]
    config, warnings = container(inventory.model_copy(update={"gpus": gpus}))
    assert "/dev/dri/by-path/pci-0000:01:00.0-render" in dev_entries(config)
    assert any("node names were not captured" in w for w in warnings)
