"""Which kernel modules drive a PCI function when the host cannot say (it is unbound or on
vfio-pci): inferred from its vendor and class, the way the modules' own ID tables match them.

>>> host_modules("10de", "0x030000")
['nvidia', 'nouveau']
>>> host_modules("8086", "0x040300")
['snd_hda_intel']
"""

from __future__ import annotations

# The modules that claim each vendor's display controllers, the preferred one first.
_DISPLAY = {
    "10de": ["nvidia", "nouveau"],
    "1002": ["amdgpu", "radeon"],
    "8086": ["i915", "xe"],
    "1234": ["bochs"],  # QEMU's bochs-display, the stand-in GPU of the end-to-end tests
    "1a03": ["ast"],
}
# Module name -> the name its PCI driver registers in sysfs, where the two differ.
_DRIVER_NAME = {"bochs": "bochs-drm"}


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
