"""Verify (proxgpu.apply.verify) against a plan and against the journal entries an apply or a
rollback wrote: drift in the files and lines proxgpu set, drivers still waiting for a reboot."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxgpu.apply.journal import JournalEntry, history
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.apply.verify import verify
from proxgpu.cli import main
from proxgpu.errors import DriftError
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.paths import MODPROBE_CONF
from proxgpu.rendering.changes import ChangeSet, FileChange
from tests.support.trees import (
    DRIVERCTL,
    LXC,
    MODULES,
    VFIO_CONF,
    VM,
    changeset,
    copy_example,
    ct200_plan,
    edit,
    text,
)

PCI_CFG = "/etc/pve/mapping/pci.cfg"
CMDLINE = "/etc/kernel/cmdline"
GRUB = "/etc/default/grub"
# Verify names the guest of each config it reports drift in.
CT_200, VM_300 = f"{LXC} (CT 200)", f"{VM} (VM 300)"
OUR_MAP = "map id=10de:2bb5,iommugroup=60,node=ct200,path=0000:81:00.0"


def test_verify_reports_file_drift_and_drivers_still_waiting_for_a_reboot(root: Path) -> None:
    host = DirectoryHost(str(root))
    plan = ct200_plan(root)
    apply_changes(host, changeset(root), plan=plan)
    [entry] = history(host)
    report = verify(host, entry)
    # A tree has no kernel: its GPUs stay on nvidia, as a host would until it reboots. The boot
    # is the one the apply ran in, so that is a pending reboot, not drift.
    assert not report.drifted and len(report.pending_reboot) == 8
    assert report.pending_reboot[0] == (
        "0000:81:00.0: bound to nvidia, the plan says vfio-pci (at the next boot)"
    )
    rebooted = entry.model_copy(update={"boot_id": "another-boot"})
    drift = verify(host, rebooted).drift[:8]
    assert [line.split(": its driver_override")[0] for line in drift] == [
        line.removesuffix(" (at the next boot)") for line in report.pending_reboot
    ], "after a reboot, drivers not as planned are drift, each saying why"
    (root / MODULES.lstrip("/")).write_text("edited\n")
    (root / DRIVERCTL.lstrip("/")).unlink()
    files = [line for line in verify(host, entry).drift if line.startswith("/")]
    assert files == [
        f"{MODULES}: differs from what apply {entry.id} left there",
        f"{DRIVERCTL}: missing, but apply {entry.id} left it in place",
    ]


def test_verify_against_a_plan_checks_each_functions_driver(root: Path) -> None:
    host = DirectoryHost(str(root))
    plan = ct200_plan(root)
    report = verify(host, plan)
    assert (
        "0000:81:00.1: bound to snd_hda_intel, the plan says vfio-pci: its driver_override is "
        "empty, so proxgpu's bind script did not run before snd_hda_intel took it: "
        "/etc/modprobe.d/00-proxgpu-vfio.conf is missing (run proxgpu apply again)"
    ) in report.drift
    assert not any(line.startswith("0000:01:") for line in report.drift), "host group is fine"
    # Each moved function's driver now, whether it drifted or not.
    assert report.moved["0000:81:00.0"] == "nvidia"
    assert report.moved["0000:81:00.1"] == "snd_hda_intel"
    assert not any(address.startswith("0000:01:") for address in report.moved)
    assert not verify(host, plan.model_copy(update={"groups": plan.groups[:1]})).drifted


def test_verify_after_rollback_expects_the_old_files(root: Path) -> None:
    host = DirectoryHost(str(root))
    apply_changes(host, changeset(root), plan=ct200_plan(root))
    rollback(host)
    [entry] = history(host)
    assert isinstance(entry, JournalEntry) and not verify(host, entry).drifted


def applied(root: Path, cs: ChangeSet) -> tuple[DirectoryHost, JournalEntry]:
    host = DirectoryHost(str(root))
    apply_changes(host, cs)
    [entry] = history(host)
    assert not verify(host, entry).drifted
    return host, entry


def test_verify_ignores_edits_to_what_the_apply_did_not_change_in_guest_configs(
    root: Path,
) -> None:
    host, entry = applied(root, changeset(root))
    # What Proxmox and the admin do to a guest afterwards: a snapshot, `qm set --tags`, more
    # memory, a new description, a raw lxc key of their own.
    edit(root, VM, "memory: 262144\n", "memory: 131072\ntags: gpu\n")
    edit(root, VM, "#Training VM", "#Edited in the GUI\n#Training VM")
    vm = root / VM.lstrip("/")
    vm.write_text(vm.read_text() + "\n[before-upgrade]\nmemory: 262144\nsnaptime: 1760000000\n")
    edit(root, LXC, "cores: 64\n", "cores: 32\n")
    edit(root, LXC, "swap: 0\n", "swap: 0\nlxc.apparmor.profile: unconfined\n")
    assert verify(host, entry).drift == []


def test_verify_names_the_entry_and_the_file_when_what_the_apply_set_changed(root: Path) -> None:
    host, entry = applied(root, changeset(root))
    edit(root, VM, "hostpci0: 0000:81:00,pcie=1\n", "hostpci0: 0000:91:00,pcie=1\n")
    edit(root, LXC, "lxc.cgroup2.cpuset.cpus: 0-31\n", "")
    assert verify(host, entry).drift == [
        f'{CT_200}: "lxc.cgroup2.cpuset.cpus: 0-31" is gone, but apply {entry.id} put it there',
        f'{VM_300}: hostpci0 is now "0000:91:00,pcie=1", but apply {entry.id} set '
        '"0000:81:00,pcie=1"',
    ]
    edit(root, VM, "hostpci0: 0000:91:00,pcie=1\n", "")
    assert verify(host, entry).drift[1] == (
        f'{VM_300}: "hostpci0: 0000:81:00,pcie=1" is gone, but apply {entry.id} put it there'
    )


def test_verify_checks_the_entries_an_apply_removed_stay_removed(root: Path) -> None:
    lxc = text(root, LXC)
    assert lxc is not None
    gone = "lxc.cgroup2.devices.allow: c 195:* rwm\n"
    cs = ChangeSet(
        host="ct200",
        files=[
            FileChange(path=LXC, before=lxc, after=lxc.replace(gone, "").replace("onboot: 1\n", ""))
        ],
    )
    host, entry = applied(root, cs)
    edit(root, LXC, "swap: 0\n", f"swap: 0\nonboot: 0\n{gone}")
    assert verify(host, entry).drift == [
        f'{CT_200}: "lxc.cgroup2.devices.allow: c 195:* rwm" is back, but apply {entry.id} '
        "removed it",
        f'{CT_200}: "onboot: 0" is back, but apply {entry.id} removed it',
    ]


def test_verify_after_rollback_checks_only_what_the_rollback_put_back(root: Path) -> None:
    host = DirectoryHost(str(root))
    apply_changes(host, changeset(root))
    rollback(host)
    [entry] = history(host)
    edit(root, VM, "memory: 262144\n", "memory: 131072\n")
    assert verify(host, entry).drift == []
    edit(root, VM, "memory: 131072\n", "memory: 131072\nhostpci0: 0000:81:00,pcie=1\n")
    assert verify(host, entry).drift == [
        f'{VM_300}: "hostpci0: 0000:81:00,pcie=1" is back, but the rollback of {entry.id} '
        "removed it"
    ]


def test_verify_compares_the_pci_mapping_line_by_line_within_each_id(root: Path) -> None:
    ours = f"gpu-node1\n\t{OUR_MAP}\n"
    host, entry = applied(
        root, ChangeSet(host="ct200", files=[FileChange(path=PCI_CFG, before=None, after=ours)])
    )
    # Mappings are cluster-wide: another node adds its own map line, someone another mapping.
    other_node = "\tmap id=10de:2bb5,iommugroup=12,node=pve2,path=0000:41:00.0\n"
    edit(
        root,
        PCI_CFG,
        ours,
        f"{ours}{other_node}\nnic\n\tmap id=8086:1572,node=ct200,path=0000:c1:00.0\n",
    )
    assert verify(host, entry).drift == []
    edit(root, PCI_CFG, f"\t{OUR_MAP}\n", "")
    assert verify(host, entry).drift == [
        f'{PCI_CFG}: mapping gpu-node1: "{OUR_MAP}" is gone, but apply {entry.id} put it there'
    ]
    edit(root, PCI_CFG, f"gpu-node1\n{other_node}\n", "")
    assert verify(host, entry).drift == [
        f"{PCI_CFG}: mapping gpu-node1 is gone, but apply {entry.id} put it there"
    ]


def test_verify_checks_only_the_kernel_parameters_the_apply_added(root: Path) -> None:
    cmdline = text(root, CMDLINE)
    assert cmdline == "root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt\n"
    grub = (
        'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
        'GRUB_CMDLINE_LINUX=""\n'
    )
    (root / GRUB.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / GRUB.lstrip("/")).write_text(grub)
    cs = ChangeSet(
        host="ct200",
        files=[
            FileChange(
                path=CMDLINE, before=cmdline, after=cmdline.replace("=pt", "=pt intel_iommu=on")
            ),
            FileChange(
                path=GRUB,
                before=grub,
                after=grub.replace('"quiet"', '"quiet intel_iommu=on iommu=pt"'),
            ),
        ],
    )
    host, entry = applied(root, cs)
    # Other parameters come and go; iommu=pt was on the systemd-boot line before the apply.
    (root / CMDLINE.lstrip("/")).write_text("root=ZFS=rpool/ROOT/pve-1 intel_iommu=on quiet\n")
    edit(root, GRUB, "GRUB_TIMEOUT=5", "GRUB_TIMEOUT=1")
    edit(root, GRUB, 'LINUX_DEFAULT="quiet intel_iommu=on iommu=pt"', 'LINUX_DEFAULT="iommu=pt"')
    edit(root, GRUB, 'GRUB_CMDLINE_LINUX=""', 'GRUB_CMDLINE_LINUX="intel_iommu=on"')
    assert verify(host, entry).drift == []
    (root / CMDLINE.lstrip("/")).write_text("root=ZFS=rpool/ROOT/pve-1 quiet\n")
    edit(root, GRUB, 'LINUX_DEFAULT="iommu=pt"', 'LINUX_DEFAULT=""')
    assert verify(host, entry).drift == [
        f'{CMDLINE}: kernel parameter "intel_iommu=on" is gone, but apply {entry.id} put it there',
        f'{GRUB}: kernel parameter "iommu=pt" is gone, but apply {entry.id} put it there',
    ]


def test_verify_compares_the_files_proxgpu_owns_byte_for_byte(root: Path) -> None:
    host, entry = applied(root, changeset(root))
    target = root / VFIO_CONF.lstrip("/")
    target.write_text(target.read_text() + "# a comment\n")
    assert verify(host, entry).drift == [
        f"{VFIO_CONF}: differs from what apply {entry.id} left there"
    ]


def test_verify_reads_the_edited_files_in_one_more_command_only_when_needed(root: Path) -> None:
    host, entry = applied(root, changeset(root))
    before = host.commands_run
    verify(host, entry)
    assert host.commands_run == before + 1, "every hash matches: nothing to read"
    edit(root, VM, "memory: 262144\n", "memory: 131072\n")
    edit(root, LXC, "cores: 64\n", "cores: 32\n")
    before = host.commands_run
    verify(host, entry)
    assert host.commands_run == before + 2, "one more command reads both configs"


def test_verify_finds_a_vfio_ids_option_left_by_hand_for_the_kept_gpus(root: Path) -> None:
    # The kept GPUs are on their driver today, but vfio-pci would take them at the next boot.
    host = DirectoryHost(str(root))
    plan = ct200_plan(root)
    apply_changes(host, changeset(root), plan=plan)
    [entry] = history(host)
    assert not verify(host, entry).drifted
    kept = next(g for g in inspect(host).gpus if g.address in plan.groups[0].gpus)
    hand = root / "etc/modprobe.d/local-vfio.conf"
    hand.write_text(f"# left by hand\noptions vfio-pci ids={kept.vendor_id}:{kept.device_id}\n")
    report = verify(host, entry)
    assert report.drifted
    assert report.drift == [
        f"/etc/modprobe.d/local-vfio.conf:2: options vfio-pci ids={kept.vendor_id}:"
        f"{kept.device_id}: vfio-pci would take every {kept.vendor_id}:{kept.device_id} "
        "device, the kept ones too (remove it: proxgpu binds to vfio-pci by PCI address)"
    ]
    hand.unlink()
    assert not verify(host, entry).drifted


def test_verify_finds_the_softdep_line_an_upgrade_left_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new NVIDIA module declares another softdep (depmod writes it to modules.softdep at the
    upgrade): proxgpu's line, which kmod uses instead, still lists only the old ones."""
    tree = copy_example(tmp_path)
    assert main(["apply", "--root", str(tree), "--lxc", "200", "--yes"]) == 0
    softdep = tree / "lib/modules/6.8.12-11-pve/modules.softdep"
    upgraded = "softdep nvidia pre: ecdh_generic,ecdsa_generic post: nvidia_new"
    softdep.write_text(
        softdep.read_text().replace("softdep nvidia pre: ecdh_generic,ecdsa_generic", upgraded)
    )
    capsys.readouterr()
    assert main(["verify", "--root", str(tree)]) == DriftError.exit_code
    out = capsys.readouterr().out
    written = "softdep nvidia pre: vfio-pci ecdh_generic,ecdsa_generic"
    assert (
        f"{MODPROBE_CONF}: `{written}` no longer keeps the modules' own softdeps (a kernel or "
        "driver upgrade changed them), so kmod loads nvidia without them: proxgpu would write "
        f"`{written} post: nvidia_new` now; run `proxgpu plan` and apply again"
    ) in out, out
    assert main(["apply", "--root", str(tree), "--lxc", "200", "--yes"]) == 0
    assert main(["verify", "--root", str(tree)]) == 0, "applied again, the line keeps them"


