"""Each PCI function's parent chain, read from its /sys/bus/pci/devices link, and the NICs that
share a GPU's switch (proxgpu.inspection.build), with no host involved."""

from __future__ import annotations

from proxgpu.inspection.build import build_inventory
from proxgpu.inspection.capture import Capture
from proxgpu.inspection.recognition import GpuFilter

DEVICES = "/sys/bus/pci/devices/"
CHAIN = ["0000:80:01.1", "0000:81:00.0", "0000:82:08.0"]


def _function(lines: dict[str, list[str]], address: str, cls: str, vendor: str) -> None:
    for name, value in (("class", cls), ("vendor", vendor), ("device", "0x1234")):
        lines[f"{DEVICES}{address}/{name}"] = [value]


def _capture(with_links: bool) -> Capture:
    """A switch below root port 80:01.1 with a GPU on one downstream port and a NIC on another,
    plus a NIC under a root port of its own."""
    lines: dict[str, list[str]] = {}
    for bridge in [*CHAIN, "0000:82:10.0", "0000:00:03.0"]:
        _function(lines, bridge, "0x060400", "0x10b5")
    _function(lines, "0000:83:00.0", "0x030200", "0x10de")
    _function(lines, "0000:84:00.0", "0x020000", "0x15b3")
    _function(lines, "0000:01:00.0", "0x020000", "0x15b3")
    links = {}
    if with_links:
        parents = {
            "0000:80:01.1": [],
            "0000:81:00.0": CHAIN[:1],
            "0000:82:08.0": CHAIN[:2],
            "0000:82:10.0": CHAIN[:2],
            "0000:83:00.0": CHAIN,
            "0000:84:00.0": [*CHAIN[:2], "0000:82:10.0"],
            "0000:00:03.0": [],
            "0000:01:00.0": ["0000:00:03.0"],
        }
        for address, chain in parents.items():
            root = "pci" + (chain[0] if chain else address).rsplit(":", 1)[0]
            links[f"{DEVICES}{address}"] = "../../../devices/" + "/".join([root, *chain, address])
    return Capture(lines=lines, links=links)


def test_the_parent_chain_is_read_from_the_device_link_root_port_first() -> None:
    inventory = build_inventory(_capture(with_links=True), "pve1", GpuFilter())
    (gpu,) = inventory.gpus
    assert gpu.pci_path == CHAIN
    assert gpu.function_info[0].pci_path == CHAIN


def test_a_nic_behind_the_gpus_switch_is_listed_and_one_elsewhere_is_not() -> None:
    inventory = build_inventory(_capture(with_links=True), "pve1", GpuFilter())
    assert [(nic.address, nic.pci_path) for nic in inventory.nics] == [
        ("0000:84:00.0", [*CHAIN[:2], "0000:82:10.0"])
    ]


def test_without_device_links_the_chain_is_unknown_not_empty() -> None:
    inventory = build_inventory(_capture(with_links=False), "pve1", GpuFilter())
    assert inventory.gpus[0].pci_path is None
    assert inventory.nics == []


def test_a_link_that_does_not_end_in_the_device_gives_no_chain() -> None:
    capture = _capture(with_links=True)
    capture.links[f"{DEVICES}0000:83:00.0"] = "../../../devices/pci0000:80/0000:80:01.1/other"
    assert build_inventory(capture, "pve1", GpuFilter()).gpus[0].pci_path is None
