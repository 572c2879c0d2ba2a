"""MIG instances for containers: the ``mig`` example host (4 H200, GPU 0 at 0000:18:00.0 in MIG
mode with compute instances 2/0, 3/0, 3/1 and 9/0), inspected from its tree; every container
config written is checked by Proxmox's own parser (pve-check), and apply and verify run on a
copy of the tree."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from proxgpu.apply.transaction import apply_changes
from proxgpu.apply.verify import verify
from proxgpu.cli import main
from proxgpu.errors import PlanRefusedError, PreflightError
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.picture import assignments, inventory_svg, render_report
from proxgpu.picture.layout import svg_id
from proxgpu.picture.report import plan_report
from proxgpu.pipeline.saved import load_plan, save_plan
from proxgpu.planning import MigSpec, MigUse, Role, SplitPolicy, plan_split
from proxgpu.rendering import render
from proxgpu.rendering.nodes import NODES_SCRIPT
from tests.support.pvevalidate import assert_all_ok, validate_tree, write_tree
from tests.support.trees import EXAMPLES, copy_example

ROOT = EXAMPLES / "mig"
CT_200, CT_201 = "/etc/pve/lxc/200.conf", "/etc/pve/lxc/201.conf"
CAPS = "proc/driver/nvidia/capabilities/gpu0/mig"
TWO = SplitPolicy(lxc_mig=[MigSpec(vmid=200, gpu="0", gi=2), MigSpec(vmid=201, gpu="0", gi=9)])
#: GPU 0's MIG devices (GI 2 CI 0, GI 3 CI 1, GI 9 CI 0) as the example's nvidia-smi -L lists them.
UUID_2_0 = "MIG-00000000-5a1e-5c2b-9f3d-02000000c7a2"
UUID_3_1 = "MIG-00000000-5a1e-5c2b-9f3d-03010000c7a2"
UUID_9_0 = "MIG-00000000-5a1e-5c2b-9f3d-09000000c7a2"
CAPTURED = "var/lib/proxgpu/captured"


@cache
def mig_host() -> Inventory:
    return inspect(DirectoryHost(str(ROOT)))


def dev_entries(text: str | None) -> list[str]:
    assert text is not None
    return re.findall(r"^dev\d+: (.*)$", text, re.M)


def test_inspection_reads_each_compute_instance_with_its_gpu_instance() -> None:
    gpu = mig_host().gpu("0000:18:00.0")
    found = [(i.gi, i.ci, i.gi_cap.minor, i.ci_cap.minor, i.ci_cap.mode) for i in gpu.mig_instances]
    assert found == [
        (2, 0, 21, 22, 0o444),
        (3, 0, 30, 31, 0o444),
        (3, 1, 30, 32, 0o444),
        (9, 0, 84, 85, 0o444),
    ]
    assert mig_host().gpu("0000:2a:00.0").mig_instances == []
    assert mig_host().char_majors["nvidia-caps"] == 508


def test_two_containers_each_get_exactly_their_instance_and_the_gpu_stays_on_nvidia(
    tmp_path: Path,
) -> None:
    plan = plan_split(mig_host(), TWO)
    (group,) = [g for g in plan.groups if g.role is Role.MIG]
    assert (group.gpus, group.driver, [g.vmid for g in group.guests]) == (
        ["0000:18:00.0"],
        "nvidia",
        [200, 201],
    )
    # The UUIDs are what the snapshot kept of nvidia-smi -L, joined through its MIG table.
    assert group.mig == [
        MigUse(vmid=200, gpu_minor=0, gi=2, ci=0, gi_minor=21, ci_minor=22, uuid=UUID_2_0),
        MigUse(vmid=201, gpu_minor=0, gi=9, ci=0, gi_minor=84, ci_minor=85, uuid=UUID_9_0),
    ]
    assert all("0000:18:00.0" not in g.gpus for g in plan.groups if g.role.moves_to_vfio)
    files = {f.path: f.after for f in render(mig_host(), plan).files}
    common = [
        "/dev/nvidia0,mode=0666",
        "/dev/nvidiactl,mode=0666",
        "/dev/nvidia-uvm,mode=0666",
        "/dev/nvidia-uvm-tools,mode=0666",
    ]
    # NVIDIA's 0444 for the access rights; never mig/config (cap1) or mig/monitor (cap2).
    assert dev_entries(files[CT_200]) == [
        *common,
        "/dev/nvidia-caps/nvidia-cap21,mode=0444",
        "/dev/nvidia-caps/nvidia-cap22,mode=0444",
    ]
    assert dev_entries(files[CT_201])[-2:] == [
        "/dev/nvidia-caps/nvidia-cap84,mode=0444",
        "/dev/nvidia-caps/nvidia-cap85,mode=0444",
    ]
    configs: dict[str, str | None] = {CT_200: files[CT_200], CT_201: files[CT_201]}
    assert_all_ok(validate_tree(write_tree(tmp_path / "host", configs), "mig"))


def test_the_boot_unit_makes_both_containers_capability_nodes_from_their_proc_files() -> None:
    files = {f.path: f.after for f in render(mig_host(), plan_split(mig_host(), TWO)).files}
    script = files["/usr/local/sbin/proxgpu-nvidia-nodes"]
    assert script is not None
    steps = [line for line in script.splitlines() if line.startswith("cap ")]
    assert steps == [
        "cap driver/nvidia/capabilities/gpu0/mig/gi2/access",
        "cap driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access",
        "cap driver/nvidia/capabilities/gpu0/mig/gi9/access",
        "cap driver/nvidia/capabilities/gpu0/mig/gi9/ci0/access",
    ]


def test_planning_one_container_again_keeps_the_nodes_another_one_was_given(
    tmp_path: Path,
) -> None:
    # Both containers applied, then CT 200 planned alone: CT 201's dev4/dev5 still name its
    # instance's nodes, which only the unit makes at boot.
    root = copy_example(tmp_path, "mig")
    host = DirectoryHost(str(root))
    apply_changes(host, render(inspect(host), plan_split(inspect(host), TWO)))
    made = (root / NODES_SCRIPT.lstrip("/")).read_text()
    inventory = inspect(host)
    changes = render(inventory, plan_split(inventory, SplitPolicy(lxc_mig=TWO.lxc_mig[:1])))
    assert not [f.path for f in changes.changed_files() if f.path == NODES_SCRIPT], (
        "the unit still makes CT 201's nodes as it did"
    )
    assert (
        "CT 201, which this plan does not name, still names /dev/nvidia-caps/nvidia-cap84, "
        "/dev/nvidia-caps/nvidia-cap85 (given it by an earlier plan): "
        "proxgpu-nvidia-nodes.service keeps making them at boot, so that CT 201 still starts "
        "(remove those entries from it for the unit to stop)"
    ) in changes.warnings
    assert "cap driver/nvidia/capabilities/gpu0/mig/gi9/ci0/access" in made
    # Without CT 201's entries the unit lets them go.
    config = (root / CT_201.lstrip("/")).read_text()
    (root / CT_201.lstrip("/")).write_text(re.sub(r"^dev[45]: .*\n", "", config, flags=re.M))
    inventory = inspect(host)
    changes = render(inventory, plan_split(inventory, SplitPolicy(lxc_mig=TWO.lxc_mig[:1])))
    (script,) = [f.after for f in changes.changed_files() if f.path == NODES_SCRIPT]
    assert script is not None and "gi9" not in script and "nvidia-cap84" not in script
    assert not [w for w in changes.warnings if w.startswith("CT 201")]


def test_a_node_the_unit_can_no_longer_make_is_said_not_kept(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "mig")
    host = DirectoryHost(str(root))
    apply_changes(host, render(inspect(host), plan_split(inspect(host), TWO)))
    # The admin destroys GPU instance 9: its /proc files go.
    shutil.rmtree(root / CAPS / "gi9")
    inventory = inspect(host)
    changes = render(inventory, plan_split(inventory, SplitPolicy(lxc_mig=TWO.lxc_mig[:1])))
    (script,) = [f.after for f in changes.changed_files() if f.path == NODES_SCRIPT]
    assert script is not None and "nvidia-cap84" not in script
    assert (
        "CT 201: its entries name /dev/nvidia-caps/nvidia-cap84, /dev/nvidia-caps/nvidia-cap85, "
        "which the nodes unit made but can no longer make (their MIG instance or GPU is gone): "
        "CT 201 will not start until those entries are removed"
    ) in changes.warnings


@pytest.mark.parametrize(
    ("spec", "what", "fix"),
    [
        (
            MigSpec(vmid=200, gpu="0", gi=3),
            "CT 200: 0000:18:00.0 GPU instance 3 holds 2 compute instances",
            "name one as 0/3/CI: GI 3 CI 0 and GI 3 CI 1",
        ),
        (
            MigSpec(vmid=200, gpu="0", gi=4),
            "CT 200: 0000:18:00.0 has no GPU instance 4",
            "name one it has: GI 2, 3 and 9",
        ),
        (
            MigSpec(vmid=200, gpu="0", gi=9, ci=1),
            "CT 200: 0000:18:00.0 has no compute instance 1 in GPU instance 9",
            "name one it has: GI 9 CI 0",
        ),
        (
            MigSpec(vmid=200, gpu="2a:00.0", gi=1),
            "CT 200: 0000:2a:00.0 has no MIG instance (MIG mode off, or no instance made)",
            "turn MIG on and make the instances (nvidia-smi -i 1 -mig 1; nvidia-smi mig -i 1 -cgi "
            "PROFILE -C), then inspect again",
        ),
        (
            MigSpec(vmid=200, gpu="4", gi=1),
            "CT 200: --lxc 200:mig=4/...: CUDA numbers 4 GPUs on nvidia here, from 0, with "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default, FASTEST_FIRST, may differ",
            "name the GPU by its index in nvidia-smi -L or by its PCI address",
        ),
    ],
)
def test_an_instance_the_host_does_not_have_is_refused_with_what_it_has(
    spec: MigSpec, what: str, fix: str | None
) -> None:
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(mig_host(), SplitPolicy(lxc_mig=[spec]))
    (problem,) = caught.value.problems
    assert problem.what == what
    assert fix is None or problem.fix == fix


def test_one_instance_for_two_containers_or_a_mig_gpu_for_vfio_is_refused() -> None:
    twice = [MigSpec(vmid=200, gpu="0", gi=2), MigSpec(vmid=201, gpu="0000:18:00.0", gi=2, ci=0)]
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(mig_host(), SplitPolicy(lxc_mig=twice))
    assert [p.what for p in caught.value.problems] == [
        "CT 201: 0000:18:00.0 GI 2 CI 0 goes to CT 200 already"
    ]
    policy = SplitPolicy(lxc_mig=twice[:1], vfio_gpus=["18:00.0"])
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(mig_host(), policy)
    assert [p.what for p in caught.value.problems] == [
        "CT 200: 0000:18:00.0 is named in --vfio-gpus"
    ]


def test_moving_the_mig_gpu_to_vfio_warns_naming_its_instances(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its instances are nvidia's: they go when the GPU leaves it (issue #24 point 3)."""
    argv = ["plan", "--root", str(ROOT), "--host-node", "1", "--vfio-node", "0"]
    assert main(argv) == 0
    assert (
        "warning: 0000:18:00.0 goes to vfio-pci in MIG mode with 4 MIG instances (GI 2 CI 0, "
        "GI 3 CI 0, GI 3 CI 1 and GI 9 CI 0): they are nvidia's and go when it lets the GPU go; "
        "no container's config names them, but any process on them stops (nvidia-smi -L lists "
        "what runs there): move that work first, or keep the GPU on nvidia (--host-gpus "
        "0000:18:00.0)"
    ) in capsys.readouterr().out
    kept = plan_split(mig_host(), SplitPolicy(host_nodes=[0], vfio_nodes=[1]))
    assert not any("MIG mode" in w for w in kept.warnings)


