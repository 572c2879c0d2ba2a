"""``inspect --tree``, ``inspect --format svg`` and ``report`` on the example hosts, and the parent
chains a snapshot keeps."""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import socket
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.host import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.picture import Assignment, UnreadHost, inventory_svg, render_report
from proxgpu.picture.report import plan_report
from proxgpu.planning.model import Role
from proxgpu.version import version
from tests.support.factories import make_gpu, make_inventory
from tests.support.trees import EXAMPLE_HOSTS, EXAMPLES, copy_example, snapshot


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_tree_shows_the_switch_and_the_shared_group(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, "inspect", "--root", str(EXAMPLES / "shared-iommu-group"), "--tree")
    assert code == 0
    lines = out.splitlines()
    switch = next(i for i, line in enumerate(lines) if "0000:81:00.0 switch" in line)
    gpu = next(i for i, line in enumerate(lines) if "0000:83:00.0 NVIDIA RTX A6000" in line)
    assert switch < gpu
    assert lines[gpu].index("0000:83") > lines[switch].index("0000:81")  # deeper in the tree
    assert "IOMMU group 40 (shared: moves as one)" in out


def test_tree_names_the_nics_on_a_gpus_switch(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, "inspect", "--root", str(EXAMPLES / "uneven-5-3"), "--tree")
    assert code == 0
    assert out.count("NIC: Mellanox Technologies MT2910 Family [ConnectX-7]") == 4


