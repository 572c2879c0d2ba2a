"""The host's side of moving GPUs to vfio-pci (proxgpu.planning.vfiohost): the boot
framebuffer, legacy VGA, Secure Boot, resets and qemu-server's new_id."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from proxgpu.inspection.inventory import Gpu, Inventory, PciFunction
from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy
from tests.support.factories import ct200, make_fn

MOVED = "0000:81:00.0"
KEPT = "0000:01:00.0"


def changed(inventory: Inventory, address: str, **fields: Any) -> Inventory:
    gpus = [replace(g, **fields) if g.address == address else g for g in inventory.gpus]
    return replace(inventory, gpus=gpus)


def every(inventory: Inventory, **fields: Any) -> Inventory:
    return replace(inventory, gpus=[replace(g, **fields) for g in inventory.gpus])


def warnings(inventory: Inventory, word: str) -> list[str]:
    return [w for w in plan_split(inventory, SplitPolicy(lxc=200)).warnings if word in w]


# --- the boot framebuffer -------------------------------------------------------------------------


def booted(kernel: str, framebuffers: list[str] | None) -> Inventory:
    inventory = changed(ct200(), MOVED, boot_vga=True)
    return replace(inventory, kernel=kernel, framebuffers=framebuffers)


@pytest.mark.parametrize("name", ["EFI VGA", "simpledrmdrmfb", "VESA VGA"])
def test_since_linux_6_vfio_pci_takes_the_boot_framebuffer_away(name: str) -> None:
    (warning,) = warnings(booted("6.8.12-11-pve", [name]), "framebuffer")
    assert warning.startswith(f"{MOVED} holds the host's boot framebuffer ({name} in /proc/fb)")
    assert "removes that framebuffer" in warning and "serial console" in warning


def test_before_linux_6_the_framebuffer_keeps_the_bar_busy() -> None:
    (warning,) = warnings(booted("5.15.158-2-pve", ["EFI VGA"]), "framebuffer")
    assert "QEMU cannot map that BAR" in warning and "video=efifb:off" in warning


@pytest.mark.parametrize(
    ("name", "way_out"),
    [("EFI VGA", "video=efifb:off"), ("simple", "initcall_blacklist=sysfb_init")],
)
def test_before_linux_6_the_advice_turns_off_the_framebuffer_there_is(
    name: str, way_out: str
) -> None:
    """efifb has its own switch; simplefb is made only by sysfb_init, which efifb:off leaves."""
    (warning,) = warnings(booted("5.15.158-2-pve", [name]), "framebuffer")
    assert warning.endswith(f"boot the host with {way_out}"), warning


def test_a_host_without_any_framebuffer_gets_no_warning() -> None:
    assert warnings(booted("6.8.12-11-pve", []), "framebuffer") == []


def test_a_host_whose_proc_fb_was_not_read_gets_what_to_check() -> None:
    """A snapshot without /proc/fb says nothing of the framebuffer: not "none"."""
    (warning,) = warnings(booted("6.8.12-11-pve", None), "framebuffer")
    assert warning.startswith(
        f"{MOVED} is the host's boot GPU, and whether the kernel puts its boot framebuffer on it "
        "is unknown (/proc/fb was not read"
    ), warning
    assert "`cat /proc/fb`" in warning and "keep another way in (serial console" in warning
    (old,) = warnings(booted("5.15.158-2-pve", None), "framebuffer")
    assert "QEMU cannot map that BAR" in old
    assert old.endswith("boot the host with initcall_blacklist=sysfb_init"), old


def test_an_unread_proc_fb_does_not_matter_when_the_kernel_makes_no_framebuffer() -> None:
    inventory = booted("6.8.12-11-pve", None)
    quiet = replace(inventory, kernel_cmdline="quiet initcall_blacklist=sysfb_init")
    assert warnings(quiet, "framebuffer") == []
    assert warnings(changed(inventory, MOVED, boot_vga=False), "framebuffer") == []


@pytest.mark.parametrize("drm", ["nvidia-drmdrmfb", "amdgpudrmfb"])
def test_a_drm_driver_s_framebuffer_today_hides_the_firmware_s_of_the_next_boot(drm: str) -> None:
    """The GPU's DRM driver replaced the firmware's framebuffer on this boot; after the move no
    such driver binds the GPU, so the next boot's firmware framebuffer stays on it."""
    (warning,) = warnings(booted("6.8.12-11-pve", [drm]), "framebuffer")
    assert warning.startswith(f"{MOVED} is the host's boot GPU: /proc/fb lists no firmware"), (
        warning
    )
    assert f"(only {drm}: a DRM driver replaced it)" in warning and "serial console" in warning
    (old,) = warnings(booted("5.15.158-2-pve", [drm]), "framebuffer")
    assert old.endswith("boot the host with initcall_blacklist=sysfb_init"), old