def test_the_warning_names_the_containers_that_lose_their_instance() -> None:
    """CT 200 and CT 201 run on instances of GPU 0 (their configs as proxgpu wrote them); a plan
    giving both node 1's GPUs instead moves GPU 0 and takes the instances from them."""
    changes = render(mig_host(), plan_split(mig_host(), TWO))
    files = {f.path: f.after for f in changes.files if f.after is not None}
    configs = {**mig_host().guest_configs, CT_200: files[CT_200], CT_201: files[CT_201]}
    using = replace(mig_host(), guest_configs=configs)
    plan = plan_split(using, SplitPolicy(lxc=200, shared_lxc=[201], vfio_nodes=[0]))
    (warning,) = [w for w in plan.warnings if "MIG mode" in w]
    assert "; CT 200 (GI 2 CI 0) and CT 201 (GI 9 CI 0) use them and lose them (" in warning


def test_a_container_with_an_instance_and_one_with_the_other_kept_gpu_coexist() -> None:
    policy = SplitPolicy(lxc=202, lxc_mig=[MigSpec(vmid=200, gpu="0", gi=2)])
    inventory = replace(
        mig_host(),
        guest_configs={**mig_host().guest_configs, "/etc/pve/lxc/202.conf": "arch: amd64\n"},
    )
    plan = plan_split(inventory, policy)
    roles = {(g.role, tuple(g.gpus), tuple(x.vmid for x in g.guests)) for g in plan.groups}
    assert (Role.HOST, ("0000:2a:00.0",), (202,)) in roles
    assert (Role.MIG, ("0000:18:00.0",), (200,)) in roles


