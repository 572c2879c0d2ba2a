"""Rendering: golden change sets, idempotence, and edits that touch nothing else.

Golden files live in tests/golden/; regenerate them after a deliberate change with
``PROXGPU_UPDATE_GOLDEN=1 python -m pytest tests/local/test_rendering.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxgpu.cli.plan_text import render_changes
from proxgpu.errors import RenderError
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.paths import BIND_SCRIPT, MODPROBE_CONF
from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering import RenderOptions, render
from proxgpu.rendering.changes import ChangeSet
from proxgpu.rendering.nodes import rules_file
from tests.support.pvevalidate import corpus_files, proxmox_sources
from tests.support.scenarios import SCENARIOS, scenario
from tests.support.trees import EXAMPLES, GOLDEN, copy_example


def write_changes(root: Path, changes: ChangeSet) -> None:
    """Put a change set's result into a tree (the test's stand-in for apply)."""
    for change in changes.files:
        target = root / change.path.lstrip("/")
        if change.after is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(change.after)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_change_sets(name: str) -> None:
    text = render_changes(scenario(name)[1])
    golden = GOLDEN / f"{name}.diff"
    if os.environ.get("PROXGPU_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_rendering_twice_gives_the_same_bytes(name: str) -> None:
    assert scenario(name)[1] == scenario(name)[1]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_rendering_against_the_result_changes_nothing(name: str, tmp_path: Path) -> None:
    root = copy_example(tmp_path, SCENARIOS[name][0])
    first = scenario(name, root)[1]
    assert first.changed
    write_changes(root, first)
    second = scenario(name, root)[1]
    assert not second.changed, [f.path for f in second.changed_files()]
    assert second.summary().startswith("Nothing to do: the host already matches")
    assert not any("numaN" in w for w in second.warnings), "our own numa0 is not the admin's"


def test_lxc_gets_exactly_its_own_minors_and_loses_the_wildcard() -> None:
    _, changes = scenario("ct200-lxc-vm")
    after = next(f.after for f in changes.files if f.path == "/etc/pve/lxc/200.conf")
    assert after is not None
    config = GuestConfig.parse(after)
    devices = [v.split(",")[0] for k, v in config.entries() if re.fullmatch(r"dev\d+", k)]
    assert devices[:4] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"]
    assert "/dev/nvidia4" not in devices and "c 195:* rwm" not in after
    assert config.get("lxc.cgroup2.cpuset.cpus") == "0-31"
    assert config.get("lxc.cgroup2.cpuset.mems") == "0"
    assert config.get("mp0") == "/tank/models,mp=/models", "unrelated entries stay"


def test_binding_names_only_vfio_functions() -> None:
    inventory, changes = scenario("ct200-lxc-vm")
    script = next(f.after for f in changes.files if f.path == BIND_SCRIPT) or ""
    conf = next(f.after for f in changes.files if f.path == MODPROBE_CONF) or ""
    # The script's loops: the functions marked for vfio-pci, then the kept ones with their driver.
    marked, kept = [line for line in script.splitlines() if line.startswith("for ")]
    for gpu in inventory.gpus:
        for address in gpu.functions:
            assert (f" {address} " in marked.replace(";", " ")) == (gpu.numa_node == 1)
            assert (f" {address}=" in kept) == (gpu.numa_node == 0)
            assert (address in conf) == (gpu.numa_node == 1)
    settings = [line for line in conf.splitlines() if not line.startswith("#")]
    assert not any("ids=" in line for line in settings), "ids= would take all eight GPUs"
    assert "softdep snd_hda_intel pre: vfio-pci" in conf, "the audio function's driver too"


def old_proxmox(tmp_path: Path) -> Path:
    root = copy_example(tmp_path, "ct200")
    pvecfg = root / "usr/share/perl5/PVE/pvecfg.pm"
    pvecfg.write_text(pvecfg.read_text().replace("'8.4.1'", "'7.4.3'"))
    return root


def test_old_proxmox_gets_raw_lines_whose_cgroup_rules_the_unit_writes(tmp_path: Path) -> None:
    _, changes = scenario("ct200-lxc-vm", old_proxmox(tmp_path))
    after = next(f.after for f in changes.files if f.path == "/etc/pve/lxc/200.conf") or ""
    assert not re.findall(r"^lxc\.cgroup2\.devices\.allow: (.*)$", after, re.MULTILINE)
    assert re.findall(r"^lxc\.include: (.*)$", after, re.MULTILINE) == [rules_file(200)]
    assert "dev0:" not in after
    assert "lxc.mount.entry: /dev/nvidia3 dev/nvidia3 none bind,optional,create=file" in after
    assert "/dev/nvidia4" not in after


def test_old_proxmox_without_the_unit_gets_explicit_minors(tmp_path: Path) -> None:
    inventory = inspect(DirectoryHost(str(old_proxmox(tmp_path))))
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    changes = render(inventory, plan, RenderOptions(nvidia_nodes_unit=False))
    after = next(f.after for f in changes.files if f.path == "/etc/pve/lxc/200.conf") or ""
    allowed = re.findall(r"^lxc\.cgroup2\.devices\.allow: (.*)$", after, re.MULTILINE)
    assert allowed == [
        "c 195:0 rwm",
        "c 195:1 rwm",
        "c 195:2 rwm",
        "c 195:3 rwm",
        "c 195:255 rwm",
        "c 195:254 rwm",
        "c 511:0 rwm",
        "c 511:1 rwm",
    ]
    assert "lxc.include" not in after


def test_existing_unrelated_hostpci_stays_and_gpus_take_free_indices(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "ct200")
    vm = root / "etc/pve/qemu-server/300.conf"
    vm.write_text(
        vm.read_text().replace("bios: ovmf\n", "bios: ovmf\nhostpci1: 0000:c1:00.0,pcie=1\n")
    )
    _, changes = scenario("ct200-lxc-vm", root)
    after = GuestConfig.parse(next(f.after for f in changes.files if "qemu-server" in f.path) or "")
    assert after.get("hostpci1") == "0000:c1:00.0,pcie=1"
    assert [after.get(f"hostpci{i}") for i in (0, 2, 3, 4)] == [
        "0000:81:00,pcie=1",
        "0000:91:00,pcie=1",
        "0000:e1:00,pcie=1",
        "0000:f1:00,pcie=1",
    ]


def test_gpu_no_longer_given_to_the_vm_is_removed_from_it(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "ct200")
    vm = root / "etc/pve/qemu-server/300.conf"
    vm.write_text(vm.read_text() + "hostpci0: 0000:01:00,pcie=1\n")
    inventory = inspect(DirectoryHost(str(root)))
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, 2)]))
    after = next(f.after for f in render(inventory, plan).files if "qemu-server" in f.path) or ""
    assert "0000:01:00" not in after
    assert after.count("hostpci") == 2


def test_switching_bind_method_removes_the_other_methods_files(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "ct200")
    write_changes(root, scenario("ct200-lxc-vm", root)[1])
    _, changes = scenario("ct200-driverctl", root)
    removed = {f.path for f in changes.changed_files() if f.after is None}
    assert {MODPROBE_CONF, BIND_SCRIPT, "/etc/initramfs-tools/hooks/proxgpu"} <= removed
    created = {f.path for f in changes.changed_files() if f.before is None}
    assert "/etc/driverctl.d/pci-0000:81:00.1" in created
    assert "driverctl is not installed on the host: apt install driverctl" in changes.warnings


def test_kernel_cmdline_only_when_the_iommu_is_off() -> None:
    paths = {f.path for f in scenario("ct200-lxc-vm")[1].changed_files()}
    assert "/etc/kernel/cmdline" not in paths
    changes = scenario("uneven-enable-iommu")[1]
    grub = next(f for f in changes.files if f.path == "/etc/default/grub")
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on iommu=pt"' in (grub.after or "")
    assert [a.argv for a in changes.actions] == [
        ["update-initramfs", "-u", "-k", "all"],
        ["update-grub"],
        ["systemctl", "daemon-reload"],  # the unit that makes the container's nvidia nodes
    ]
    modules = next(f.after for f in changes.files if "modules-load" in f.path) or ""
    assert "vfio_virqfd" not in modules, "vfio_virqfd is part of vfio from kernel 6.2 on"


def test_kernels_before_6_2_also_load_vfio_virqfd(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "uneven-5-3")
    (root / "proc/sys/kernel/osrelease").write_text("5.15.158-2-pve\n")
    changes = scenario("uneven-enable-iommu", root)[1]
    modules = next(f.after for f in changes.files if "modules-load" in f.path) or ""
    assert modules.splitlines()[1:] == ["vfio", "vfio_iommu_type1", "vfio_pci", "vfio_virqfd"]


def test_missing_target_config_is_a_render_error() -> None:
    inventory = inspect(DirectoryHost(str(EXAMPLES / "ct200")))
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    bad = plan.model_copy(
        update={
            "groups": [
                g.model_copy(update={"guest": g.guest.model_copy(update={"vmid": 999})})
                if g.guest and g.guest.type == "vm"
                else g
                for g in plan.groups
            ]
        }
    )
    with pytest.raises(
        RenderError,
        match=r"/etc/pve/qemu-server/999\.conf: no such VM config; create the VM first "
        r"\(`qm create`\) or name one that exists \(300\)",
    ):
        render(inventory, bad)


def _managed(line: str) -> bool:
    return bool(
        re.match(
            r"(dev\d+: /dev/nvidia|lxc\.cgroup2?\.devices\.allow\s*[:=]\s*c (195|511):|"
            r"lxc\.mount\.entry\s*[:=]\s*/dev/nvidia|lxc\.cgroup2\.cpuset\.|cores:)",
            line,
        )
    )


def _check_only_managed_lines_changed(before: str, after: str) -> None:
    kept_before = [line for line in before.split("\n") if not _managed(line)]
    kept_after = [line for line in after.split("\n") if not _managed(line)]
    assert kept_before == kept_after


def _render_with_lxc_config(tmp_path: Path, text: str) -> str:
    root = tmp_path / "host"
    if not root.exists():
        copy_example(tmp_path, dest="host")
    (root / "etc/pve/lxc/200.conf").write_text(text)
    _, changes = scenario("ct200-lxc-vm", root)
    return next(f.after for f in changes.files if f.path == "/etc/pve/lxc/200.conf") or ""


def test_real_container_configs_keep_every_unmanaged_byte(tmp_path: Path) -> None:
    proxmox_sources()
    configs = corpus_files("lxc")
    assert len(configs) > 100
    for path in configs:
        text = path.read_text()
        after = _render_with_lxc_config(tmp_path, text)
        _check_only_managed_lines_changed(text, after)
        assert _render_with_lxc_config(tmp_path, after) == after, path.name


unrelated_line = st.sampled_from(
    [
        "arch: amd64",
        "cores: 4",
        "memory: 2048",
        "#a description line",
        "",
        "lxc.apparmor.profile: unconfined",
        "lxc.cap.drop:",
        "mp0: /srv,mp=/srv",
        "lxc.cgroup2.devices.allow: c 10:200 rwm",
        "dev0: /dev/ttyUSB0",
        "lxc.mount.entry: /dev/net dev/net none bind,create=dir",
    ]
)
gpu_line = st.sampled_from(
    [
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow = c 511:* rwm",
        "lxc.mount.entry: /dev/nvidia5 dev/nvidia5 none bind,optional,create=file",
        "dev3: /dev/nvidia6,gid=44",
        "lxc.cgroup2.cpuset.cpus: 0-63",
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.one_of(unrelated_line, gpu_line), max_size=14),
    snapshot=st.lists(st.one_of(unrelated_line, gpu_line), max_size=5),
)
def test_lxc_edit_never_changes_bytes_it_does_not_manage(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], snapshot: list[str]
) -> None:
    text = (
        "\n".join(lines)
        + "\n"
        + "[before-upgrade]\nsnaptime: 1700000000\n"
        + "\n".join(snapshot)
        + "\n"
    )
    after = _render_with_lxc_config(tmp_path_factory.mktemp("h"), text)
    _check_only_managed_lines_changed(text, after)
    snapshot_part = text[text.index("[before-upgrade]") :]
    assert after.endswith(snapshot_part), "a snapshot section is never edited"


def test_a_cluster_mapping_keeps_other_nodes_and_its_description(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "ct200")
    (root / "etc/pve/mapping").mkdir(parents=True)
    (root / "etc/pve/mapping/pci.cfg").write_text(
        "gpu-node1\n\tdescription four GPUs per node\n"
        "\tmap id=10de:2bb1,iommugroup=7,node=pve2,path=0000:41:00,subsystem-id=10de:204b\n"
        "\tmap id=10de:2bb1,iommugroup=60,node=ct200,path=0000:01:00,subsystem-id=10de:204b\n"
        "\tmap id=10de:2bb1,iommugroup=9,node=pve2,path=0000:42:00,subsystem-id=10de:204b\n"
    )
    _, changes = scenario("ct200-mapping", root)
    after = next(f.after for f in changes.files if f.path.endswith("pci.cfg")) or ""
    lines = after.splitlines()
    assert lines[1] == "\tdescription four GPUs per node"
    assert lines[2].endswith("node=pve2,path=0000:41:00,subsystem-id=10de:204b")
    assert [line.split("path=")[1][:10] for line in lines[3:7]] == [
        "0000:81:00",
        "0000:91:00",
        "0000:e1:00",
        "0000:f1:00",
    ]
    assert lines[7].endswith("node=pve2,path=0000:42:00,subsystem-id=10de:204b")
    assert "0000:01:00" not in after, "this node's old map line is replaced"


@pytest.mark.parametrize(
    ("path", "line", "reason"),
    [
        (
            "etc/modprobe.d/vfio.conf",
            "options vfio-pci ids=10de:2bb1,10de:22e8",
            "vfio-pci would take every 10de:22e8, 10de:2bb1 device",
        ),
        ("etc/modprobe.d/blacklist-nvidia.conf", "blacklist nvidia", "nvidia would not load"),
        (
            "etc/kernel/cmdline",
            "root=ZFS=rpool/ROOT/pve-1 boot=zfs vfio-pci.ids=10de:2bb1",
            "vfio-pci would take every 10de:2bb1 device",
        ),
    ],
)
def test_settings_that_would_take_the_kept_gpus_are_refused(
    tmp_path: Path, path: str, line: str, reason: str
) -> None:
    root = copy_example(tmp_path, "ct200")
    (root / path).write_text(line + "\n")
    with pytest.raises(RenderError) as err:
        scenario("ct200-lxc-vm", root)
    assert f"/{path}:1: {line}: {reason}" in str(err.value)


def test_gpus_kept_on_node1_get_the_minors_of_the_next_boot(tmp_path: Path) -> None:
    inventory = inspect(DirectoryHost(str(EXAMPLES / "ct200")))
    plan = plan_split(inventory, SplitPolicy(host_nodes=[1], vfio_nodes=[0], lxc=200))
    changes = render(inventory, plan)
    after = next(f.after for f in changes.files if f.path == "/etc/pve/lxc/200.conf") or ""
    devices = [
        v.split(",")[0] for k, v in GuestConfig.parse(after).entries() if k.startswith("dev")
    ]
    assert devices[:4] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"]
    assert any("0000:81:00.0 becomes /dev/nvidia0" in w for w in changes.warnings)


def test_gpus_returning_from_vfio_get_nvidia_nodes_not_dri(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "ct200")
    for bus in ("81", "91", "e1", "f1"):
        for fn in "01":
            link = root / f"sys/bus/pci/devices/0000:{bus}:00.{fn}/driver"
            link.unlink()
            link.symlink_to("../../../bus/pci/drivers/vfio-pci")
        (root / f"proc/driver/nvidia/gpus/0000:{bus}:00.0/information").unlink()
    inventory = inspect(DirectoryHost(str(root)))
    plan = plan_split(inventory, SplitPolicy(host_nodes=[1], vfio_nodes=[0], lxc=200))
    assert plan.groups[0].driver == "nvidia"
    after = next(f.after for f in render(inventory, plan).files if "lxc" in f.path) or ""
    assert "/dev/dri" not in after and "dev0: /dev/nvidia0" in after
    assert "/dev/nvidiactl" in after


def test_grub_on_proxmox_boot_tool_refreshes_the_esps(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "uneven-5-3")
    (root / "etc/kernel").mkdir()
    (root / "etc/kernel/proxmox-boot-uuids").write_text("4A1C-2B7F\n")
    changes = scenario("uneven-enable-iommu", root)[1]
    assert ["proxmox-boot-tool", "refresh"] in [a.argv for a in changes.actions]
    assert ["update-grub"] not in [a.argv for a in changes.actions]


def test_a_malformed_guest_entry_is_a_render_error_naming_the_file(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "ct200")
    lxc = root / "etc/pve/lxc/200.conf"
    lxc.write_text(lxc.read_text() + "dev9: /dev/nvidia0,gid=1,gid=2\n")
    with pytest.raises(RenderError, match=r"/etc/pve/lxc/200\.conf: .*gid"):
        scenario("ct200-lxc-vm", root)


def test_another_cards_dri_node_in_the_container_stays(tmp_path: Path) -> None:
    root = copy_example(tmp_path, "ct200")
    lxc = root / "etc/pve/lxc/200.conf"
    igpu = "lxc.mount.entry: /dev/dri/renderD128 dev/dri/renderD128 none bind,optional,create=file"
    lxc.write_text(lxc.read_text() + igpu + "\ndev9: /dev/dri/card1,gid=44\n")
    after = next(f.after for f in scenario("ct200-lxc-vm", root)[1].files if "lxc" in f.path) or ""
    assert igpu in after and "dev9: /dev/dri/card1,gid=44" in after
