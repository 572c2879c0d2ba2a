"""proxgpu's own command line against the QEMU test host, over SSH, with host-key verification.

The guest is a real Linux kernel on a q35 machine with two NUMA nodes, an emulated IOMMU and
eight stand-in GPUs (bochs-display 1234:1111, class 0x0380, each with an HDA audio function on .1
in the same IOMMU group): 21-24:00 sit on NUMA node 0, 81-84:00 on node 1. The image's stand-in
NVIDIA driver (module ``nvidia``, with NVIDIA's own softdep, minors and /proc files) drives them,
and snd_hda_intel their audio functions, as on the seed host.

The tests in this module run in order and share the guest: inspect, plan, then, for each way
nvidia loads (udev, initramfs) and each binding (modprobe, driverctl), apply, two cold reboots
(the second without nvidia-modprobe, so that the nodes unit makes the nodes with mknod),
rollback and one more. The refusals on the real kernel are in ``test_failures_e2e.py``.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxgpu.paths import MODPROBE_CONF

from .cli import json_of, proxgpu
from .phases import phase
from .testhost import QemuTestHost

pytestmark = pytest.mark.e2e

NODE0 = [f"0000:{bus:02x}:00.0" for bus in (0x21, 0x22, 0x23, 0x24)]
NODE1 = [f"0000:{bus:02x}:00.0" for bus in (0x81, 0x82, 0x83, 0x84)]


def test_inspect_sees_eight_gpus_four_per_node(testhost: QemuTestHost, tmp_path: Path) -> None:
    inventory = json_of(proxgpu(testhost, tmp_path, "inspect", "--json"))
    gpus = {g["address"]: g for g in inventory["gpus"]}
    assert sorted(gpus) == NODE0 + NODE1
    assert [gpus[a]["numa_node"] for a in NODE0 + NODE1] == [0] * 4 + [1] * 4
    assert [n["id"] for n in inventory["numa_nodes"]] == [0, 1]
    assert inventory["iommu_enabled"]
    for address, gpu in gpus.items():
        audio = address[:-1] + "1"
        assert gpu["functions"] == [address, audio]
        assert gpu["class_code"] == "0x038000" and gpu["vendor_id"] == "1234"
        assert gpu["driver"] == "nvidia"
        assert [f["driver"] for f in gpu["function_info"]] == ["nvidia", "snd_hda_intel"]
        assert [f["iommu_group"] for f in gpu["function_info"]] == [gpu["iommu_group"]] * 2
    groups = [g["iommu_group"] for g in gpus.values()]
    assert len(set(groups)) == 8, "each stand-in GPU has an IOMMU group of its own"
    assert inventory["driver_modules"]["nvidia"] == "nvidia"
    # The driver hands out the lowest free minor in probe order, which follows the kernel's PCI
    # enumeration (here node 1's expander bridge comes first), not the addresses' order.
    assert sorted(gpus[a]["nvidia_minor"] for a in NODE0 + NODE1) == list(range(8))
    for node in (NODE0, NODE1):
        assert [gpus[a]["nvidia_minor"] for a in node] == sorted(
            gpus[a]["nvidia_minor"] for a in node
        )


def test_inspect_reads_the_kernels_bars_and_drm_nodes(
    testhost: QemuTestHost, tmp_path: Path
) -> None:
    # bochs-display's BAR0 is its 16 MiB framebuffer; nvidia without nvidia_drm makes no DRM node.
    gpus = json_of(proxgpu(testhost, tmp_path, "inspect", "--json"))["gpus"]
    assert all(16 << 20 in gpu["bar_bytes"] for gpu in gpus), [g["bar_bytes"] for g in gpus]
    assert all(gpu["drm_nodes"] == [] for gpu in gpus), [g["drm_nodes"] for g in gpus]


def test_the_busy_check_finds_the_kernels_framebuffers(testhost: QemuTestHost) -> None:
    # bochs-drm's fbdev emulation gives a GPU a framebuffer whose device link names it: the
    # record the live rebind refuses an nvidia GPU on. One GPU goes to bochs-drm for this and
    # back to nvidia, where it takes its old minor again (the lowest free one).
    gpu = NODE0[-1]
    to_bochs = (
        f"echo {gpu} > /sys/bus/pci/drivers/nvidia/unbind && modprobe bochs && "
        f"echo bochs-drm > /sys/bus/pci/devices/{gpu}/driver_override && "
        f"echo {gpu} > /sys/bus/pci/drivers_probe"
    )
    back = (
        f"echo {gpu} > /sys/bus/pci/drivers/bochs-drm/unbind; "
        f"echo > /sys/bus/pci/devices/{gpu}/driver_override; "
        f"echo {gpu} > /sys/bus/pci/drivers/nvidia/bind; rmmod bochs"
    )
    before = minor_of(testhost, gpu)
    rc, _, err = testhost.ssh(["sh", "-c", to_bochs])
    try:
        assert rc == 0, err
        scripts = Path(__file__).resolve().parents[2] / "proxgpu" / "scripts"
        script = (scripts / "prelude.sh").read_text() + (scripts / "busy.sh").read_text()
        rc, out, err = testhost.ssh(["sh", "-c", script, "busy", "/", *NODE0, *NODE1])
        assert rc == 0, err
        records = [line.split("\t")[1] for line in out.splitlines() if line.startswith("#fb\t")]
        assert records == [gpu], out
    finally:
        testhost.ssh(["sh", "-c", back])
    assert minor_of(testhost, gpu) == before, "back on nvidia with the lowest free minor"


def minor_of(host: QemuTestHost, gpu: str) -> int:
    """The GPU's Device Minor, from the stand-in driver's /proc file."""
    rc, out, err = host.ssh(["cat", f"/proc/driver/nvidia/gpus/{gpu}/information"])
    assert rc == 0, err
    return int(next(ln for ln in out.splitlines() if ln.startswith("Device Minor")).split()[-1])


def test_inspect_table_groups_by_node(testhost: QemuTestHost, tmp_path: Path) -> None:
    result = proxgpu(testhost, tmp_path, "inspect")
    assert result.returncode == 0, result.stderr
    node0, node1 = result.stdout.index("NUMA node 0"), result.stdout.index("NUMA node 1")
    assert all(node0 < result.stdout.index(a) < node1 for a in NODE0)
    assert all(result.stdout.index(a) > node1 for a in NODE1)


def test_unknown_host_key_is_refused(testhost: QemuTestHost, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.touch()
    ssh_config = tmp_path / "cfg"
    ssh_config.touch()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxgpu",
            "inspect",
            "--host",
            f"root@127.0.0.1:{testhost.port}",
            "-i",
            str(testhost.identity_file),
            "--known-hosts",
            str(empty),
            "--ssh-config",
            str(ssh_config),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 5
    assert "SHA256:" in result.stderr and "--accept-new-host-key" in result.stderr


def test_plan_moves_node1_devices_and_their_audio_functions(
    testhost: QemuTestHost, tmp_path: Path
) -> None:
    document = json_of(proxgpu(testhost, tmp_path, "plan", "--split", "numa", "--json"))
    host, vfio = document["groups"]
    assert (host["role"], host["numa_node"], host["gpus"]) == ("host", 0, NODE0)
    assert (vfio["role"], vfio["numa_node"], vfio["gpus"]) == ("vfio", 1, NODE1)
    assert vfio["functions"] == sorted(NODE1 + [a[:-1] + "1" for a in NODE1])
    changes = document["changes"]
    modprobe = next(f for f in changes["files"] if f["path"] == MODPROBE_CONF)
    # nvidia keeps its own softdep (modules.softdep), which kmod would otherwise use instead.
    assert "softdep nvidia pre: vfio-pci ecdh_generic,ecdsa_generic" in modprobe["after"]
    assert "softdep snd_hda_intel pre: vfio-pci" in modprobe["after"]
    assert changes["reboot_required"]


def drivers(host: QemuTestHost) -> dict[str, str]:
    """Each stand-in GPU function's driver in the guest, "-" when unbound."""
    script = (
        "for d in /sys/bus/pci/devices/0000:[28]?:00.[01]; do "
        'if [ -e "$d/driver" ]; then echo "${d##*/} $(basename "$(readlink "$d/driver")")"; '
        'else echo "${d##*/} -"; fi; done'
    )
    rc, out, err = host.ssh(["sh", "-c", script])
    assert rc == 0, err
    return dict(line.split() for line in out.splitlines())


