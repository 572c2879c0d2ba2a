"""Why a function the plan moves to vfio-pci is held by another driver after a boot: which file
or module beat the binding, read from the host as it is now.

The modprobe binding works when kmod, loading the driver, first loads vfio-pci through
proxgpu's ``install`` hook, which writes each function's ``driver_override``. So a function on
the wrong driver says which link of that chain failed: proxgpu's file is gone, another
``softdep`` line for the driver is the one kmod uses, another ``install vfio-pci`` runs instead
of the hook, or the driver is built into the kernel; with the chain whole, an initramfs that
lacks the files (or, when it could not be read, that it may).

>>> from proxgpu.inspection import Inventory, PciFunction
>>> fn = PciFunction(address="0000:81:00.0", vendor_id="10de", device_id="2bb1",
...                  class_code="0x030000", driver="nvidia")
>>> print(why_not_vfio(Inventory(source="t", hostname="t", kernel="6.8.12-11-pve"), fn))
its driver_override is empty, so proxgpu's bind script did not run before nvidia took it: \
/etc/modprobe.d/00-proxgpu-vfio.conf is missing (run proxgpu apply again)
"""

from __future__ import annotations

from proxgpu.inspection.inventory import Inventory, PciFunction
from proxgpu.kmod import module_of, normalize
from proxgpu.paths import BIND_SCRIPT, MODPROBE_CONF
from proxgpu.rendering.binding import initramfs_lacks_binding, ours_in_effect
from proxgpu.rendering.conflicts import before_ours, theirs


def why_not_vfio(inventory: Inventory, function: PciFunction) -> str:
    """One clause saying why ``function`` is on ``function.driver`` instead of vfio-pci."""
    driver = function.driver or "no driver"
    override = function.driver_override or "empty"
    if function.driver is None:
        return f"vfio-pci did not take it (driver_override is {override}): is vfio-pci loaded?"
    if function.driver_override == "vfio-pci":
        start = f"its driver_override is vfio-pci, but {driver} took it before that was written"
    else:
        start = (
            f"its driver_override is {override}, so proxgpu's bind script did not run before "
            f"{driver} took it"
        )
    return f"{start}: {_broken_link(inventory, function.driver)}"


def _broken_link(inventory: Inventory, driver: str) -> str:
    if MODPROBE_CONF not in inventory.host_files:
        return f"{MODPROBE_CONF} is missing (run proxgpu apply again)"
    module = inventory.driver_module(driver)
    if module is None:
        return f"{driver} is built into the kernel, so nothing loads before it (bind with --live)"
    config = theirs(inventory)
    first = config.softdep(module)
    wins = first is not None and before_ours(first)
    if first is not None and wins and "vfio_pci" not in map(normalize, first.softdeps()[0]):
        return f"kmod uses {first.where} (`{first.text}`) for {module}, not proxgpu's line"
    install = config.install("vfio_pci")
    if install is not None and before_ours(install):
        return f"{install.where} (`{install.text}`) runs instead of proxgpu's hook"
    if not ours_in_effect(inventory, module):
        return f"{MODPROBE_CONF} has no softdep for {module} (run proxgpu plan and apply again)"
    if BIND_SCRIPT not in inventory.host_files:
        return f"{BIND_SCRIPT} is missing (run proxgpu apply again)"
    early = module in {module_of(f) for f in inventory.initramfs_files or ()}
    if early and initramfs_lacks_binding(inventory):
        return (
            f"{module} loads from the initramfs of {inventory.kernel}, which lacks proxgpu's "
            "files (update-initramfs -u -k all, then reboot)"
        )
    if inventory.initramfs_files is not None:
        where = "the initramfs carries them" if early else f"{module} is not in the initramfs"
        return (
            f"the files are in place and {where}: `journalctl -b -k | grep -i vfio` says why "
            "vfio-pci did not take it"
        )
    # Unread, the initramfs is the likeliest place, but only a likelihood: say so.
    return (
        f"the files are in place, and the initramfs of {inventory.kernel or 'this kernel'} "
        f"could not be read, so whether {module} loaded from one built before them is not "
        "known: rebuild it (update-initramfs -u -k all) and reboot, or see "
        "`journalctl -b -k | grep -i vfio`"
    )
