"""proxgpu's own command line against the QEMU test host, over SSH, with host-key verification.

The guest is a real Linux kernel on a q35 machine with two NUMA nodes, an emulated IOMMU and
eight stand-in GPUs (bochs-display 1234:1111, class 0x0380, each with an HDA audio function on .1
in the same IOMMU group): 21-24:00 sit on NUMA node 0, 81-84:00 on node 1. They stay on whatever
driver holds them (bochs-drm, snd_hda_intel), which is exactly the non-NVIDIA case.

The tests in this module run in order and share the guest: inspect, plan, apply, reboot, verify,
rollback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from proxgpu.paths import MODPROBE_CONF

from .testhost import QemuTestHost

pytestmark = pytest.mark.e2e

NODE0 = [f"0000:{bus:02x}:00.0" for bus in (0x21, 0x22, 0x23, 0x24)]
NODE1 = [f"0000:{bus:02x}:00.0" for bus in (0x81, 0x82, 0x83, 0x84)]


def proxgpu(
    host: QemuTestHost, tmp_path: Path, *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the real ``proxgpu`` command line against the guest."""
    ssh_config = tmp_path / "empty_ssh_config"
    ssh_config.touch()
    argv = [
        sys.executable,
        "-m",
        "proxgpu",
        *args,
        "--host",
        f"{host.user}@127.0.0.1:{host.port}",
        "-i",
        str(host.identity_file),
        "--known-hosts",
        str(host.known_hosts),
        "--ssh-config",
        str(ssh_config),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def json_of(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


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
        assert gpu["driver"] == "bochs-drm"
        assert [f["driver"] for f in gpu["function_info"]] == ["bochs-drm", "snd_hda_intel"]
        assert [f["iommu_group"] for f in gpu["function_info"]] == [gpu["iommu_group"]] * 2
    groups = [g["iommu_group"] for g in gpus.values()]
    assert len(set(groups)) == 8, "each stand-in GPU has an IOMMU group of its own"
    assert inventory["driver_modules"]["bochs-drm"] == "bochs"


def test_inspect_reads_the_kernels_bars_and_drm_nodes(
    testhost: QemuTestHost, tmp_path: Path
) -> None:
    # bochs-display's BAR0 is its 16 MiB framebuffer; bochs-drm makes a card node, no render node.
    gpus = json_of(proxgpu(testhost, tmp_path, "inspect", "--json"))["gpus"]
    assert all(16 << 20 in gpu["bar_bytes"] for gpu in gpus), [g["bar_bytes"] for g in gpus]
    cards = [gpu["drm_nodes"] for gpu in gpus]
    assert all(len(nodes) == 1 and nodes[0].startswith("card") for nodes in cards), cards
    assert len({nodes[0] for nodes in cards}) == len(gpus), "each GPU has its own card"


def test_the_busy_check_finds_the_kernels_framebuffers(testhost: QemuTestHost) -> None:
    # bochs-drm's fbdev emulation gives each GPU a framebuffer whose device link names it: the
    # record the live rebind refuses an nvidia GPU on. Run as proxgpu runs it: prelude + script.
    scripts = Path(__file__).resolve().parents[2] / "proxgpu" / "scripts"
    script = (scripts / "prelude.sh").read_text() + (scripts / "busy.sh").read_text()
    rc, out, err = testhost.ssh(["sh", "-c", script, "busy", "/", *NODE0, *NODE1])
    assert rc == 0, err
    framebuffers = [line.split("\t")[1] for line in out.splitlines() if line.startswith("#fb\t")]
    assert sorted(framebuffers) == NODE0 + NODE1, out


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
    for module in ("bochs", "snd_hda_intel"):
        assert f"softdep {module} pre: vfio-pci" in modprobe["after"]
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
        assert (bound[address], bound[address[:-1] + "1"]) == ("bochs-drm", "snd_hda_intel")
    for address in NODE1:
        assert (bound[address], bound[address[:-1] + "1"]) == ("vfio-pci", "vfio-pci")


def assert_original(host: QemuTestHost) -> None:
    bound = drivers(host)
    for address in NODE0 + NODE1:
        assert (bound[address], bound[address[:-1] + "1"]) == ("bochs-drm", "snd_hda_intel")


def test_apply_refuses_a_busy_device_instead_of_hanging(
    testhost: QemuTestHost, tmp_path: Path
) -> None:
    holder = "exec 3</dev/dri/by-path/pci-0000:82:00.0-card; setsid sleep 300 <&3 >/dev/null 2>&1 &"
    rc, _, err = testhost.ssh(["sh", "-c", holder])
    assert rc == 0, err
    try:
        result = proxgpu(testhost, tmp_path, "apply", "--yes", "--live", timeout=300)
        assert result.returncode == 10, result.stdout + result.stderr
        assert "0000:82:00.0" in result.stderr and "sleep" in result.stderr
    finally:
        testhost.ssh(["pkill", "-f", "sleep 300"])
    assert_original(testhost)
    rc, out, _ = testhost.ssh(["ls", "/var/lib/proxgpu/journal"])
    assert rc != 0 or out.strip() == "", "a refused apply leaves no journal entry"


@pytest.mark.parametrize("method", ["modprobe", "driverctl"])
def test_apply_live_reboot_verify_rollback(
    testhost: QemuTestHost, tmp_path: Path, method: str
) -> None:
    applied = proxgpu(
        testhost, tmp_path, "apply", "--yes", "--live", "--bind-method", method, "--json"
    )
    result = json_of(applied)["result"]
    assert result["changed"] and result["reboot_required"]
    assert_split(testhost)
    groups = {
        json_of(proxgpu(testhost, tmp_path, "inspect", "--json"))["gpus"][i]["iommu_group"]
        for i in range(4, 8)
    }
    rc, out, _ = testhost.ssh(["ls", "/dev/vfio"])
    assert rc == 0 and {str(g) for g in groups} <= set(out.split())
    assert proxgpu(testhost, tmp_path, "verify").returncode == 0
    if method == "modprobe":
        # Where vfio-pci loads from the initramfs, the hook must have put the binding there too.
        rc, listing, err = testhost.ssh(["sh", "-c", "lsinitramfs /boot/initrd.img-$(uname -r)"])
        assert rc == 0, err
        assert "usr/local/sbin/proxgpu-vfio-bind" in listing
        assert MODPROBE_CONF.lstrip("/") in listing

    testhost.reboot()
    assert_split(testhost)
    verified = proxgpu(testhost, tmp_path, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    again = proxgpu(testhost, tmp_path, "apply", "--yes", "--bind-method", method)
    assert again.returncode == 0 and "No changes" in again.stdout
    settled = proxgpu(testhost, tmp_path, "plan", "--bind-method", method, "--detailed-exitcode")
    assert settled.returncode == 0, "after the reboot the host is exactly what the plan wants"

    back = proxgpu(testhost, tmp_path, "rollback", "--yes")
    assert back.returncode == 0, back.stderr
    testhost.reboot()
    assert_original(testhost)
    history = json_of(proxgpu(testhost, tmp_path, "history", "--json"))
    assert history[-1]["status"] == "rolled-back"