def assert_split(host: QemuTestHost) -> None:
    bound = drivers(host)
    for address in NODE0:
        assert (bound[address], bound[address[:-1] + "1"]) == ("nvidia", "snd_hda_intel")
    for address in NODE1:
        assert (bound[address], bound[address[:-1] + "1"]) == ("vfio-pci", "vfio-pci")


def assert_original(host: QemuTestHost) -> None:
    bound = drivers(host)
    for address in NODE0 + NODE1:
        assert (bound[address], bound[address[:-1] + "1"]) == ("nvidia", "snd_hda_intel")


CT = "/etc/pve/lxc/200.conf"
CT_CONFIG = (
    "arch: amd64\nhostname: inference\nmemory: 256\nostype: debian\n"
    "rootfs: local:200/vm-200-disk-0.raw,size=1G\n"
)
# Where the stand-in driver's probe writes its line and where the root file system is mounted,
# in the kernel's log: which came first tells whether nvidia loaded from the initramfs.
PROBED = "NVRM: stand-in GPU"
ROOT_MOUNTED = "EXT4-fs (vda): mounted filesystem"
BIND_METHODS = ("modprobe", "driverctl")
# The plan's warning for each GPU the nvidia driver numbers anew at the next boot
# (proxgpu/rendering/lxc.py, _nvidia_minors).
RENUMBERED = re.compile(r"(0000:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) becomes /dev/nvidia(\d+)")


