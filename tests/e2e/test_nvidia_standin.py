"""The e2e test host's stand-in NVIDIA driver behaves as NVIDIA's open module does where proxgpu
depends on it, checked on the running kernel (the points and their sources are in
``guest/nvidia-standin/nvidia.c``)."""

from __future__ import annotations

import time

import pytest

from .testhost import QemuTestHost

pytestmark = pytest.mark.e2e

GPU = "0000:82:00.0"  # node 1's second GPU


def run_ok(host: QemuTestHost, script: str, timeout: float = 120) -> str:
    rc, out, err = host.ssh(["sh", "-c", script], timeout=timeout)
    assert rc == 0, f"{script} exited {rc}: {err}"
    return out


def test_depmod_writes_nvidias_own_softdep(testhost: QemuTestHost) -> None:
    softdeps = run_ok(testhost, "cat /lib/modules/$(uname -r)/modules.softdep")
    assert "softdep nvidia pre: ecdh_generic,ecdsa_generic" in softdeps.splitlines()


def minor(host: QemuTestHost) -> int:
    info = run_ok(host, f"cat /proc/driver/nvidia/gpus/{GPU}/information")
    return int(next(ln for ln in info.splitlines() if ln.startswith("Device Minor")).split()[-1])


def test_char_devices_and_proc_files_are_nvidias(testhost: QemuTestHost) -> None:
    devices = run_ok(testhost, "cat /proc/devices").splitlines()
    assert "195 nvidia" in [d.strip() for d in devices]
    assert "195 nvidiactl" in [d.strip() for d in devices]
    assert any(d.strip().endswith(" nvidia-uvm") for d in devices), devices
    info = run_ok(testhost, f"cat /proc/driver/nvidia/gpus/{GPU}/information")
    assert f"Bus Location: \t {GPU}" in info
    assert "Open Kernel Module" in run_ok(testhost, "cat /proc/driver/nvidia/version")
    # The driver makes no device node itself; nvidia-modprobe does, with params' mode 438.
    n = minor(testhost)
    made = run_ok(testhost, f"rm -f /dev/nvidia{n} && nvidia-modprobe -c {n} && "
                  f"stat -c '%t %T %a' /dev/nvidia{n}")  # fmt: skip
    assert made.split() == ["c3", f"{n:x}", "666"]


def test_unbinding_a_gpu_whose_node_is_open_waits_until_it_is_closed(
    testhost: QemuTestHost,
) -> None:
    """As NVIDIA's nv_pci_remove does: the unbind blocks in the kernel (the writer sleeps
    uninterruptibly; the driver link is already gone, as the driver core removes it first) while
    a process holds the GPU's node, and finishes once it lets go; the GPU then takes its minor
    again."""
    n = minor(testhost)
    run_ok(testhost, f"nvidia-modprobe -c {n}")
    run_ok(testhost, f"exec 3</dev/nvidia{n}; setsid sleep 300 <&3 >/dev/null 2>&1 &")
    unbind = (
        f"rm -f /run/unbound; setsid sh -c 'echo {GPU} > /sys/bus/pci/drivers/nvidia/unbind; "
        "touch /run/unbound' >/dev/null 2>&1 &"
    )
    try:
        run_ok(testhost, unbind)
        time.sleep(3)
        assert run_ok(testhost, "[ -e /run/unbound ] || echo waiting").strip() == "waiting"
        states = run_ok(testhost, "ps -eo stat=,args= | grep '[d]rivers/nvidia/unbind' || true")
        assert states.startswith("D"), states
        assert "Attempting to remove device" in run_ok(testhost, "dmesg | tail -n 20")
    finally:
        run_ok(testhost, "pkill -f 'sleep [3]00' || true")
    deadline = time.monotonic() + 30
    while run_ok(testhost, "[ -e /run/unbound ] || echo waiting").strip():
        assert time.monotonic() < deadline, "the unbind never finished"
        time.sleep(1)
    assert run_ok(testhost, f"[ -e /proc/driver/nvidia/gpus/{GPU} ] || echo gone").strip()
    run_ok(testhost, f"echo {GPU} > /sys/bus/pci/drivers/nvidia/bind")
    assert minor(testhost) == n, "the lowest free minor is its own again"
