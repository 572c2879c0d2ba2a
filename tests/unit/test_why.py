"""verify's account of a moved function on the wrong driver: which link of the binding broke."""

from __future__ import annotations

import pytest

from proxgpu.apply.why import why_not_vfio
from proxgpu.inspection.inventory import Inventory, PciFunction
from proxgpu.paths import BIND_SCRIPT, MODPROBE_CONF

KERNEL = "6.8.12-11-pve"
OURS = (
    "softdep nvidia pre: vfio-pci ecdh_generic,ecdsa_generic\n"
    f"install vfio-pci {BIND_SCRIPT}; /sbin/modprobe --ignore-install vfio-pci $CMDLINE_OPTS\n"
)
WHOLE = {MODPROBE_CONF: OURS, BIND_SCRIPT: "#!/bin/sh\n"}


def _why(
    files: dict[str, str],
    *,
    modules: bool = True,
    override: str | None = None,
    initramfs: list[str] | None = None,
) -> str:
    inventory = Inventory(
        source="t",
        hostname="pve1",
        kernel=KERNEL,
        host_files=files,
        # Without nvidia's module link beside another driver's, nvidia is built in.
        driver_modules={"nvidia": "nvidia"} if modules else {"ahci": "ahci"},
        initramfs_files=initramfs,
    )
    function = PciFunction(
        address="0000:81:00.0",
        vendor_id="10de",
        device_id="2bb1",
        class_code="0x030000",
        driver="nvidia",
        driver_override=override,
    )
    return why_not_vfio(inventory, function)


@pytest.mark.parametrize(
    ("files", "modules", "said"),
    [
        ({}, True, f"{MODPROBE_CONF} is missing"),
        (WHOLE, False, "nvidia is built into the kernel"),
        (
            {**WHOLE, "/etc/modprobe.d/0-gpu.conf": "softdep nvidia pre: nvidia_helper\n"},
            True,
            "kmod uses /etc/modprobe.d/0-gpu.conf:1 (`softdep nvidia pre: nvidia_helper`)",
        ),
        (
            {**WHOLE, "/etc/modprobe.d/0-vfio.conf": "install vfio-pci /bin/true\n"},
            True,
            "/etc/modprobe.d/0-vfio.conf:1 (`install vfio-pci /bin/true`) runs instead",
        ),
        ({**WHOLE, MODPROBE_CONF: OURS.split("\n", 1)[1]}, True, "has no softdep for nvidia"),
        ({MODPROBE_CONF: OURS}, True, f"{BIND_SCRIPT} is missing"),
        (WHOLE, True, "could not be read, so whether nvidia loaded from one built before them"),
    ],
)
def test_each_broken_link_is_named(files: dict[str, str], modules: bool, said: str) -> None:
    why = _why(files, modules=modules)
    assert why.startswith("its driver_override is empty, so proxgpu's bind script did not run")
    assert said in why


def test_modules_softdep_after_proxgpus_file_is_not_blamed() -> None:
    softdep = {f"/lib/modules/{KERNEL}/modules.softdep": "softdep nvidia pre: ecdh_generic\n"}
    assert "initramfs" in _why({**WHOLE, **softdep})


def test_an_override_written_too_late_is_told_apart() -> None:
    why = _why(WHOLE, override="vfio-pci")
    assert why.startswith("its driver_override is vfio-pci, but nvidia took it before")


def test_an_initramfs_without_the_binding_is_named() -> None:
    listed = ["nvidia.ko.zst", "vfio-pci.ko.zst"]
    why = _why(WHOLE, initramfs=listed)
    assert f"nvidia loads from the initramfs of {KERNEL}, which lacks proxgpu's files" in why
    carried = [*listed, MODPROBE_CONF.rsplit("/", 1)[1], BIND_SCRIPT.rsplit("/", 1)[1]]
    assert "the initramfs carries them" in _why(WHOLE, initramfs=carried)
