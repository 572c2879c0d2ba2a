"""Smoke tests of the e2e harness itself: topology, pinned SSH, cold reboot, fresh initramfs."""

from __future__ import annotations

import dataclasses
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import testhost as harness
from .image import GuestImage
from .phases import phase
from .testhost import BootStalledError, QemuTestHost

pytestmark = pytest.mark.e2e

DISPLAY_CLASS_PREFIX = "0x0380"

# One line per PCI function: address, class, NUMA node, IOMMU group, bound driver ("-": none).
LIST_PCI_FUNCTIONS = r"""
for dev in /sys/bus/pci/devices/*; do
    group=-; driver=-
    [ -e "$dev/iommu_group" ] && group=$(basename "$(readlink "$dev/iommu_group")")
    [ -e "$dev/driver" ] && driver=$(basename "$(readlink "$dev/driver")")
    echo "${dev##*/} $(cat "$dev/class") $(cat "$dev/numa_node") $group $driver"
done
"""

MARKER_SCRIPT = "/etc/initramfs-tools/scripts/init-top/proxgpu-e2e-marker"
MARKER_FILE = "/run/proxgpu-e2e-marker"


@dataclass(frozen=True)
class PciFunction:
    """What the harness checks about one PCI function in the guest."""

    address: str
    pci_class: str
    numa_node: str
    iommu_group: str
    driver: str


def run_ok(host: QemuTestHost, argv: list[str], timeout: float = 120, stdin: bytes = b"") -> str:
    """Run a guest command that must succeed; return its stdout."""
    rc, out, err = host.ssh(argv, timeout=timeout, stdin=stdin)
    assert rc == 0, f"{argv} exited {rc}: {err}"
    return out


def pci_functions(host: QemuTestHost) -> dict[str, PciFunction]:
    """All PCI functions of the guest, by address."""
    functions = {}
    for line in run_ok(host, ["sh", "-c", LIST_PCI_FUNCTIONS]).splitlines():
        function = PciFunction(*line.split())
        functions[function.address] = function
    return functions


def boot_id(host: QemuTestHost) -> str:
    """The kernel's random per-boot identifier."""
    return run_ok(host, ["cat", "/proc/sys/kernel/random/boot_id"]).strip()


def test_guest_presents_eight_gpus_split_across_two_numa_nodes(testhost: QemuTestHost) -> None:
    """4 display functions per node, each grouped with its audio function, on the stand-in
    nvidia driver and snd_hda_intel."""
    functions = pci_functions(testhost)
    gpus = [f for f in functions.values() if f.pci_class.startswith(DISPLAY_CLASS_PREFIX)]

    assert len(gpus) == 8, gpus
    assert sorted(g.numa_node for g in gpus) == ["0"] * 4 + ["1"] * 4
    for gpu in gpus:
        audio = functions.get(gpu.address.removesuffix(".0") + ".1")
        assert audio is not None, f"{gpu.address} has no audio function"
        assert gpu.iommu_group != "-", f"{gpu.address} is in no IOMMU group"
        assert audio.iommu_group == gpu.iommu_group, (gpu, audio)
        assert audio.numa_node == gpu.numa_node
        assert (gpu.driver, audio.driver) == ("nvidia", "snd_hda_intel")
    assert len({g.iommu_group for g in gpus}) == 8, "each GPU needs an IOMMU group of its own"


def test_ssh_quotes_arguments_and_reports_status(testhost: QemuTestHost) -> None:
    """argv reaches the guest verbatim; exit status and stderr come back."""
    script = 'printf "%s|" "$@"; echo oops >&2; exit 3'
    rc, out, err = testhost.ssh(["sh", "-c", script, "-", "a b", "$x;", "'"])
    assert (rc, out, err) == (3, "a b|$x;|'|", "oops\n")


def openssh_login(host: QemuTestHost, known_hosts: Path) -> subprocess.CompletedProcess[str]:
    """Log in with the OpenSSH client, trusting only the host keys in ``known_hosts``."""
    return subprocess.run(
        [
            "ssh", "-F", "none", "-p", str(host.port), "-i", str(host.identity_file),
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=30",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            f"{host.user}@127.0.0.1", "true",
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_known_hosts_pins_the_guest_host_key(testhost: QemuTestHost, tmp_path: Path) -> None:
    """The harness's known_hosts works for OpenSSH too, and a different key is refused."""
    assert openssh_login(testhost, testhost.known_hosts).returncode == 0

    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    key_type, key_b64 = wrong.with_suffix(".pub").read_text().split()[:2]
    impostor = tmp_path / "known_hosts"
    impostor.write_text(f"[127.0.0.1]:{testhost.port} {key_type} {key_b64}\n")
    refused = openssh_login(testhost, impostor)
    assert refused.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in refused.stderr


def test_reboot_boots_the_initramfs_regenerated_in_the_guest(testhost: QemuTestHost) -> None:
    """reboot() comes back with a new boot and runs the initramfs the guest just rebuilt."""
    token = uuid.uuid4().hex
    # An init-top script runs inside the initramfs, where /run is already the tmpfs that is
    # later moved onto the real root; so the token in /run proves which initramfs booted.
    init_script = f"""#!/bin/sh
case "$1" in prereqs) exit 0;; esac
echo {token} > {MARKER_FILE}
"""
    before = boot_id(testhost)
    write_executable = 'cat > "$1" && chmod 755 "$1"'
    run_ok(testhost, ["sh", "-c", write_executable, "-", MARKER_SCRIPT], stdin=init_script.encode())
    with phase("initramfs"):
        run_ok(testhost, ["update-initramfs", "-u", "-k", "all"], timeout=300)
    # The marker stays in this initramfs only until the next regeneration; the script goes now.
    run_ok(testhost, ["rm", "-f", MARKER_SCRIPT])

    testhost.reboot()

    assert boot_id(testhost) != before
    assert run_ok(testhost, ["cat", MARKER_FILE]).strip() == token


def test_a_boot_that_stalls_is_power_cycled_once_and_then_fails(
    testhost_image: GuestImage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest whose console falls silent with no SSH is power-cycled once; a stall that the
    booted state causes comes back on the second boot, which then fails naming the stall,
    and no QEMU is left running."""
    # init=/bin/cat: the kernel boots as ever, then cat waits on the console in silence.
    monkeypatch.setattr(harness, "CONSOLE_STALL_S", 10.0)
    host = QemuTestHost(testhost_image, tmp_path / "stalling")
    host._boot = dataclasses.replace(host._boot, cmdline=f"{host._boot.cmdline} init=/bin/cat")
    with pytest.raises(BootStalledError, match=r"the boot stalled: no console output for 10 s"):
        host.start()
    assert host.boot_count == 2, "one power cycle, then the failure"
    assert host.pid is None
    assert host.console_log.read_text().count("Linux version") == 2, "two kernels booted"
