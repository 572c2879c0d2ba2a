"""The picture's header: the host in one line, then a legend of what each style means.

>>> from proxgpu.picture.layout import Picture
>>> from proxgpu.inspection import Inventory
>>> picture = Picture(width=720, height=0, title="pve1: Proxmox VE 8.4.1")
>>> header_shapes(picture, Inventory(source="s", hostname="pve1"), False, 16) > 16
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxgpu.picture.shapes import SANS_PX, Rect, Text, text_width

if TYPE_CHECKING:
    from proxgpu.inspection.inventory import Inventory
    from proxgpu.picture.layout import Picture

#: (style of the swatch, what it means), for every picture; then those of a plan's picture.
ALWAYS = [
    ("pg-frame", "IOMMU group shared: moves as one"),
    ("pg-nic", "NIC on a GPU's switch"),
    ("pg-gpu-muted", "BMC display, other devices: muted"),
]
PLANNED = [
    ("pg-gpu-host", "stays on the host driver"),
    ("pg-gpu-vfio", "goes to vfio-pci"),
]
SWATCH = 14
SPACING = 18


def header_shapes(picture: Picture, inventory: Inventory, planned: bool, margin: float) -> float:
    """Draw the title and the legend at the top of ``picture``; return the y below them."""
    picture.texts.append(Text(margin, margin + 14, picture.title, "pg-title"))
    items = (PLANNED if planned else [("pg-gpu-plain", "GPU (badge: its /dev/nvidiaN)")]) + ALWAYS
    if not inventory.nics:
        items = [item for item in items if item[0] != "pg-nic"]
    x, y = margin, margin + 30
    for css, meaning in items:
        width = SWATCH + 6 + text_width(meaning, SANS_PX)
        if x + width > picture.width - margin:
            x, y = margin, y + SPACING + 2
        picture.rects.append(Rect(x, y, SWATCH, SWATCH, f"{css} pg-swatch"))
        picture.texts.append(Text(x + SWATCH + 6, y + 11, meaning, "pg-legend"))
        x += width + SPACING
    return y + SWATCH + 16
