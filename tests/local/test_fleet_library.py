"""The fleet engine as a library: typed outcomes, rollouts that stop at the first failure,
events as they happen, and a cluster planned and applied from Python, with the hosts given by
an injected connection factory (directory trees stand in for SSH hosts here: the sshd tests
run the same engine over real connections)."""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import proxgpu
from proxgpu.cli import main
from proxgpu.cli.parser import build_parser
from proxgpu.cli.registry import COMMANDS
from proxgpu.errors import ClusterNotPlannedError, SysfsError, UsageError
from proxgpu.fleet import Event, Target, each_host, roll_out
from proxgpu.host import DirectoryHost, Host
from proxgpu.inspection import inspect
from tests.support.trees import EXAMPLES

CLUSTER = EXAMPLES / "cluster-3"
NODES = ["pve1", "pve2", "pve3"]


def trees(names: list[str]) -> dict[str, Target]:
    return {name: Target(root=str(CLUSTER / name)) for name in names}


def test_each_host_gives_a_typed_outcome_per_host_in_the_order_given(tmp_path: Path) -> None:
    targets = {**trees(["pve3", "pve1"]), "gone": Target(root=str(tmp_path / "missing"))}
    outcomes = each_host(targets, lambda host, say: inspect(host).node_name, forks=2)
    assert list(outcomes) == ["pve3", "pve1", "gone"]
    assert outcomes["pve3"].unwrap() == "pve3" and outcomes["pve1"].result == "pve1"
    assert isinstance(outcomes["gone"].error, UsageError) and outcomes["gone"].code == 2
    with pytest.raises(UsageError, match="no such directory"):
        outcomes["gone"].unwrap()


def test_the_connection_factory_is_the_callers() -> None:
    opened: list[Target] = []

    def connect(target: Target) -> Host:
        opened.append(target)
        return DirectoryHost(str(CLUSTER / "pve2"))  # every name reaches the same tree

    outcomes = each_host(["a", "b"], lambda host, say: inspect(host).node_name, connect=connect)
    assert {o.result for o in outcomes.values()} == {"pve2"}
    assert sorted(t.host or "" for t in opened) == ["a", "b"]


def test_a_rollout_stops_at_the_first_failure_and_names_who_is_where() -> None:
    def work(host: Host, say: object) -> str:
        name = inspect(host).node_name
        if name == "pve2":
            raise SysfsError(host.name, "/x", "broken on purpose")
        return name

    rollout = roll_out(trees(NODES), work, parallel=1)
    assert (rollout.done, rollout.failed, rollout.not_touched) == (["pve1"], ["pve2"], ["pve3"])
    assert rollout.code == 8
    led = roll_out(trees(NODES), lambda host, say: inspect(host).node_name, lead="pve3")
    assert led.done == NODES and next(iter(led.outcomes)) == "pve3", "the lead runs first, alone"


def test_events_arrive_while_the_host_is_still_working() -> None:
    heard = threading.Event()
    events: list[Event] = []

    def listen(event: Event) -> None:
        events.append(event)
        if event.step == "write":
            heard.set()

    def work(host: Host, say: proxgpu.fleet.Say) -> bool:
        say("write", "/etc/x")
        # The listener has the step before the work returns: it is not batched at the end.
        return heard.wait(5)

    outcomes = each_host(trees(["pve1"]), work, on_event=listen)
    assert outcomes["pve1"].result is True
    assert [(e.host, e.step) for e in events] == [("pve1", "write"), ("pve1", "end")]
    assert events[-1].code == 0 and events[-1].message == "ok"


def test_a_long_step_has_a_heartbeat() -> None:
    events: list[Event] = []

    def work(host: Host, say: proxgpu.fleet.Say) -> None:
        say("action", "update-initramfs -u -k all")
        threading.Event().wait(0.9)

    each_host(trees(["pve1"]), work, on_event=events.append, heartbeat=0.3)
    beats = [e.message for e in events if e.step == "still"]
    assert beats and all(m.startswith("still running update-initramfs, ") for m in beats)
    assert 2 <= len(beats) <= 3, beats


def copy_cluster(tmp_path: Path) -> Path:
    root = tmp_path / "cluster"
    shutil.copytree(CLUSTER, root, symlinks=True)
    return root


