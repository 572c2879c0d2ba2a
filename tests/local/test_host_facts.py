"""What inspection reads for passthrough advice, from a copy of the ct200 example with the files a
real host has added: the first CPU's flags and address bits, /proc/fb, the Secure Boot variable,
reset_method, a processing accelerator. Each fact survives a snapshot and reaches the plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.capture import gather, write_tree
from proxgpu.inspection.hostfacts import SECURE_BOOT
from proxgpu.inspection.inventory import Inventory
from proxgpu.planning import SplitPolicy, plan_split
from tests.support.trees import copy_example, inspect_example

GPU = "0000:81:00.0"


def devices(root: Path) -> Path:
    return root / "sys/bus/pci/devices"


def real_host(tmp_path: Path) -> Path:
    """ct200 with what a booted host shows: efifb on the node-1 GPU it booted from, Secure Boot
    on, reset methods (the GPUs have FLR; their audio functions none, and no bus reset of their
    own, since they share their bus with the GPU), and a Gaudi accelerator."""
    root = copy_example(tmp_path)
    (root / "proc/fb").write_text("0 EFI VGA\n")
    variable = root / SECURE_BOOT.lstrip("/")
    variable.parent.mkdir()
    variable.write_bytes(bytes([6, 0, 0, 0, 1]))
    for link in devices(root).iterdir():
        function = link.name
        methods = "" if function.endswith(".1") else "flr\n"
        if methods:
            (link.resolve() / "reset_method").write_text(methods)
    (devices(root) / GPU).resolve().joinpath("boot_vga").write_text("1\n")
    below = "devices/pci0000:c0/0000:c0:01.1/0000:c2:00.0"  # below ct200's NIC root port
    gaudi = root / "sys" / below
    gaudi.mkdir(parents=True)
    for name, value in (("class", "0x120000"), ("vendor", "0x1da3"), ("device", "0x1020")):
        (gaudi / name).write_text(value + "\n")
    (devices(root) / "0000:c2:00.0").symlink_to(f"../../../{below}")
    return root


def test_the_example_hosts_show_their_cpu(tmp_path: Path) -> None:
    inventory = inspect_example("ct200")
    assert (inventory.cpu_vendor, inventory.cpu_phys_bits, inventory.cpu_pdpe1gb) == (
        "AuthenticAMD",
        52,
        True,
    )
    assert inspect_example("uneven-5-3").cpu_phys_bits == 46
    assert inventory.gpus[0].bar64_bytes == [128 << 30, 32 << 20]
    # Nothing of this was captured in the example: unknown, not "none".
    assert (inventory.secure_boot, inventory.framebuffers) == (None, None)
    assert inventory.gpus[0].function_info[0].reset_methods is None


def facts(inventory: Inventory) -> tuple[object, ...]:
    gpu = inventory.gpu(GPU)
    return (
        inventory.secure_boot,
        inventory.framebuffers,
        [f.reset_methods for f in gpu.function_info],
        gpu.boot_vga,
        [w for w in inventory.warnings if "accelerator" in w],
    )


def test_inspection_reads_what_a_booted_host_shows(tmp_path: Path) -> None:
    inventory = inspect(DirectoryHost(str(real_host(tmp_path))))
    secure, fbs, resets, boot, accelerators = facts(inventory)
    assert (secure, fbs, resets, boot) == (True, ["EFI VGA"], [["flr"], []], True)
    assert accelerators == [
        "0000:c2:00.0 (1da3:1020) is a processing accelerator (PCI class 0x12) but not a GPU "
        "(only AMD's, on amdgpu, are): left out of the split; add --gpu-vendor 10de "
        "--gpu-vendor 1da3 to split it too"
    ]
    assert not any(path.startswith("/sys/") for path in inventory.host_files)


def test_a_snapshot_keeps_every_fact(tmp_path: Path) -> None:
    host = DirectoryHost(str(real_host(tmp_path)))
    snapshot = tmp_path / "snapshot"
    write_tree(gather(host), str(snapshot))
    again = inspect(DirectoryHost(str(snapshot)))
    assert facts(again) == facts(inspect(host))
    assert again.cpu_phys_bits == 52 and again.cpu_pdpe1gb is True


def test_an_empty_proc_fb_reads_as_no_framebuffer_and_a_snapshot_keeps_it(
    tmp_path: Path,
) -> None:
    """/proc/fb of a host without a framebuffer is empty: read, it says "none", which a
    snapshot keeps (a missing file says "unknown"), and the plan then has nothing to warn."""
    root = real_host(tmp_path)
    (root / "proc/fb").write_text("")
    host = DirectoryHost(str(root))
    assert inspect(host).framebuffers == []
    snapshot = tmp_path / "snapshot"
    write_tree(gather(host), str(snapshot))
    again = inspect(DirectoryHost(str(snapshot)))
    assert again.framebuffers == [] and "fb" not in again.commands
    warnings = plan_split(again, SplitPolicy(lxc=200)).warnings
    assert not any("framebuffer" in w for w in warnings)
    (root / "proc/fb").unlink()
    warnings = plan_split(inspect(host), SplitPolicy(lxc=200)).warnings
    assert any("/proc/fb was not read" in w for w in warnings)


def _as_a_reader_bound_by_modes(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``proxgpu ARGV`` run by a user whom a file's mode binds: root without the capabilities
    that override it (as setpriv drops them), any other user as it is."""
    wrap = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    command = [*(wrap if os.geteuid() == 0 else []), sys.executable, "-m", "proxgpu", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_an_unreadable_proc_fb_is_not_read_not_no_framebuffer(tmp_path: Path) -> None:
    """/proc/fb that the user cannot read tells nothing: unknown, as a missing one, never the
    "no framebuffer" of an empty one read."""
    root = real_host(tmp_path)
    (root / "proc/fb").chmod(0)
    shown = _as_a_reader_bound_by_modes(["inspect", "--root", str(root), "--json"])
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["framebuffers"] is None
    planned = _as_a_reader_bound_by_modes(["plan", "--root", str(root), "--lxc", "200"])
    assert planned.returncode == 0, planned.stderr
    said = planned.stdout + planned.stderr
    assert (
        f"{GPU} is the host's boot GPU, and whether the kernel puts its boot framebuffer " in said
    )
    assert "(/proc/fb was not read" in said


def test_the_plan_of_a_booted_host_warns_about_each(tmp_path: Path) -> None:
    inventory = inspect(DirectoryHost(str(real_host(tmp_path))))
    # nvidia is not loaded on this copy: Secure Boot may be why.
    inventory = replace(inventory, nvidia_driver_version=None)
    warnings = plan_split(inventory, SplitPolicy(lxc=200)).warnings
    assert any(w.startswith(f"{GPU} holds the host's boot framebuffer (EFI VGA") for w in warnings)
    secure = "Secure Boot is on and the nvidia module is not loaded"
    assert any(w.startswith(secure) for w in warnings)
    # The audio function has no reset of its own, but it goes with its GPU: its bus reset works.
    assert not any("reset of its own" in w for w in warnings)
