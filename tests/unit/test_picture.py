"""The picture (proxgpu.picture): SVG well-formed and complete, a layout whose GPU cards never
overlap, roles and guests from a plan, the text tree, and the report's self-containment."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from proxgpu.picture import (
    HostReport,
    assignments,
    inventory_svg,
    inventory_tree,
    render_report,
)
from proxgpu.picture.layout import MAX_COLUMNS, lay_out, svg_id
from proxgpu.picture.report import plan_report
from proxgpu.picture.shapes import Picture
from proxgpu.picture.topology import UNKNOWN_ROOT
from proxgpu.planning import SplitPolicy, plan_split
from tests.support.factories import (
    bridge,
    ct200,
    eight_by_eight,
    make_fn,
    make_gpu,
    make_inventory,
)

SVG = "{http://www.w3.org/2000/svg}"
HOSTS = {"ct200": ct200, "8x8": eight_by_eight}


def _parsed(svg: str) -> ET.Element:
    return ET.fromstring(svg.encode())


def _by_id(root: ET.Element) -> dict[str, ET.Element]:
    return {e.attrib["id"]: e for e in root.iter() if "id" in e.attrib}


def _texts(root: ET.Element) -> list[str]:
    return [e.text or "" for e in root.iter(f"{SVG}text")]


#: Each host's split, as the planner takes it: the 8x8 host's 56 vfio GPUs go to seven VMs of
#: eight (Proxmox gives a VM at most 16, hostpci0 to hostpci15).
POLICIES = {
    "ct200": SplitPolicy(lxc=200, vms=[(300, None)]),
    "8x8": SplitPolicy(lxc=200, vms=[(301 + i, 8) for i in range(7)]),
}


def _roles(name: str) -> dict[str, object]:
    return dict(assignments(plan_split(HOSTS[name](), POLICIES[name])))


@pytest.mark.parametrize("name", sorted(HOSTS))
@pytest.mark.parametrize("planned", [False, True])
def test_svg_is_well_formed_and_shows_every_gpu_and_node(name: str, planned: bool) -> None:
    inventory = HOSTS[name]()
    roles = _roles(name) if planned else None
    root = _parsed(inventory_svg(inventory, roles))  # type: ignore[arg-type]
    ids = _by_id(root)
    for gpu in inventory.gpus:
        assert svg_id("gpu", gpu.address) in ids
    for node in inventory.numa_nodes:
        assert svg_id("numa", node.id) in ids
        assert f"NUMA node {node.id}" in _texts(root)
    assert set(_texts(root)) >= {gpu.address for gpu in inventory.gpus}


def _assert_no_overlap(picture: Picture) -> None:
    boxes = list(picture.gpu_boxes.items())
    canvas = picture.node_boxes  # each GPU card lies inside exactly one node's column
    for i, (name, box) in enumerate(boxes):
        assert box.x >= 0 and box.right <= picture.width, name
        assert box.y >= 0 and box.bottom <= picture.height, name
        assert sum(column.contains(box) for column in canvas.values()) == 1, name
        for other_name, other in boxes[i + 1 :]:
            assert not box.overlaps(other), f"{name} overlaps {other_name}"
    columns = list(canvas.values())
    for i, column in enumerate(columns):
        assert all(not column.overlaps(other) for other in columns[i + 1 :])


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_gpu_cards_do_not_overlap_and_stay_inside_their_node(name: str) -> None:
    inventory = HOSTS[name]()
    for roles in (None, _roles(name)):
        picture = lay_out(inventory, roles)  # type: ignore[arg-type]
        assert len(picture.gpu_boxes) == len(inventory.gpus)
        _assert_no_overlap(picture)


def test_each_gpu_sits_in_its_own_numa_nodes_column() -> None:
    inventory = eight_by_eight()
    picture = lay_out(inventory)
    for gpu in inventory.gpus:
        column = picture.node_boxes[svg_id("numa", gpu.numa_node)]
        assert column.contains(picture.gpu_boxes[svg_id("gpu", gpu.address)])


def test_eight_nodes_wrap_into_rows_so_the_text_keeps_its_size() -> None:
    picture = lay_out(eight_by_eight())
    tops = sorted({box.y for box in picture.node_boxes.values()})
    assert len(tops) == 2
    first_row = [box for box in picture.node_boxes.values() if box.y == tops[0]]
    assert len(first_row) == MAX_COLUMNS
    assert picture.width <= max(box.right for box in first_row) + 16


def test_a_shared_iommu_group_is_framed_around_exactly_its_devices() -> None:
    switch = bridge("0000:80:01.1", 40, node=1)
    gpus = [
        replace(make_gpu(bus, 1, group=40, peers=(switch,)), pci_path=["0000:80:01.1"])
        for bus in ("83", "84")
    ]
    alone = replace(make_gpu("01", 0), pci_path=["0000:00:01.1"])
    picture = lay_out(make_inventory([alone, *gpus]))
    frames = [rect for rect in picture.rects if rect.css == "pg-frame"]
    assert len(frames) == 1
    framed = {name for name, box in picture.gpu_boxes.items() if frames[0].contains(box)}
    assert framed == {svg_id("gpu", "0000:83:00.0"), svg_id("gpu", "0000:84:00.0")}
    assert any(t.text.startswith("IOMMU group 40") for t in picture.texts)


def test_host_data_is_escaped_not_markup() -> None:
    hostile = make_gpu("01", 0, model='<script>alert("x")</script> & co')
    root = _parsed(inventory_svg(make_inventory([hostile])))
    assert list(root.iter(f"{SVG}script")) == []
    assert any("<script>" in text for text in _texts(root))


def test_planned_roles_colour_the_gpus_and_name_their_guests() -> None:
    inventory = ct200()
    root = _parsed(inventory_svg(inventory, assignments(plan_split(inventory, _policy()))))
    ids = _by_id(root)
    for gpu in inventory.gpus:
        css = ids[svg_id("gpu", gpu.address)].attrib["class"]
        assert css == ("pg-gpu-host" if gpu.numa_node == 0 else "pg-gpu-vfio")
    texts = _texts(root)
    assert texts.count("CT 200") == 4
    assert texts.count("VM 300") == 4


def _policy() -> SplitPolicy:
    return SplitPolicy(lxc=200, vms=[(300, None)])


def test_a_bmc_display_and_a_stranger_in_a_gpus_group_are_muted() -> None:
    bmc = replace(
        make_gpu("02", 0, model="ASPEED Graphics Family"), vendor_id="1a03", device_id="2000"
    )
    stranger = make_fn("0000:03:00.0", 1, node=0, class_code="0x010802", driver="nvme")
    gpu = make_gpu("01", 0, group=1, peers=(stranger,))
    picture = lay_out(make_inventory([gpu, bmc]))
    assert picture.gpu_boxes[svg_id("gpu", bmc.address)].css == "pg-gpu-muted"
    assert picture.gpu_boxes[svg_id("gpu", gpu.address)].css == "pg-gpu-plain"
    assert any(rect.css == "pg-device" for rect in picture.rects)
    assert "0000:03:00.0 in a GPU's IOMMU group" in inventory_tree(make_inventory([gpu, bmc]))


def test_tree_lists_every_node_bridge_and_gpu_in_order() -> None:
    inventory = eight_by_eight()
    tree = inventory_tree(inventory)
    for node in inventory.numa_nodes:
        assert f"NUMA node {node.id}: CPUs {node.cpus}" in tree
    positions = [tree.index(f" {gpu.address} ") for gpu in inventory.gpus]
    assert positions == sorted(positions)
    assert "0000:00:01.1 root port" in tree
    assert "0000:10:00.0 switch" in tree


def test_gpus_without_a_captured_path_hang_under_an_unknown_root() -> None:
    lines = inventory_tree(ct200()).splitlines()
    roots = [line for line in lines if line.lstrip("│ ").startswith(("├─", "└─"))]
    assert any(UNKNOWN_ROOT in line for line in roots)
    assert not any(line.endswith("root port") for line in lines)


def _report(*hosts: HostReport) -> str:
    return render_report(list(hosts), generated="2025-01-01 00:00 UTC")


def test_report_references_nothing_outside_itself() -> None:
    inventory = eight_by_eight()
    html = _report(plan_report(inventory, _policy()))
    lowered = html.lower()
    for remote in ("http:", "https:", "//", "src=", "href=", "url(", "@import", "<script", "<link"):
        assert remote not in lowered.replace("</", "<"), remote


def test_refused_plan_report_says_why_and_shows_the_host_as_it_is() -> None:
    configs = {"/etc/pve/qemu-server/300.conf": "memory: 4096\n", "/etc/pve/lxc/200.conf": ""}
    inventory = ct200(configs, iommu=False)
    section = plan_report(inventory, _policy())
    assert section.plan is None and section.refusals
    html = _report(section)
    assert "Plan refused" in html
    for refusal in section.refusals:
        assert refusal.what.replace("'", "&#39;").replace('"', "&#34;") in html
    assert "Picture of the host as it is" in html
    assert "File changes" not in html


def test_report_redacts_secrets_in_the_diff() -> None:
    vm = "cipassword: $5$hunter2secret\nmemory: 4096\nmachine: q35\n"
    configs = {"/etc/pve/qemu-server/300.conf": vm, "/etc/pve/lxc/200.conf": "cores: 8\n"}
    inventory = replace(ct200(configs), pve_version="8.4.1")
    html = _report(plan_report(inventory, _policy()))
    assert "/etc/pve/qemu-server/300.conf" in html
    assert "hunter2secret" not in html
    assert "redacted by proxgpu" in html


def test_report_has_one_section_per_host() -> None:
    first = plan_report(ct200(), _policy())
    second = plan_report(eight_by_eight(), _policy())
    html = _report(first, second)
    root_count = html.count('<section class="host"')
    assert root_count == 2
    assert html.index("pve1") < html.rindex("pve1")