def test_a_command_line_without_sysfb_makes_no_framebuffer_to_warn_about() -> None:
    inventory = booted("6.8.12-11-pve", ["nvidia-drmdrmfb"])
    quiet = replace(
        inventory, kernel_cmdline="quiet initcall_blacklist=acpi_cpufreq_init,sysfb_init"
    )
    assert warnings(quiet, "framebuffer") == []
    # efifb:off leaves simplefb and simpledrm, which sysfb_init makes: the warning stays.
    efifb_off = replace(inventory, kernel_cmdline="quiet video=efifb:off")
    assert len(warnings(efifb_off, "framebuffer")) == 1


def test_a_kept_boot_gpu_keeps_its_framebuffer() -> None:
    inventory = replace(changed(ct200(), KEPT, boot_vga=True), framebuffers=["EFI VGA"])
    assert warnings(inventory, "framebuffer") == []


# --- legacy VGA -----------------------------------------------------------------------------------


ASPEED = "0000:03:00.0"


def vga(inventory: Inventory, bmc: bool = True) -> Inventory:
    """Every GPU a VGA controller below its own root port, as the ct200 example's are, and a
    BMC's ASPEED display on the host's root bus."""
    gpus = [
        replace(g, class_code="0x030000", pci_path=[f"0000:{g.address[5:7]}:01.1"])
        for g in inventory.gpus
    ]
    function = make_fn(ASPEED, 7, class_code="0x030000", vendor_id="1a03", device_id="2000")
    aspeed = replace(
        gpus[0],
        address=ASPEED,
        vendor_id="1a03",
        device_id="2000",
        driver="ast",
        functions=[ASPEED],
        function_info=[replace(function, driver="ast")],
        iommu_group_peers=[],
        nvidia_minor=None,
        bmc_display=True,
        pci_path=[],
    )
    return replace(inventory, gpus=[aspeed, *gpus] if bmc else gpus)


def test_vga_gpus_moved_beside_a_legacy_vga_device_get_the_disable_vga_advice() -> None:
    (warning,) = warnings(vga(ct200()), "disable_vga")
    assert warning.startswith("0000:81:00.0, 0000:91:00.0, 0000:e1:00.0 and 0000:f1:00.0 go")
    assert f"the host keeps {ASPEED} for legacy VGA" in warning
    assert "x-vga=1 with SeaBIOS" in warning


def test_kept_nvidia_gpus_decode_no_legacy_vga_of_their_own() -> None:
    assert warnings(vga(ct200(), bmc=False), "disable_vga") == []


def test_disable_vga_already_set_is_not_advised_again() -> None:
    inventory = replace(
        vga(ct200()), host_files={"/etc/modprobe.d/vfio.conf": "options vfio-pci disable_vga=1\n"}
    )
    assert warnings(inventory, "disable_vga") == []


def test_3d_controllers_decode_no_vga_anyway() -> None:
    assert warnings(ct200(), "disable_vga") == []


