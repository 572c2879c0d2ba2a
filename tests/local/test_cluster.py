"""A Proxmox VE cluster planned as one, offline: the example snapshot ``cluster-3`` (three GPU
nodes of different shapes and an offline fourth), through the command line."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from proxgpu.cli import main
from proxgpu.pve.config import parse_property_string
from proxgpu.pve.mapping import PciMappingConfig
from tests.support.pvevalidate import (
    STORAGE_CFG,
    Verdict,
    assert_all_ok,
    files_in_tree,
    validate,
)
from tests.support.trees import EXAMPLES

CLUSTER = EXAMPLES / "cluster-3"
GUESTS = ["--vm", "300", "--vm", "310", "--vm", "320", "--mapping", "gpu-vfio"]
NODES = ["pve1", "pve2", "pve3"]


def copy_cluster(tmp_path: Path) -> Path:
    root = tmp_path / "cluster"
    shutil.copytree(CLUSTER, root, symlinks=True)
    return root


def map_nodes(text: str) -> list[str]:
    entries = PciMappingConfig.parse(text).entries("gpu-vfio")
    return [parse_property_string(v)["node"] for k, v in entries if k == "map"]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_plan_is_one_document_a_node_each_and_one_mapping(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, document = run_json(capsys, "plan", "--root", str(CLUSTER), "--cluster", *GUESTS)
    assert code == 0
    hosts, cluster = document["hosts"], document["cluster"]
    assert isinstance(hosts, dict) and isinstance(cluster, dict)
    assert list(hosts) == NODES, "every online node, the offline pve4 skipped"
    assert "pve4" in cluster["skipped"] and cluster["name"] == "gpu-lab"
    mapping = cluster["mapping"]
    # One change holding every node's vfio GPUs, the offline node's line kept as it was.
    assert map_nodes(mapping["after"]) == ["pve4"] + ["pve1"] * 4 + ["pve2"] * 2 + ["pve3"] * 3
    for node in NODES:
        paths = [f["path"] for f in hosts[node]["changes"]["files"]]
        assert "/etc/pve/mapping/pci.cfg" not in paths, f"{node} does not write it again"
        vm = next(f for f in hosts[node]["changes"]["files"] if "qemu-server" in f["path"])
        assert "mapping=gpu-vfio" in vm["after"]


def test_each_node_plans_only_the_guests_it_holds(capsys: pytest.CaptureFixture[str]) -> None:
    code, document = run_json(capsys, "plan", "--root", str(CLUSTER), "--cluster", *GUESTS)
    guests = {
        node: sorted(g["guest"]["vmid"] for g in doc["groups"] if g["guest"])
        for node, doc in document["hosts"].items()
    }
    assert code == 0 and guests == {"pve1": [200, 300], "pve2": [310], "pve3": [150, 320]}


def test_the_text_shows_the_mapping_once_then_a_section_per_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--root", str(CLUSTER / "pve2"), "--cluster", *GUESTS]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("+++ /etc/pve/mapping/pci.cfg") == 1
    assert captured.out.index("PCI mapping gpu-vfio") < captured.out.index("== pve2 ==")
    # The node given first is read first and carries the mapping in a snapshot.
    assert captured.out.index("== pve2 ==") < captured.out.index("== pve1 ==")
    assert "with pve2's apply" in captured.out
    assert "pve4: offline: skipped" in captured.err


def test_apply_writes_the_mapping_once_and_proxmox_accepts_every_node(tmp_path: Path) -> None:
    root = copy_cluster(tmp_path)
    argv = ["apply", "--root", str(root), "--cluster", *GUESTS, "--yes"]
    assert main(argv) == 0
    written = root / "pve1/etc/pve/mapping/pci.cfg"
    assert map_nodes(written.read_text())[1:] == ["pve1"] * 4 + ["pve2"] * 2 + ["pve3"] * 3
    untouched = (CLUSTER / "pve2/etc/pve/mapping/pci.cfg").read_text()
    assert (root / "pve2/etc/pve/mapping/pci.cfg").read_text() == untouched, "written once"
    storage = tmp_path / "storage.cfg"
    storage.write_text(STORAGE_CFG)
    verdicts: dict[Path, Verdict] = {}
    for node in NODES:
        # Each node's VMs start against the one shared mapping, as that node.
        checks = files_in_tree(root / node)
        checks = [(m, p) for m, p in checks if m != "pci-mapping"]
        if node == "pve1":
            checks.append(("pci-mapping", written.resolve()))
        verdicts |= validate(checks, pci_mapping=written, node=node, storage_cfg=storage)
    assert len([v for v in verdicts.values() if v.mode == "qemu-start"]) == 3
    assert_all_ok(verdicts)


def test_a_node_that_cannot_be_planned_stops_the_whole_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_cluster(tmp_path)
    vm = root / "pve3/etc/pve/nodes/pve3/qemu-server/320.conf"
    vm.write_text(vm.read_text().replace("memory: 131072", "memory: 900000"))
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    assert main(["apply", "--root", str(root), "--cluster", *GUESTS, "--yes"]) == 9
    captured = capsys.readouterr()
    assert "Nothing was applied: pve3 could not be planned." in captured.out
    assert "== pve1 ==" in captured.out, "every node's plan is still shown"
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    assert after == before, "no node changed"


def test_a_guest_on_no_node_is_refused_before_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As a single host refuses a guest it does not have: the same exit code (16) and kind,
    naming the cluster, the config and the guests the nodes read hold."""
    single = main(["plan", "--root", str(CLUSTER / "pve1"), "--vm", "399", "--json"])
    alone = json.loads(capsys.readouterr().out)["error"]
    assert main(["plan", "--root", str(CLUSTER), "--cluster", "--vm", "399", "--json"]) == single
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert (error["code"], error["kind"], error["path"]) == (
        alone["code"],
        alone["kind"],
        alone["path"],
    )
    assert (single, error["kind"], error["host"]) == (16, "RenderError", "cluster gpu-lab")
    assert captured.err == (
        "proxgpu: cluster gpu-lab: /etc/pve/qemu-server/399.conf: no such VM config on any node "
        "read (not read: pve4); create the VM first (`qm create`) or name one that exists "
        "(300, 310, 320)\n"
    )