def test_verify_finds_a_module_a_new_kernel_names_for_a_moved_function(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kernel installed after the apply has a driver for the moved GPUs that the one the plan
    read had not (nova-core's aliases, Linux 6.15 and later): proxgpu's file has no softdep for
    it, so it could take them at boot before vfio-pci."""
    tree = copy_example(tmp_path)
    assert main(["apply", "--root", str(tree), "--lxc", "200", "--vm", "300", "--yes"]) == 0
    capsys.readouterr()
    assert main(["verify", "--root", str(tree)]) == 0
    new = tree / "lib/modules/6.17.2-1-pve"
    new.mkdir()
    old = tree / "lib/modules/6.8.12-11-pve/modules.alias"
    (new / "modules.alias").write_text(
        old.read_text() + "alias pci:v000010DEd*sv*sd*bc03sc00i* nova_core\n"
    )
    capsys.readouterr()
    assert main(["verify", "--root", str(tree)]) == DriftError.exit_code
    out = capsys.readouterr().out
    assert (
        f"{MODPROBE_CONF}: no softdep line for nova_core, which could take a moved function at "
        "boot (a kernel or modprobe.d alias names it since the apply), so it may load before "
        "vfio-pci: proxgpu would write `softdep nova_core pre: vfio-pci` now"
    ) in out, out
    assert main(["apply", "--root", str(tree), "--lxc", "200", "--vm", "300", "--yes"]) == 0
    assert main(["verify", "--root", str(tree)]) == 0, "applied again, nova_core has its line"
