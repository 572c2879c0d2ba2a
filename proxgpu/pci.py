"""PCI vocabulary: addresses, which kernel modules drive a function when the host cannot say
(it is unbound or on vfio-pci), inferred from its vendor and class the way the modules' own ID
tables match them, and what a display controller or processing accelerator is: a server's
onboard display, a GPU, or an accelerator of another kind.

>>> normalize_pci_address("81:00.0")
'0000:81:00.0'

>>> host_modules("10de", "0x030000")
['nvidia', 'nouveau']
>>> host_modules("8086", "0x040300")
['snd_hda_intel']
>>> host_modules("1002", "0x120000")
['amdgpu']
"""

from __future__ import annotations

import re

VFIO_DRIVER = "vfio-pci"
#: NVIDIA's kernel module, whose GPUs a container uses through NVIDIA's user space.
NVIDIA_DRIVER = "nvidia"
#: NVIDIA's PCI vendor ID.
NVIDIA = "10de"

_PCI_ADDRESS = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{4,8}):)?(?P<bus>[0-9a-f]{2}):(?P<device>[0-9a-f]{2})"
    r"(?:\.(?P<function>[0-7]))?$",
    re.IGNORECASE,
)

# The modules that claim each vendor's display controllers, the preferred one first.
_DISPLAY = {
    "10de": ["nvidia", "nouveau"],
    "1002": ["amdgpu", "radeon"],
    "8086": ["i915", "xe"],
    "1234": ["bochs"],  # QEMU's bochs-display, the stand-in GPU of the end-to-end tests
    "1a03": ["ast"],
}
# The modules that claim each vendor's processing accelerators (class 0x12) that are GPUs. Only
# amdgpu does: it names the MI100 and MI200 (MI210, MI250) by ID, and recent kernels give it AMD's
# processing accelerators by class (0x120000), which the MI300X and MI300A answer to; on an older
# kernel the driver bound says so instead. An accelerator of any other vendor is another kind of
# device: Habana's Gaudi on habanalabs, Xilinx and Intel FPGAs, NPUs.
_ACCELERATOR_GPUS = {"1002": ["amdgpu"]}
# Servers' onboard display controllers, the video of the board's remote console: display class,
# yet never a GPU to split. Each ID is one a Linux driver's table lists for such a chip:
# - ASPEED's AST BMCs: 2000 and 2010, the two IDs of the ast driver (every AST chip after the
#   AST2100, up to the AST2600, shows 2000);
# - Matrox G200 server variants, the mgag200 driver's IDs but for the desktop G200's 0520 and
#   0521: SE A and B (0522, 0524), EV (0530), WB (0532), EH (0533), ER (0534), EW3 (0536),
#   EH3 (0538), EH5 (053a). Other BMCs show these: pci.ids names 0522 the ServerEngines (Emulex)
#   Pilot's, 0532 Nuvoton's WPCM450's, and 0538 the display of HPE's iLO 5;
# - ATI's ES1000 (RN50), the onboard display of many older Intel and AMD servers: 515e and
#   5969, the two IDs radeon tells apart as RN50 (its ASIC_IS_RN50);
# - Huawei's iBMC (Hi171x) display: 1711, the one ID of the hibmc driver.
_ONBOARD_DISPLAYS = (
    {("1a03", device) for device in ("2000", "2010")}
    | {
        ("102b", device)
        for device in ("0522", "0524", "0530", "0532", "0533", "0534", "0536", "0538", "053a")
    }
    | {("1002", "515e"), ("1002", "5969"), ("19e5", "1711")}
)
# Module name -> the name its PCI driver registers in sysfs, where the two differ.
_DRIVER_NAME = {"bochs": "bochs-drm"}


def is_bmc_display(vendor_id: str, device_id: str) -> bool:
    """Whether this display controller is a server's onboard one (its BMC's remote console:
    ASPEED, Matrox G200 server variants, ATI ES1000, Huawei iBMC), not a GPU.

    >>> onboard = [("1a03", "2000"), ("102b", "0534"), ("1002", "515e"), ("19e5", "1711")]
    >>> [is_bmc_display(*ids) for ids in onboard], is_bmc_display("10de", "2330")
    ([True, True, True, True], False)
    """
    return (vendor_id.lower(), device_id.lower()) in _ONBOARD_DISPLAYS