def test_a_script_plans_the_cluster_and_rolls_it_out(tmp_path: Path) -> None:
    root = copy_cluster(tmp_path)
    nodes = proxgpu.snapshot_nodes(root)
    policy = proxgpu.SplitPolicy(vms=[300, 310, "320"])
    planned = proxgpu.plan_cluster(nodes, policy, mapping="gpu-vfio")
    assert planned.lead == "pve1" and planned.mapping is not None and not planned.failed
    steps: list[Event] = []
    rollout = proxgpu.apply_cluster(planned, on_event=steps.append)
    assert rollout.done == NODES and rollout.code == 0
    assert {e.host for e in steps if e.step == "write"} == set(NODES)
    mapping = (root / "pve1/etc/pve/mapping/pci.cfg").read_text()
    assert mapping.count("node=pve1") == 4 and mapping.count("node=pve3") == 3
    assert (root / "pve2/etc/pve/mapping/pci.cfg").read_text() == (
        CLUSTER / "pve2/etc/pve/mapping/pci.cfg"
    ).read_text(), "the mapping is written once, by the lead"


def test_a_cluster_with_a_node_that_cannot_be_planned_applies_nothing(tmp_path: Path) -> None:
    root = copy_cluster(tmp_path)
    vm = root / "pve3/etc/pve/nodes/pve3/qemu-server/320.conf"
    vm.write_text(vm.read_text().replace("memory: 131072", "memory: 900000"))
    planned = proxgpu.plan_cluster(proxgpu.snapshot_nodes(root), proxgpu.SplitPolicy(vms=[320]))
    assert list(planned.failed) == ["pve3"]
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    with pytest.raises(ClusterNotPlannedError, match="pve3 could not be planned"):
        proxgpu.apply_cluster(planned)
    assert {
        p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()
    } == before


def test_the_readme_script_runs(tmp_path: Path) -> None:
    root = copy_cluster(tmp_path)
    script = Path(__file__).parents[2] / "examples/cluster_rollout.py"
    argv = [sys.executable, str(script), "--root", str(root), "--vm", "300", "--vm", "310"]
    run = subprocess.run(
        [*argv, "--mapping", "gpu-vfio"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "done: ['pve1', 'pve2', 'pve3']; failed: []; not touched: []" in run.stdout
    assert "pve2: [" in run.stderr and "preflight" in run.stderr
    vm = "pve1/etc/pve/nodes/pve1/qemu-server/300.conf"
    assert (root / vm).read_text() == (CLUSTER / vm).read_text(), "without --apply: only checked"


def test_one_svg_file_holds_every_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cl.svg"
    assert (
        main(["inspect", "--root", str(CLUSTER), "--cluster", "--format", "svg", "-o", str(out)])
        == 0
    )
    svg = ET.parse(out).getroot()
    nested = svg.findall("{http://www.w3.org/2000/svg}svg")
    headings = [t.text for t in svg.findall("{http://www.w3.org/2000/svg}text")]
    assert len(nested) == 3 and headings == NODES
    assert capsys.readouterr().out == "", "the picture went to the file"


def test_one_json_file_holds_every_node_and_per_host_files_on_request(tmp_path: Path) -> None:
    combined = tmp_path / "cl.json"
    assert (
        main(["inspect", "--root", str(CLUSTER), "--cluster", "--json", "-o", str(combined)]) == 0
    )
    assert list(json.loads(combined.read_text())["hosts"]) == NODES
    # A folder not there yet is made; each host's file is named for its format.
    folder = tmp_path / "each" / "tree"
    assert main(["inspect", "--root", str(CLUSTER), "--cluster", "--tree", "-o", f"{folder}/"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == [f"{node}.txt" for node in NODES]
    assert "NUMA node" in (folder / "pve2.txt").read_text()
    for kind, suffix in (("--json", ".json"), ("--format=svg", ".svg")):
        folder = tmp_path / "each" / kind
        assert main(["inspect", "--root", str(CLUSTER), "--cluster", kind, "-o", f"{folder}/"]) == 0
        assert sorted(p.name for p in folder.iterdir()) == [f"{node}{suffix}" for node in NODES]
    assert json.loads((tmp_path / "each/--json/pve3.json").read_text())["hostname"] == "pve3"
    assert ET.parse(tmp_path / "each/--format=svg/pve1.svg").getroot().tag.endswith("svg")


def test_every_command_has_its_entry_and_its_work_where_the_entry_says() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == set(COMMANDS)
    for command in COMMANDS.values():
        module = importlib.import_module(f"proxgpu.cli.{command.module}")
        # A command runs its own cmd_ function, or its host work for a fleet of one.
        own = getattr(module, f"cmd_{command.name.replace('-', '_')}", None)
        assert callable(own) or command.per_host, command
        if command.per_host:
            assert command.host_work().__name__ in vars(module), command
    with pytest.raises(UsageError, match="proxgpu report does not run on several hosts"):
        COMMANDS["report"].host_work()