# --- Secure Boot ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("secure_boot", "version", "warned"),
    [(True, None, True), (True, "575.57.08", False), (False, None, False), (None, None, False)],
)
def test_secure_boot_without_a_loaded_nvidia(
    secure_boot: bool | None, version: str | None, warned: bool
) -> None:
    inventory = replace(ct200(), secure_boot=secure_boot, nvidia_driver_version=version)
    found = warnings(inventory, "Secure Boot")
    assert bool(found) is warned
    if warned:
        assert "0000:01:00.0, 0000:11:00.0" in found[0] and "mokutil --import" in found[0]


# --- resets ---------------------------------------------------------------------------------------


def with_resets(gpu: Gpu, methods: list[str]) -> list[PciFunction]:
    return [replace(f, reset_methods=methods) for f in gpu.function_info]


def reset_case(methods: list[str], pci_path: list[str] | None, nic: bool = False) -> list[str]:
    inventory = ct200()
    gpu = inventory.gpu(MOVED)
    functions = [replace(f, pci_path=pci_path) for f in with_resets(gpu, methods)]
    inventory = changed(inventory, MOVED, function_info=functions)
    if nic:
        nic_fn = make_fn("0000:81:00.2", 300, class_code="0x020000", vendor_id="15b3")
        inventory = replace(inventory, nics=[nic_fn])
    return warnings(inventory, "reset of its own")


@pytest.mark.parametrize(
    ("methods", "pci_path"),
    [
        (["flr", "bus"], []),  # a reset of its own
        (["pm"], []),
        (["bus"], ["0000:80:01.1"]),  # alone on its bus: the bus reset is its reset
        ([], ["0000:80:01.1"]),  # the GPU and its audio function: reset together, same VM
        ([], None),  # where it sits is unknown
    ],
)
def test_resets_that_work(methods: list[str], pci_path: list[str] | None) -> None:
    assert reset_case(methods, pci_path) == []


def test_no_reset_on_a_root_bus() -> None:
    found = reset_case([], [])
    assert found[0].startswith(f"{MOVED} (for vfio-pci) has no reset of its own (no reset_method)")
    assert "no bus reset reaches it" in found[0]


def test_a_bus_reset_shared_with_a_device_the_vm_does_not_get() -> None:
    found = reset_case([], ["0000:80:01.1"], nic=True)
    assert found and "which also resets 0000:81:00.2" in found[0]


def test_unread_reset_methods_say_nothing() -> None:
    assert warnings(ct200(), "reset") == []


# --- qemu-server's new_id -------------------------------------------------------------------------


def test_driverless_kept_twins_are_what_new_id_would_take() -> None:
    inventory = replace(every(ct200(), driver=None), nvidia_driver_version=None)
    # The moved ones are on vfio-pci already; the kept ones lost nvidia.
    for address in ("0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"):
        inventory = changed(inventory, address, driver="vfio-pci")
    (warning,) = warnings(inventory, "new_id")
    assert warning.startswith("0000:01:00.0, 0000:11:00.0, 0000:61:00.0 and 0000:71:00.0 stay")
    assert "10de:2330" in warning and "modprobe nvidia" in warning


def test_driverless_kept_twins_marked_for_their_driver_are_not_at_risk() -> None:
    # A boot with proxgpu's bind script wrote nvidia into their driver_override.
    inventory = every(ct200(), driver=None, driver_override="nvidia")
    for address in ("0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"):
        inventory = changed(inventory, address, driver="vfio-pci", driver_override="vfio-pci")
    assert warnings(inventory, "new_id") == []
    # One left unmarked (a boot before the binding) is still named.
    inventory = changed(inventory, "0000:11:00.0", driver_override=None)
    (warning,) = warnings(inventory, "new_id")
    assert warning.startswith("0000:11:00.0 stays on the host but has no driver now")


def test_kept_twins_on_their_driver_are_not_at_risk_now() -> None:
    assert warnings(ct200(), "new_id") == []