def is_accelerator(class_code: str) -> bool:
    """Whether a function is a processing accelerator (PCI class 0x12).

    >>> is_accelerator("0x120000"), is_accelerator("0x030200")
    (True, False)
    """
    return class_code.removeprefix("0x").startswith("12")


def is_gpu_accelerator(vendor_id: str, class_code: str, driver: str | None) -> bool:
    """Whether a processing accelerator (class 0x12) is a GPU: one a GPU driver claims (amdgpu,
    for AMD Instinct). The driver bound now says so; an accelerator that is unbound or on
    vfio-pci is one when the driver that would claim it is a GPU driver.

    >>> seen = [("1002", "amdgpu"), ("1002", None), ("10ee", "vfio-pci"), ("1da3", "habanalabs")]
    >>> [is_gpu_accelerator(vendor, "0x120000", driver) for vendor, driver in seen]
    [True, True, False, False]
    """
    gpu_drivers = {module for modules in _ACCELERATOR_GPUS.values() for module in modules}
    return (
        is_accelerator(class_code)
        and returning_driver(driver, vendor_id, class_code) in gpu_drivers
    )


def host_modules(vendor_id: str, class_code: str) -> list[str]:
    """The modules that would claim a function of this vendor and class, most likely first."""
    hex_class = class_code.removeprefix("0x")
    if hex_class.startswith("0403"):
        return ["snd_hda_intel"]
    if hex_class.startswith("03"):
        return list(_DISPLAY.get(vendor_id, []))
    if is_accelerator(class_code):
        return list(_ACCELERATOR_GPUS.get(vendor_id, []))
    return []


def host_driver(vendor_id: str, class_code: str) -> str | None:
    """The sysfs driver name a GPU would return to, or ``None`` when proxgpu cannot tell.

    >>> host_driver("1002", "0x030000"), host_driver("1234", "0x038000")
    ('amdgpu', 'bochs-drm')
    """
    modules = host_modules(vendor_id, class_code)
    return _DRIVER_NAME.get(modules[0], modules[0]) if modules else None


def module_name(driver: str) -> str:
    """The name of the module that provides a PCI driver, as kmod writes it.

    >>> module_name("bochs-drm"), module_name("vfio-pci"), module_name("nvidia")
    ('bochs', 'vfio_pci', 'nvidia')
    """
    modules = {name: module for module, name in _DRIVER_NAME.items()}
    return modules.get(driver, driver.replace("-", "_"))


def returning_driver(driver: str | None, vendor_id: str, class_code: str) -> str | None:
    """The driver a GPU of a host group holds after a split: its own, or, when it is unbound or
    on vfio-pci, the one it returns to (``None`` when proxgpu cannot tell).

    >>> returning_driver("vfio-pci", "10de", "0x030200"), returning_driver(None, "1af4", "0x0302")
    ('nvidia', None)
    """
    if driver and driver != VFIO_DRIVER:
        return driver
    return host_driver(vendor_id, class_code)


def normalize_pci_address(text: str) -> str:
    """The sysfs form of a PCI address: 4-digit domain, lower case; a slot stays a slot.

    Takes what ``hostpci``, ``lspci`` and ``nvidia-smi`` print.

    >>> normalize_pci_address("81:00.0"), normalize_pci_address("0000:81:00")
    ('0000:81:00.0', '0000:81:00')
    >>> normalize_pci_address("00000000:4F:00.0")
    '0000:4f:00.0'

    :raises ValueError: when ``text`` is not a PCI address.
    """
    match = _PCI_ADDRESS.match(text.strip())
    if match is None:
        raise ValueError(f"not a PCI address: {text!r}")
    domain = int(match["domain"] or "0", 16)
    slot = f"{domain:04x}:{match['bus']}:{match['device']}".lower()
    return f"{slot}.{match['function']}" if match["function"] else slot