def minors(host: QemuTestHost) -> dict[str, int]:
    """Each GPU on the stand-in nvidia driver and its Device Minor, from the driver's /proc."""
    script = 'grep -H "Device Minor" /proc/driver/nvidia/gpus/*/information'
    rc, out, err = host.ssh(["sh", "-c", script])
    assert rc == 0, err
    return {line.split("/")[5]: int(line.rsplit(None, 1)[1]) for line in out.splitlines()}


def loaded_before_root(host: QemuTestHost) -> bool:
    rc, log, err = host.ssh(["dmesg"])
    assert rc == 0, err
    return log.index(PROBED) < log.index(ROOT_MOUNTED)


def nodes(host: QemuTestHost) -> dict[str, tuple[int, int, str]]:
    """Each /dev/nvidia* char node: its major, minor and mode."""
    script = "stat -c '%n %t %T %a' /dev/nvidia*"
    rc, out, err = host.ssh(["sh", "-c", script])
    assert rc == 0, err
    found = {}
    for line in out.splitlines():
        name, major, minor, mode = line.split()
        found[name] = (int(major, 16), int(minor, 16), mode)
    return found


def predicted_minors(before: dict[str, int], plan: Any) -> dict[str, int]:
    """The minors the plan says node 0's GPUs have after the next boot: the ones it warns will
    be numbered anew, the others keep theirs."""
    renumbered = {
        address: int(minor)
        for warning in plan["changes"]["warnings"]
        for address, minor in RENUMBERED.findall(warning)
    }
    return {address: renumbered.get(address, before[address]) for address in NODE0}


# Where the initramfs scenarios keep the guest's initramfs as it was before nvidia joined it,
# and the one built with nvidia (with what it was built from), so that only the first scenario
# runs update-initramfs for them (each run takes minutes under TCG).
SAVED = "/var/tmp/proxgpu-e2e-initramfs"
INITRDS = "boot/initrd.img-*"


def start_loading_nvidia_from_the_initramfs(host: QemuTestHost) -> None:
    """Early KMS: nvidia in initramfs-tools' modules list loads before the root file system
    (initramfs-tools' mkinitramfs runs add_modules_from_file on ${CONFDIR}/modules, that is
    /etc/initramfs-tools/modules, and its init loads them before it mounts the root)."""
    early = f"""set -e
        mkdir -p {SAVED} && cd /
        tar -cf {SAVED}/late.tar {INITRDS}
        echo nvidia >> /etc/initramfs-tools/modules
        inputs=$(cat {INITRDS} etc/initramfs-tools/modules | sha256sum)
        if [ "$(cat {SAVED}/early.inputs 2>/dev/null)" = "$inputs" ]; then
            tar -xf {SAVED}/early.tar
        else
            update-initramfs -u -k all
            tar -cf {SAVED}/early.tar {INITRDS}
            echo "$inputs" > {SAVED}/early.inputs
        fi"""
    with phase("initramfs"):
        rc, _, err = host.ssh(["sh", "-c", early], timeout=600)
    assert rc == 0, err
    host.reboot()
    assert loaded_before_root(host), "nvidia loads from the initramfs now"
    assert_original(host)


