"""PCI vocabulary: addresses, and which kernel modules drive a function when the host cannot say
(it is unbound or on vfio-pci), inferred from its vendor and class the way the modules' own ID
tables match them.

>>> normalize_pci_address("81:00.0")
'0000:81:00.0'

>>> host_modules("10de", "0x030000")
['nvidia', 'nouveau']
>>> host_modules("8086", "0x040300")
['snd_hda_intel']
"""

from __future__ import annotations

import re

VFIO_DRIVER = "vfio-pci"

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
# The display controllers of server BMCs: ASPEED's AST family and Matrox's G200 server variants
# (SE, EV, WB, EH, ER, EW3, EH3, EH5; the IDs of Linux's ast and mgag200 drivers). Display class,
# but the board's management console, never a compute GPU.
_BMC_DISPLAYS = {("1a03", "2000")} | {
    ("102b", device)
    for device in ("0522", "0524", "0530", "0532", "0533", "0534", "0536", "0538", "0539")
}
# Module name -> the name its PCI driver registers in sysfs, where the two differ.
_DRIVER_NAME = {"bochs": "bochs-drm"}


def is_bmc_display(vendor_id: str, device_id: str) -> bool:
    """Whether this display controller is a server BMC's (its remote console), not a GPU.

    >>> [is_bmc_display(*ids) for ids in [("1a03", "2000"), ("102b", "0534"), ("10de", "2330")]]
    [True, True, False]
    """
    return (vendor_id.lower(), device_id.lower()) in _BMC_DISPLAYS


def host_modules(vendor_id: str, class_code: str) -> list[str]:
    """The modules that would claim a function of this vendor and class, most likely first."""
    hex_class = class_code.removeprefix("0x")
    if hex_class.startswith("0403"):
        return ["snd_hda_intel"]
    if hex_class.startswith("03"):
        return list(_DISPLAY.get(vendor_id, []))
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