def test_the_cli_plan_prints_each_instance_and_how_to_select_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "plan",
        "--root",
        str(ROOT),
        "--lxc",
        "200:mig=0/2",
        "--lxc",
        "201:mig=0000:18:00.0/3/1",
    ]
    assert main([*argv, "--vm", "300"]) == 0
    out = capsys.readouterr().out
    assert (
        "(stays on the host driver, its MIG instances for containers), for LXC 200, LXC 201" in out
    )
    assert (
        "    CT 200: MIG GI 2 CI 0 (nvidia-cap21, nvidia-cap22)\n"
        f"      in it: CUDA_VISIBLE_DEVICES={UUID_2_0}\n"
        "    CT 201: MIG GI 3 CI 1 (nvidia-cap30, nvidia-cap32)\n"
        f"      in it: CUDA_VISIBLE_DEVICES={UUID_3_1}\n"
    ) in out
    assert main([*argv, "--json"]) == 0
    (group,) = [g for g in json.loads(capsys.readouterr().out)["groups"] if g["role"] == "mig"]
    assert [(u["vmid"], u["gi"], u["ci"], u["uuid"]) for u in group["mig"]] == [
        (200, 2, 0, UUID_2_0),
        (201, 3, 1, UUID_3_1),
    ]


def test_without_nvidia_smi_s_outputs_the_plan_says_where_to_read_the_uuid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path, "mig")
    shutil.rmtree(root / CAPTURED)
    assert main(["plan", "--root", str(root), "--lxc", "201:mig=0/3/1"]) == 0
    assert (
        "      in it: CUDA_VISIBLE_DEVICES=MIG-<UUID>; the UUID is unknown to inspection: "
        "nvidia-smi -L on the host lists it as the MIG Device of GPU 0 that nvidia-smi's MIG "
        "devices table shows for GI 3 CI 1\n"
    ) in capsys.readouterr().out
    assert main(["plan", "--root", str(root), "--lxc", "201:mig=0/3/1", "--json"]) == 0
    (group,) = [g for g in json.loads(capsys.readouterr().out)["groups"] if g["role"] == "mig"]
    assert [u["uuid"] for u in group["mig"]] == [None]


