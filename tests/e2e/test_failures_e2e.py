"""What proxgpu refuses on the real kernel of the QEMU test host, and what it finds: a GPU held
open, an ``options vfio-pci ids=`` left by hand, a host whose IOMMU is off while nvidia loads
from the initramfs.

The tests share the session's ``testhost`` with ``test_cli_e2e.py`` and leave it as they found
it (every GPU on nvidia, no journal entry applied: a test that applies boots the image as built
afterwards); the IOMMU-off host is a second machine of its own (``testhost_without_iommu``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from proxgpu.errors import DeviceBusyError, DriftError, PlanRefusedError, RenderError
from proxgpu.paths import MODPROBE_CONF

from .test_cli_e2e import (
    NODE0,
    NODE1,
    assert_original,
    drivers,
    json_of,
    loaded_before_root,
    minor_of,
    proxgpu,
)
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
        # Rollback and its reboots are tested in test_cli_e2e; the image as built is quicker.
        testhost.reset()


def test_a_host_with_nvidia_in_the_initramfs_and_the_iommu_off_is_refused_with_the_way_out(
    testhost_without_iommu: QemuTestHost, tmp_path: Path
) -> None:
    """No VT-d and no intel_iommu=on: the kernel makes no IOMMU groups
    (drivers/iommu/intel/iommu.c finds no DMAR unit), and vfio-pci cannot take a GPU without
    one. With nvidia loading from the initramfs, only a rebuilt initramfs could carry a binding
    in time; the plan refuses and says how out: turn the IOMMU on and reboot, or keep the GPUs."""
    host = testhost_without_iommu
    # QEMU boots the kernel directly (no ESP), so inspection knows no boot loader: the host gets
    # GRUB's defaults file as on a host booting with GRUB (Debian grub2's debian/default/grub
    # sets GRUB_CMDLINE_LINUX_DEFAULT="quiet"), without any IOMMU parameter.
    early = (
        "sed -i 's/ *intel_iommu=on//' /etc/kernel/cmdline && "
        "echo 'GRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"' > /etc/default/grub && "
        "echo nvidia >> /etc/initramfs-tools/modules && update-initramfs -u -k all"
    )
    run_ok(host, early, timeout=600)
    host.reboot()
    assert loaded_before_root(host), "nvidia loads from the initramfs"
    assert "intel_iommu" not in run_ok(host, "cat /proc/cmdline")
    inventory = json_of(proxgpu(host, tmp_path, "inspect", "--json"))
    assert not inventory["iommu_enabled"]
    assert all(gpu["iommu_group"] is None for gpu in inventory["gpus"])
    assert all(gpu["driver"] == "nvidia" for gpu in inventory["gpus"])

    for command in (["plan"], ["apply", "--yes"]):
        refused = proxgpu(host, tmp_path, *command)
        assert refused.returncode == PlanRefusedError.exit_code, refused.stdout + refused.stderr
        assert "the IOMMU is off, but 4 GPUs would go to vfio-pci" in refused.stderr
        assert "--enable-iommu" in refused.stderr and "reboot" in refused.stderr
    rc, _, _ = host.ssh(["test", "-e", MODPROBE_CONF])
    assert rc != 0 and journal_entries(host) == [], "a refused apply writes nothing"

    # The way out it names: the kernel command line that turns the IOMMU on, for the next boot.
    way_out = json_of(proxgpu(host, tmp_path, "plan", "--enable-iommu", "--json"))
    grub = next(f for f in way_out["changes"]["files"] if f["path"] == "/etc/default/grub")
    line = next(ln for ln in grub["after"].splitlines() if ln.startswith("GRUB_CMDLINE_LINUX_DEF"))
    assert {"quiet", "iommu=pt"} <= set(line.split("=", 1)[1].strip('"').split()), line
    assert way_out["changes"]["reboot_required"]
    bound = drivers(host)
    assert all(bound[a] == "nvidia" for a in NODE0 + NODE1), "planning changed nothing"