def stop_loading_nvidia_from_the_initramfs(host: QemuTestHost) -> None:
    """The initramfs as it was before the start comes back: it takes effect at the next boot of
    whichever test reboots next."""
    late = f"sed -i '/^nvidia$/d' /etc/initramfs-tools/modules && tar -C / -xf {SAVED}/late.tar"
    rc, _, err = host.ssh(["sh", "-c", late])
    assert rc == 0, err


def assert_split_as_planned(host: QemuTestHost, tmp_path: Path, predicted: dict[str, int],
                            loader: str) -> None:  # fmt: skip
    """After a cold boot: vfio-pci holds node 1's functions, nvidia node 0's GPUs with the
    minors the plan predicted, the unit proxgpu wrote made the container's nodes with NVIDIA's
    nvidia-modprobe before the guests start, and verify finds nothing."""
    assert_split(host)
    if loader == "initramfs":
        assert loaded_before_root(host), "nvidia still loads from the initramfs"
    assert minors(host) == predicted
    made = nodes(host)
    uvm = next(int(ln.split()[0]) for ln in devices(host) if ln.endswith(" nvidia-uvm"))
    for minor in predicted.values():
        assert made[f"/dev/nvidia{minor}"] == (195, minor, "666")
    assert made["/dev/nvidiactl"] == (195, 255, "666")
    assert made["/dev/nvidia-uvm"][:2] == (uvm, 0)
    rc, saw, _ = host.ssh(["cat", "/run/pve-guests-saw"])
    expected = {f"nvidia{m}" for m in predicted.values()} | {"nvidiactl", "nvidia-uvm"}
    assert rc == 0 and expected <= set(saw.split()), saw
    verified = proxgpu(host, tmp_path, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


NVIDIA_MODPROBE = "/usr/bin/nvidia-modprobe"


@contextlib.contextmanager
def without_nvidia_modprobe(host: QemuTestHost) -> Iterator[None]:
    """NVIDIA's nvidia-modprobe moved out of the way for the block, and back after it."""
    aside = f"{NVIDIA_MODPROBE}.proxgpu-e2e"
    rc, _, err = host.ssh(["mv", NVIDIA_MODPROBE, aside])
    assert rc == 0, err
    try:
        yield
    finally:
        rc, _, err = host.ssh(["mv", aside, NVIDIA_MODPROBE])
        assert rc == 0, err


@pytest.mark.parametrize("method", BIND_METHODS)
def test_the_split_survives_cold_reboots_and_rollback_gives_back_the_old_minors(
    testhost: QemuTestHost, tmp_path: Path, method: str
) -> None:
    """Where udev loads nvidia (coldplug and modules-load.d in the root file system); the
    initramfs loader's walks are in ``test_cli_initramfs_e2e.py``."""
    walk_the_split(testhost, tmp_path, "udev", method)


def walk_the_split(testhost: QemuTestHost, tmp_path: Path, loader: str, method: str) -> None:
    """apply, two cold reboots, rollback, one more: whatever loads nvidia (``loader``: udev, or
    the initramfs: early KMS) and whichever binding proxgpu writes (``method``). Where udev loads
    nvidia the apply is --live, so that the same boots also show the live rebind; the initramfs
    scenarios apply for the next boot only."""
    rc, _, err = testhost.ssh(["sh", "-c", f"mkdir -p /etc/pve/lxc && cat > {CT}"],
                              stdin=CT_CONFIG.encode())  # fmt: skip
    assert rc == 0, err
    if loader == "initramfs":
        start_loading_nvidia_from_the_initramfs(testhost)
    try:
        before = minors(testhost)
        assert sorted(before) == NODE0 + NODE1 and sorted(before.values()) == list(range(8))
        # The nodes a host whose driver has been used has (nvidia-modprobe made them, as
        # nvidia-smi would); the image has no nvidia-modeset, so its node is never there. With no
        # node at all, inspection offers the container every control node.
        made = [f"nvidia-modprobe -c {m}" for m in range(8)] + ["nvidia-modprobe -u -c 0"]
        make = " && ".join(made)
        rc, _, err = testhost.ssh(["sh", "-c", make])
        assert rc == 0, err
        args = ["--lxc", "200", "--bind-method", method]
        plan = json_of(proxgpu(testhost, tmp_path, "plan", *args, "--json"))
        predicted = predicted_minors(before, plan)
        container = next(f for f in plan["changes"]["files"] if f["path"] == CT)["after"]
        given = {int(n) for n in re.findall(r"/dev/nvidia(\d+)", container)}
        assert given == set(predicted.values()), container
        if method == "modprobe":
            # The modprobe binding holds node 1's GPUs off nvidia before it loads, so the next
            # boot numbers the kept ones anew from 0, in probe order.
            assert predicted == {a: n for n, a in enumerate(NODE0)}
        live = ["--live"] if loader == "udev" else []
        # The test host has no Proxmox API to ask whether the container runs.
        applied = proxgpu(testhost, tmp_path, "apply", "--yes", *args, *live, "--skip-guest-check")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        try:
            after_apply(testhost, tmp_path, method, live=bool(live))
            testhost.reboot()
            assert_split_as_planned(testhost, tmp_path, predicted, loader)
            # The second boot as on the seed host, which has no nvidia-modprobe: the nodes unit
            # makes each node with mknod, as nvidia-modprobe would have (nothing else makes them:
            # the nvidia module makes none).
            with without_nvidia_modprobe(testhost):
                testhost.reboot()
                assert_split_as_planned(testhost, tmp_path, predicted, loader)
            again = proxgpu(testhost, tmp_path, "apply", "--yes", *args, "--skip-guest-check")
            assert again.returncode == 0 and "Nothing to do" in again.stdout, again.stdout
            settled = proxgpu(testhost, tmp_path, "plan", *args, "--detailed-exitcode")
            assert settled.returncode == 0, "after the reboots the host is what the plan wants"
        finally:
            back = proxgpu(testhost, tmp_path, "rollback", "--yes")
            testhost.reboot()
        assert back.returncode == 0, back.stderr
        assert_original(testhost)
        if loader == "initramfs":
            assert loaded_before_root(testhost), "the rollback keeps the early load"
        assert minors(testhost) == before, "every GPU has its old minor again"
        history = json_of(proxgpu(testhost, tmp_path, "history", "--json"))
        assert history[-1]["status"] == "rolled-back"
    finally:
        testhost.ssh(["rm", "-f", CT])
        if loader == "initramfs":
            stop_loading_nvidia_from_the_initramfs(testhost)


def after_apply(host: QemuTestHost, tmp_path: Path, method: str, *, live: bool) -> None:
    """Before any reboot: the live rebind's drivers and /dev/vfio nodes, and, for the modprobe
    binding, the initramfs that carries it (where vfio-pci loads from the initramfs)."""
    if live:
        assert_split(host)
        groups = {
            gpu["iommu_group"]
            for gpu in json_of(proxgpu(host, tmp_path, "inspect", "--json"))["gpus"]
            if gpu["address"] in NODE1
        }
        rc, out, _ = host.ssh(["ls", "/dev/vfio"])
        assert rc == 0 and {str(g) for g in groups} <= set(out.split())
        assert proxgpu(host, tmp_path, "verify").returncode == 0
    if method == "modprobe":
        rc, listing, err = host.ssh(["sh", "-c", "lsinitramfs /boot/initrd.img-$(uname -r)"])
        assert rc == 0, err
        assert "usr/local/sbin/proxgpu-vfio-bind" in listing
        assert MODPROBE_CONF.lstrip("/") in listing


def devices(host: QemuTestHost) -> list[str]:
    rc, out, err = host.ssh(["cat", "/proc/devices"])
    assert rc == 0, err
    return [line.strip() for line in out.splitlines()]
