"""What proxgpu refuses on the real kernel of the QEMU test host, and what it finds: a GPU held
open, an ``options vfio-pci ids=`` left by hand, a host whose IOMMU is off while nvidia loads
from the initramfs.

The tests share the session's ``testhost`` with ``test_cli_e2e.py`` and leave it as they found
it (every GPU on nvidia, no journal entry applied: a test that applies rolls back and reboots);
the IOMMU-off host is a second machine of its own (``testhost_without_iommu``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from proxgpu.errors import DeviceBusyError, DriftError, PlanRefusedError, RenderError
from proxgpu.paths import MODPROBE_CONF

from .cli import json_of, proxgpu
from .phases import phase
from .test_cli_e2e import NODE0, NODE1, assert_original, drivers, loaded_before_root, minor_of
from .testhost import QemuTestHost

pytestmark = pytest.mark.e2e

# What the refusal of a busy GPU may take, inspection and the busy check included, on a loaded
# TCG guest (measured ~25 s); an unbind of a GPU held open would instead block for ever.
BUSY_REFUSAL_BOUND_S = 150.0
HAND_LEFT = "/etc/modprobe.d/local-vfio.conf"
JOURNAL = "/var/lib/proxgpu/journal"


def run_ok(host: QemuTestHost, script: str, timeout: float = 120) -> str:
    rc, out, err = host.ssh(["sh", "-c", script], timeout=timeout)
    assert rc == 0, f"{script} exited {rc}: {err}"
    return out


def journal_entries(host: QemuTestHost) -> list[str]:
    """The journal's entries (the shared host keeps those of the tests before: the reboot walks
    apply and roll back)."""
    rc, out, _ = host.ssh(["ls", JOURNAL])
    return [] if rc != 0 else out.split()


def test_apply_live_refuses_a_gpu_held_open_naming_the_holder_in_bounded_time(
    testhost: QemuTestHost, tmp_path: Path
) -> None:
    """A plain process holds the GPU's node open here, as a container's process would (the
    container itself is the guests' tests'). NVIDIA's nv_pci_remove (kernel-open/nvidia/nv-pci.c)
    waits for the GPU's usage count to drop, so an unbind now would never return: the apply has
    to refuse before it, naming the holder, and do so in bounded time."""
    gpu = NODE1[1]
    minor = minor_of(testhost, gpu)
    entries = journal_entries(testhost)
    # nvidia-modprobe makes the node as NVIDIA's tools do; $! is sleep's PID (setsid execs it).
    holder = (
        f"nvidia-modprobe -c {minor} && exec 3</dev/nvidia{minor}; "
        "setsid sleep 300 <&3 >/dev/null 2>&1 & echo $!"
    )
    pid = int(run_ok(testhost, holder).strip())
    try:
        started = time.monotonic()
        result = proxgpu(
            testhost, tmp_path, "apply", "--yes", "--live", timeout=BUSY_REFUSAL_BOUND_S + 60
        )
        took = time.monotonic() - started
        assert result.returncode == DeviceBusyError.exit_code, result.stdout + result.stderr
        assert gpu in result.stderr
        assert f"/dev/nvidia{minor} is held by pid {pid} (sleep)" in result.stderr, result.stderr
        assert took < BUSY_REFUSAL_BOUND_S, f"the refusal took {took:.0f} s"
    finally:
        testhost.ssh(["kill", str(pid)])
    assert_original(testhost)
    assert minor_of(testhost, gpu) == minor
    assert journal_entries(testhost) == entries, "a refused apply leaves no journal entry"


def test_a_vfio_ids_option_left_by_hand_is_found_by_plan_and_by_verify(
    testhost: QemuTestHost, tmp_path: Path
) -> None:
    """``options vfio-pci ids=`` for the GPUs' ID would take every such GPU, the kept ones too:
    vfio-pci's module init adds each ``ids=`` entry as a dynamic ID
    (drivers/vfio/pci/vfio_pci.c, vfio_pci_fill_ids), and the softdep proxgpu writes loads
    vfio-pci before nvidia. The plan refuses it; after an apply, verify names it as drift before
    and after the boot, while the kept GPUs' driver_override (written by the bind script) keeps
    them on nvidia through that boot."""
    gpus = json_of(proxgpu(testhost, tmp_path, "inspect", "--json"))["gpus"]
    ids = {f"{g['vendor_id']}:{g['device_id']}" for g in gpus}
    assert len(ids) == 1, "every stand-in GPU has the same ID"
    line = f"options vfio-pci ids={ids.pop()}"
    left = f"{HAND_LEFT}:1: {line}: vfio-pci would take every {line.split('=')[1]} device"
    run_ok(testhost, f"echo '{line}' > {HAND_LEFT}")
    try:
        planned = proxgpu(testhost, tmp_path, "plan")
        assert planned.returncode == RenderError.exit_code, planned.stdout + planned.stderr
        assert left in planned.stderr and "remove them" in planned.stderr, planned.stderr
    finally:
        run_ok(testhost, f"rm -f {HAND_LEFT}")

    applied = proxgpu(testhost, tmp_path, "apply", "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    try:
        run_ok(testhost, f"echo '{line}' > {HAND_LEFT}")
        before_boot = proxgpu(testhost, tmp_path, "verify")
        assert before_boot.returncode == DriftError.exit_code, before_boot.stdout
        assert left in before_boot.stdout, before_boot.stdout
        testhost.reboot()
        bound = drivers(testhost)
        # The bind script marks each kept function for its own driver before vfio-pci loads
        # (driver_override, which pci_match_device in drivers/pci/pci-driver.c checks before
        # the dynamic IDs that ids= adds), so the line takes only the GPUs that move.
        assert {bound[a] for a in NODE1} == {"vfio-pci"}, bound
        assert {bound[a] for a in NODE0} == {"nvidia"}, bound
        after_boot = proxgpu(testhost, tmp_path, "verify")
        assert after_boot.returncode == DriftError.exit_code, after_boot.stdout
        assert left in after_boot.stdout, "the line stays drift: it would take a new GPU"
        run_ok(testhost, f"rm -f {HAND_LEFT}")
        assert proxgpu(testhost, tmp_path, "verify").returncode == 0
    finally:
        testhost.ssh(["rm", "-f", HAND_LEFT])
        back = proxgpu(testhost, tmp_path, "rollback", "--yes")
        testhost.reboot()
    assert back.returncode == 0, back.stdout + back.stderr
    assert_original(testhost)


def test_a_host_with_nvidia_in_the_initramfs_and_the_iommu_off_is_refused_with_the_way_out(
    testhost_without_iommu: QemuTestHost, tmp_path: Path
) -> None:
    """VT-d present but intel_iommu=off on the command line: the kernel makes no IOMMU groups,
    and vfio-pci cannot take a GPU without one. With nvidia loading from the
    initramfs, only a rebuilt initramfs could carry a binding in time; the plan refuses and says
    how out: turn the IOMMU on and reboot, or keep the GPUs. The way out it names is then taken:
    applied with --enable-iommu, GRUB's next boot has the IOMMU on and the split in place."""
    host = testhost_without_iommu
    # A host that boots with GRUB (the test host then boots what update-grub's grub.cfg says),
    # with Debian grub2's defaults file (debian/default/grub: GRUB_CMDLINE_LINUX_DEFAULT="quiet")
    # and the rest of the image's kernel command line (guest/overlay/etc/kernel/cmdline), with the
    # IOMMU turned off (Debian 12's kernel turns it on by itself where VT-d is there).
    grub_defaults = 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
    grub_defaults += 'GRUB_CMDLINE_LINUX="console=ttyS0 panic=-1 mitigations=off intel_iommu=off"\n'
    early = (
        f"printf '{grub_defaults}' > /etc/default/grub && mkdir -p /boot/grub && "
        "echo nvidia >> /etc/initramfs-tools/modules && update-initramfs -u -k all && update-grub"
    )
    with phase("initramfs"):
        run_ok(host, early, timeout=600)
    host.reboot()
    assert loaded_before_root(host), "nvidia loads from the initramfs"
    assert "intel_iommu=off" in run_ok(host, "cat /proc/cmdline").split()
    inventory = json_of(proxgpu(host, tmp_path, "inspect", "--json"))
    assert not inventory["iommu_enabled"] and inventory["boot_loader"] == "grub"
    assert all(gpu["iommu_group"] is None for gpu in inventory["gpus"])
    assert all(gpu["driver"] == "nvidia" for gpu in inventory["gpus"])

    for command in (["plan"], ["apply", "--yes"]):
        refused = proxgpu(host, tmp_path, *command)
        assert refused.returncode == PlanRefusedError.exit_code, refused.stdout + refused.stderr
        assert "the IOMMU is off, but 4 GPUs would go to vfio-pci" in refused.stderr
        assert "--enable-iommu" in refused.stderr and "reboot" in refused.stderr
    rc, _, _ = host.ssh(["test", "-e", MODPROBE_CONF])
    assert rc != 0 and journal_entries(host) == [], "a refused apply writes nothing"
    bound = drivers(host)
    assert all(bound[a] == "nvidia" for a in NODE0 + NODE1), "refusing changed nothing"

    # The way out it names, taken: the kernel command line that turns Intel's IOMMU on, with
    # the split, for the next boot.
    way_out = proxgpu(host, tmp_path, "apply", "--yes", "--enable-iommu")
    assert way_out.returncode == 0, way_out.stdout + way_out.stderr
    grub = run_ok(host, "cat /etc/default/grub")
    line = next(ln for ln in grub.splitlines() if ln.startswith("GRUB_CMDLINE_LINUX_DEFAULT="))
    assert line.split("=", 1)[1].strip('"').split() == ["quiet", "intel_iommu=on", "iommu=pt"]
    host.reboot()
    # GRUB puts GRUB_CMDLINE_LINUX_DEFAULT after GRUB_CMDLINE_LINUX: the last intel_iommu= wins.
    words = run_ok(host, "cat /proc/cmdline").split()
    assert words.index("intel_iommu=on") > words.index("intel_iommu=off") and "iommu=pt" in words
    inventory = json_of(proxgpu(host, tmp_path, "inspect", "--json"))
    assert inventory["iommu_enabled"], "the IOMMU is on after the boot the way out asked for"
    assert all(gpu["iommu_group"] is not None for gpu in inventory["gpus"])
    assert loaded_before_root(host), "nvidia still loads from the initramfs"
    bound = drivers(host)
    assert {bound[a] for a in NODE1} == {"vfio-pci"} and {bound[a] for a in NODE0} == {"nvidia"}
    verified = proxgpu(host, tmp_path, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