@pytest.mark.parametrize("vm", ["399:vgpu=nvidia-1155", "399:2"])
def test_a_vm_of_any_spelling_on_no_node_is_refused(
    vm: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A vGPU VM is a guest like the others: no node planning it must not drop it unsaid."""
    assert main(["plan", "--root", str(CLUSTER), "--cluster", "--vm", vm]) == 16
    assert "/etc/pve/qemu-server/399.conf: no such VM config on any node" in capsys.readouterr().err


def test_a_cluster_report_refuses_a_guest_on_no_node_as_plan_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    argv = ["--root", str(CLUSTER), "--cluster", "--lxc", "299"]
    assert main(["report", *argv, "-o", str(out)]) == main(["plan", *argv]) == 16
    err = capsys.readouterr().err
    assert err.count("/etc/pve/lxc/299.conf: no such container config on any node read") == 2


def test_inspect_and_history_run_on_every_node(capsys: pytest.CaptureFixture[str]) -> None:
    code, document = run_json(capsys, "inspect", "--root", str(CLUSTER), "--cluster")
    assert code == 0
    hosts = document["hosts"]
    assert {n: len(d["gpus"]) for n, d in hosts.items()} == {"pve1": 8, "pve2": 4, "pve3": 8}
    assert [m["name"] for m in document["cluster"]["members"]] == [*NODES, "pve4"]


def test_snapshot_of_a_cluster_reads_back_as_the_same_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "snap"
    assert main(["snapshot", "--root", str(CLUSTER), "--cluster", "-o", str(out)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == NODES
    for node in NODES:
        pve = out / node / "etc/pve"
        assert (pve / "lxc").is_symlink() and str((pve / "lxc").readlink()) == f"nodes/{node}/lxc"
        assert str((pve / "qemu-server").readlink()) == f"nodes/{node}/qemu-server"
        assert (pve / "nodes/pve3/qemu-server/320.conf").is_file(), "every node's guests"
        assert json.loads((pve / ".members").read_text())["nodename"] == node
    _, original = run_json(capsys, "plan", "--root", str(CLUSTER), "--cluster", *GUESTS)
    _, again = run_json(capsys, "plan", "--root", str(out), "--cluster", *GUESTS)
    for document in (original, again):
        for node in document["hosts"].values():
            node["changes"].pop("host")  # the tree's own path
    assert again == original


class _Codes(HTMLParser):
    """The text of every ``<code>`` element and of the whole page."""

    def __init__(self) -> None:
        super().__init__()
        self.codes: list[str] = []
        self.text: list[str] = []
        self.inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.inside = self.inside or tag == "code"
        if tag == "code":
            self.codes.append("")

    def handle_endtag(self, tag: str) -> None:
        self.inside = self.inside and tag != "code"

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.inside:
            self.codes[-1] += data


def test_the_cluster_report_shows_the_cluster_and_its_mapping_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cluster.html"
    assert main(["report", "--root", str(CLUSTER), "--cluster", *GUESTS, "-o", str(out)]) == 0
    page = _Codes()
    page.feed(out.read_text())
    assert page.codes.count("/etc/pve/mapping/pci.cfg") == 1, "one mapping, one end state"
    text = " ".join(page.text)
    assert "Cluster gpu-lab, quorate: 3 of 4 nodes (pve1, pve2, pve3); pve4 offline" in text
    assert "PCI mapping gpu-vfio, one for the whole cluster" in text
    assert "pve4: offline" in capsys.readouterr().err


def test_the_cluster_line_says_whether_it_is_quorate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_cluster(tmp_path)
    for members in root.glob("*/etc/pve/.members"):
        document = json.loads(members.read_text())
        document["cluster"]["quorate"] = 0
        members.write_text(json.dumps(document))
    main(["plan", "--root", str(root), "--cluster", *GUESTS])
    out = capsys.readouterr().out
    assert "Cluster gpu-lab, NOT QUORATE (/etc/pve is read-only): 3 of 4 nodes" in out


def test_the_cluster_report_refuses_a_node_that_is_another_machine_as_plan_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # pve2's member address reaches a machine that calls itself otherwise.
    root = copy_cluster(tmp_path)
    (root / "pve2/proc/sys/kernel/hostname").write_text("elsewhere\n")
    argv = ["--root", str(root), "--cluster", *GUESTS]
    out = tmp_path / "report.html"
    assert main(["report", *argv, "-o", str(out)]) == main(["plan", *argv]) == 2
    said = "its hostname is elsewhere, but /etc/pve/.members calls it pve2"
    assert capsys.readouterr().err.count(said) == 2, "the report says it as plan does"
    page = _Codes()
    page.feed(out.read_text())
    assert said in " ".join(page.text), "pve2's section says why it is not planned"