@pytest.mark.parametrize("host", EXAMPLE_HOSTS)
def test_svg_of_every_example_parses_and_names_its_gpus(
    host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "host.svg"
    code, printed = _run(
        capsys, "inspect", "--root", str(EXAMPLES / host), "--format", "svg", "-o", str(out)
    )
    assert code == 0 and printed == ""
    root = ET.parse(out).getroot()
    ids = {e.attrib["id"] for e in root.iter() if "id" in e.attrib}
    for gpu in inspect(DirectoryHost(str(EXAMPLES / host))).gpus:
        assert "gpu-" + gpu.address.replace(":", "-") in ids


def test_json_and_a_picture_cannot_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = _run(capsys, "inspect", "--root", str(EXAMPLES / "ct200"), "--tree", "--json")
    assert code == 2


def test_json_and_a_picture_are_refused_for_several_hosts_before_any_is_reached(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Closed loopback ports: reaching either would fail with exit 3, not a usage error.
    hosts = ["--host", "127.0.0.1:1", "--host", "127.0.0.1:2"]
    assert main(["inspect", *hosts, "--format", "svg", "--json"]) == 2
    assert "leave out --tree and --format svg" in capsys.readouterr().err


def test_report_writes_one_html_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    root = str(EXAMPLES / "ct200")
    code, _ = _run(capsys, "report", "--root", root, "--lxc", "200", "--vm", "300", "-o", str(out))
    assert code == 0
    html = out.read_text()
    assert "CT 200" in html and "VM 300" in html
    assert "/etc/pve/qemu-server/300.conf" in html
    assert "http" not in html


def test_report_of_a_guest_that_is_not_there_says_why_with_plans_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No plan to refuse: the report still shows the host, says the reason first, as plan does,
    and exits with plan's code; --json carries the error document."""
    root = str(EXAMPLES / "ct200")
    planned = main(["plan", "--root", root, "--lxc", "999"])
    plan_said = capsys.readouterr().err
    out = tmp_path / "report.html"
    code = main(["report", "--root", root, "--lxc", "999", "-o", str(out)])
    said = capsys.readouterr().err
    assert code == planned == 16 and said == plan_said, said
    assert said.startswith(f"proxgpu: dir:{root}: /etc/pve/lxc/999.conf: no such container config")
    assert "/etc/pve/lxc/999.conf: no such container config" in out.read_text()
    assert main(["report", "--root", root, "--lxc", "999", "-o", str(out), "--json"]) == 16
    (summary,) = json.loads(capsys.readouterr().out)["hosts"]
    error = summary["error"]
    assert (error["code"], error["kind"], error["path"]) == (
        16,
        "RenderError",
        "/etc/pve/lxc/999.conf",
    )
    assert error["fix"] == "create the container first (`pct create`) or name one that exists (200)"


def test_a_snapshot_keeps_each_devices_parent_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = EXAMPLES / "uneven-5-3"
    out = tmp_path / "snap"
    assert main(["snapshot", "--root", str(source), "-o", str(out)]) == 0
    capsys.readouterr()
    entry = out / "sys/bus/pci/devices/0000:17:00.0"
    assert entry.is_symlink()
    assert os.readlink(entry).endswith("/0000:14:01.0/0000:15:00.0/0000:16:00.0/0000:17:00.0")
    before = inspect(DirectoryHost(str(source)))
    after = inspect(DirectoryHost(str(out)))
    assert [g.pci_path for g in after.gpus] == [g.pci_path for g in before.gpus]
    assert after.nics == before.nics and after.nics


def _legend(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return [e.text or "" for e in root.iter() if e.attrib.get("class") == "pg-legend"]


def test_the_legend_frames_a_shared_group_only_where_there_is_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    legends = {}
    for host in ("ct200", "shared-iommu-group"):
        code, svg = _run(capsys, "inspect", "--root", str(EXAMPLES / host), "--format", "svg")
        assert code == 0
        legends[host] = _legend(svg)
    shared = "IOMMU group shared: moves as one"
    assert shared in legends["shared-iommu-group"] and shared not in legends["ct200"]
    # ct200 has no NIC, no BMC display and no device beside its GPUs: only its GPUs' entry.
    assert legends["ct200"] == ["GPU (badge: its /dev/nvidiaN)"]


def test_the_legend_names_the_roles_guests_and_muted_devices_the_picture_shows() -> None:
    bmc = replace(
        make_gpu("03", 0, model="ASPEED Graphics Family"),
        vendor_id="1a03",
        device_id="2000",
        driver="ast",
    )
    gpus = [make_gpu("41", 0, minor=0), make_gpu("c1", 1, minor=1)]
    plain = _legend(inventory_svg(make_inventory(gpus)))
    assert plain == ["GPU (badge: its /dev/nvidiaN)"]
    with_bmc = _legend(inventory_svg(make_inventory([*gpus, bmc])))
    assert with_bmc == ["GPU (badge: its /dev/nvidiaN)", "BMC display, GPU left as it is: muted"]
    host_only = {gpus[0].address: Assignment(role=Role.HOST, driver="nvidia", guest="CT 200")}
    assert _legend(inventory_svg(make_inventory(gpus[:1]), host_only)) == [
        "stays on the host driver (badge: its guest)"
    ]
    both = {
        gpus[0].address: Assignment(role=Role.HOST, driver="nvidia", guest=None),
        gpus[1].address: Assignment(role=Role.VFIO, driver="vfio-pci", guest=None),
    }
    # No guest named: the badges say host / vfio, so the legend does not promise guests; the
    # GPU the plan leaves out (the BMC's display) is muted.
    assert _legend(inventory_svg(make_inventory([*gpus, bmc]), both)) == [
        "stays on the host driver",
        "goes to vfio-pci",
        "BMC display, GPU left as it is: muted",
    ]


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_host_that_cannot_be_read_gets_a_section_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    hosts = [f"127.0.0.1:{closed_port()}", f"127.0.0.2:{closed_port()}"]
    code = main(["report", "--host", ",".join(hosts), "--lxc", "200", "-o", str(out)])
    assert code == 3, "unreachable hosts keep their exit code"
    html = out.read_text()
    assert html.count("Host could not be read") == 2
    assert all(f"<h2>{host}</h2>" in html for host in hosts)
    assert "wrote" in capsys.readouterr().out
    # --json: each unread host's entry holds the error document every command prints.
    assert main(["report", "--host", ",".join(hosts), "--lxc", "200", "-o", str(out), "--json"])
    summaries = json.loads(capsys.readouterr().out)["hosts"]
    assert [(s["host"], s["error"]["code"], s["error"]["kind"]) for s in summaries] == [
        (host, 3, "HostUnreachableError") for host in hosts
    ]


def test_a_fleet_report_shows_the_read_hosts_beside_the_unread_one() -> None:
    inventory = inspect(DirectoryHost(str(EXAMPLES / "ct200")))
    html = render_report([plan_report(inventory), UnreadHost("pve9", "pve9: connection refused")])
    sections = html.split('<section class="host"')[1:]
    assert len(sections) == 2
    assert "<h2>ct200</h2>" in sections[0] and "Host could not be read" not in sections[0]
    assert "pve9: connection refused" in sections[1]


def test_the_report_holds_what_a_change_ticket_needs_and_its_commands_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """proxgpu's version, where the host data came from and when, the guests to stop first, and
    the apply, verify and rollback commands for that host: run as they stand, they apply the
    reported plan, find no drift, and put every byte back."""
    root = copy_example(tmp_path)
    before = snapshot(root)
    out = tmp_path / "report.html"
    assert main(["report", "--root", str(root), "--lxc", "200", "--vm", "300", "-o", str(out)]) == 0
    facts = out.read_text().split('<table class="facts">', 1)[1].split("</table>", 1)[0]
    assert f"proxgpu {version()}" in facts
    assert f"the directory {root} (a snapshot" in facts
    assert "<th>guests to stop first</th><td>CT 200, VM 300 (" in facts
    commands = dict(re.findall(r"<tr><th>([^<]+)</th><td><code>([^<]+)</code></td></tr>", facts))
    assert set(commands) == {"apply", "verify (after the reboot)", "roll back"}
    apply, verify, back = (shlex.split(html.unescape(c))[1:] for c in commands.values())
    assert apply == ["apply", "--root", str(root), "--lxc", "200", "--vm", "300"]
    assert main([*apply, "--yes", "-q"]) == 0
    assert snapshot(root) != before
    capsys.readouterr()
    assert main([*verify, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["drifted"] is False
    assert main([*back, "--yes", "-q"]) == 0
    assert snapshot(root) == before