def test_the_gpu_s_index_in_the_advice_is_nvidia_smi_s_not_its_minor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With 18:00.0 on vfio-pci, the MIG GPU 2a:00.0 (minor 1) is nvidia-smi's GPU 0."""
    root = copy_example(tmp_path, "mig")
    shutil.rmtree(root / CAPTURED)
    caps = root / "proc/driver/nvidia/capabilities"
    (caps / "gpu0").rename(caps / "gpu1")
    to_vfio = root / "sys/bus/pci/devices/0000:18:00.0/driver"
    to_vfio.unlink()
    to_vfio.symlink_to("../../../../bus/pci/drivers/vfio-pci")
    (root / "sys/bus/pci/drivers/vfio-pci").mkdir(exist_ok=True)
    shutil.rmtree(root / "proc/driver/nvidia/gpus/0000:18:00.0")
    assert main(["plan", "--root", str(root), "--lxc", "200:mig=0000:2a:00.0/2"]) == 0
    assert "lists it as the MIG Device of GPU 0 that" in capsys.readouterr().out


def test_apply_of_a_saved_plan_refuses_once_the_instance_is_gone(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "mig")
    host = DirectoryHost(str(root))
    inventory = inspect(host)
    plan = plan_split(inventory, TWO)
    path = str(tmp_path / "plan.json")
    save_plan(path, host.name, plan, render(inventory, plan), key=b"k" * 32)
    # The admin destroys GPU instance 9 (nvidia-smi mig -dci -gi 9; -dgi -gi 9).
    for proc in (root / CAPS / "gi9/ci0/access", root / CAPS / "gi9/access"):
        proc.unlink()
    saved = load_plan(path, key=b"k" * 32)
    with pytest.raises(PreflightError) as caught:
        apply_changes(host, saved.changes, plan=saved.plan)
    assert "MIG GI 9 CI 0 of GPU 0 (CT 201) is gone" in str(caught.value)
    assert (root / CT_201.lstrip("/")).read_text() == inventory.guest_configs[CT_201]


def test_apply_refuses_an_instance_made_again_with_other_minors(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "mig")
    host = DirectoryHost(str(root))
    inventory = inspect(host)
    plan = plan_split(inventory, TWO)
    (root / CAPS / "gi2/ci0/access").write_text(
        "DeviceFileMinor: 23\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    )
    with pytest.raises(PreflightError, match="has capability minors 21,23, the plan 21,22"):
        apply_changes(host, render(inventory, plan), plan=plan)


def test_verify_reports_an_instance_gone_since_the_apply(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "mig")
    host = DirectoryHost(str(root))
    plan = plan_split(inspect(host), TWO)
    assert [line for line in verify(host, plan).drift if "MIG" in line or "GI" in line] == []
    (root / CAPS / "gi2/ci0/access").unlink()
    drift = verify(host, plan).drift
    assert "0000:18:00.0 GI 2 CI 0 (CT 200): gone from the host; make it again" in drift[0]


def test_the_picture_colours_the_mig_gpu_and_badges_its_containers() -> None:
    plan = plan_split(mig_host(), TWO)
    root = ET.fromstring(inventory_svg(mig_host(), assignments(plan)))
    boxes = {e.attrib.get("id"): e.attrib.get("class") for e in root.iter() if "id" in e.attrib}
    assert boxes[svg_id("gpu", "0000:18:00.0")] == "pg-gpu-mig"
    texts = ["".join(e.itertext()) for e in root.iter() if e.tag.endswith("text")]
    assert "MIG: CT 200, CT 201" in texts


def test_the_report_says_which_container_has_which_instance() -> None:
    html = render_report([plan_report(mig_host(), TWO)])
    said = (
        f"for MIG instances of it: CT 200 (GI 2 CI 0, {UUID_2_0}), CT 201 (GI 9 CI 0, {UUID_9_0})"
    )
    assert said in html


def test_a_mig_gpu_the_next_boot_numbers_anew_gets_the_nodes_of_its_new_minor() -> None:
    # As if 0000:ab:00.0 (nvidia3) were the MIG GPU: 0000:9a:00.0 goes to vfio-pci, and at the
    # next boot nvidia numbers 0000:ab:00.0 2, which renames its instances' files and minors by
    # NVIDIA's table: GI 2 of GPU 2 is nvidia-cap291, its CI 0 nvidia-cap292.
    inventory = mig_host()
    instances = inventory.gpu("0000:18:00.0").mig_instances
    gpus = [
        replace(g, mig_instances=instances if g.address == "0000:ab:00.0" else [])
        for g in inventory.gpus
    ]
    moved = replace(inventory, gpus=gpus)
    mig = [MigSpec(vmid=200, gpu="ab:00.0", gi=2)]
    plan = plan_split(moved, SplitPolicy(lxc_mig=mig, vfio_gpus=["9a:00.0"]))
    changes = render(moved, plan)
    new = ["/dev/nvidia-caps/nvidia-cap291", "/dev/nvidia-caps/nvidia-cap292"]
    warning = next(w for w in changes.notes if w.startswith("CT 200: 0000:ab:00.0 becomes"))
    assert warning.startswith("CT 200: 0000:ab:00.0 becomes /dev/nvidia2 at the next boot, and MIG")
    assert warning.endswith(f"become {', '.join(new)}")
    config = next(f.after for f in changes.files if f.path == CT_200)
    assert [entry.split(",")[0] for entry in dev_entries(config) if "caps" in entry] == new
    script = next(f.after or "" for f in changes.files if f.path == NODES_SCRIPT)
    assert "cap driver/nvidia/capabilities/gpu2/mig/gi2/access\n" in script
    assert "cap driver/nvidia/capabilities/gpu2/mig/gi2/ci0/access\n" in script
    assert not [w for w in render(mig_host(), plan_split(mig_host(), TWO)).warnings if "minor" in w]


def test_inspection_marks_only_the_gpu_with_gpu_instances_as_in_mig_mode() -> None:
    assert [(g.address, g.mig_mode) for g in mig_host().gpus] == [
        ("0000:18:00.0", True),
        ("0000:2a:00.0", False),
        ("0000:9a:00.0", False),
        ("0000:ab:00.0", False),
    ]


def test_run_never_counts_the_gpu_in_mig_mode_and_says_what_to_use_instead(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = ["run", "--dry-run", "--root", str(ROOT), "--node", "0", "--tp"]
    assert main([*run, "2", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert (
        "NUMA node 0 has fewer than 2 CUDA GPUs: node 0 has 1, node 1 has 2 (not counted: CUDA "
        "GPU 0: 0000:18:00.0 is in MIG mode: CUDA runs only on its MIG devices, never on the "
        "whole GPU; give a job one of them with CUDA_VISIBLE_DEVICES=MIG-" in err
    )
    # The GPU in MIG mode keeps nvidia-smi's index 0: node 0's whole GPU is 1.
    assert main([*run, "1", "--", "true"]) == 0
    captured = capsys.readouterr()
    assert "CUDA_VISIBLE_DEVICES=1\n" in captured.out
    assert "passed over CUDA GPU 0: 0000:18:00.0 is in MIG mode" in captured.err


def test_check_gpus_says_the_gpu_is_in_mig_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-gpus", "0,1", "--root", str(ROOT), "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)["gpus"]
    assert [g["address"] for g in gpus if g["not_whole"]] == ["0000:18:00.0"]
    assert "is in MIG mode: CUDA runs only on its MIG devices" in gpus[0]["not_whole"]


def test_a_container_on_the_other_node_gets_none_of_the_moving_gpu_s_instances() -> None:
    """GPU 0 leaves for vfio-pci: its instances' /proc files are gone after the reboot, so
    neither CT 200 (node 1's GPUs) nor the boot unit may name them."""
    plan = plan_split(mig_host(), SplitPolicy(lxc=200, host_nodes=[1], vms=[(300, None)]))
    files = {f.path: f.after for f in render(mig_host(), plan).files}
    caps = [entry for entry in dev_entries(files[CT_200]) if "nvidia-caps" in entry]
    assert caps == [
        "/dev/nvidia-caps/nvidia-cap1,mode=0400",
        "/dev/nvidia-caps/nvidia-cap2,mode=0444",
    ]
    script = files["/usr/local/sbin/proxgpu-nvidia-nodes"]
    assert script is not None
    assert not [line for line in script.splitlines() if "/gpu0/" in line]


def test_a_mig_instance_alone_moves_no_gpu_and_needs_no_reboot() -> None:
    """A MIG-only request (no split asked for): the container's config and the nodes unit
    change, no GPU leaves its driver, nothing binds to vfio-pci, no reboot."""
    inventory = mig_host()
    changes = render(inventory, plan_split(inventory, SplitPolicy(lxc_mig=TWO.lxc_mig[:1])))
    changed = {f.path for f in changes.changed_files()}
    assert CT_200 in changed and NODES_SCRIPT in changed
    assert not [path for path in changed if "vfio" in path or path.startswith("/etc/modprobe.d")]
    assert not changes.reboot_required
