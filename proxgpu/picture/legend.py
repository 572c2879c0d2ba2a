"""The picture's header: the host in one line, then a legend of the styles the picture uses.

The legend names only what is drawn: a host without a shared IOMMU group gets no frame entry, a
plan that sends nothing to vfio-pci no vfio entry.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> from proxgpu.picture.topology import build_topology
>>> columns = build_topology(inspect(DirectoryHost("examples/hosts/ct200")))
>>> [meaning for _, meaning in legend_items(columns, None)]
['GPU (badge: its /dev/nvidiaN)']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxgpu.picture.shapes import SANS_PX, Picture, Rect, Text, text_width, wrap
from proxgpu.picture.topology import shared_groups
from proxgpu.planning.model import Role

if TYPE_CHECKING:
    from proxgpu.picture.topology import Assignment, Column

SWATCH = 14
#: Estimated width of one character of the 15px bold title, and its line height.
TITLE_PX = 9.4
TITLE_LINE = 19
SPACING = 18


def legend_items(
    columns: list[Column], roles: dict[str, Assignment] | None
) -> list[tuple[str, str]]:
    """(style of the swatch, what it means) for each style the picture of ``columns`` uses;
    with a plan's ``roles``, GPUs are drawn by role and one the plan leaves out is muted.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> from proxgpu.picture.topology import build_topology
    >>> columns = build_topology(inspect(DirectoryHost("examples/hosts/shared-iommu-group")))
    >>> [css for css, _ in legend_items(columns, None)]
    ['pg-gpu-plain', 'pg-frame']
    """
    nodes = [node for column in columns for node in column.nodes()]
    gpus = [node for node in nodes if node.gpu is not None]
    if roles is None:
        drawn = {"plain" for node in gpus if not node.muted}
    else:
        drawn = {roles[n.address].role for n in gpus if not n.muted and n.address in roles}
    muted = any(n.muted or (roles is not None and n.address not in roles) for n in gpus)
    minors = any(node.gpu.nvidia_minor is not None for node in gpus if node.gpu is not None)
    guests = roles is not None and any(role.guest for role in roles.values())
    badge = " (badge: its guest)" if guests else ""
    candidates = [
        ("plain", "pg-gpu-plain", "GPU" + (" (badge: its /dev/nvidiaN)" if minors else "")),
        *((str(role), f"pg-gpu-{role}", role.action + badge) for role in Role),
    ]
    items = [(css, meaning) for key, css, meaning in candidates if key in drawn]
    if muted:
        items.append(("pg-gpu-muted", "BMC display, GPU left as it is: muted"))
    if any(node.kind == "device" for node in nodes):
        items.append(("pg-device", "other device in a GPU's IOMMU group"))
    if any(node.kind == "nic" for node in nodes):
        items.append(("pg-nic", "NIC on a GPU's switch"))
    if any(shared_groups(column) for column in columns):
        items.append(("pg-frame", "IOMMU group shared: moves as one"))
    return items


def header_shapes(picture: Picture, items: list[tuple[str, str]], margin: float) -> float:
    """Draw the title (wrapped onto a second line when long) and the legend ``items`` at the
    top of ``picture``; return the y below them.

    >>> picture = Picture(width=720, height=0, title="pve1: Proxmox VE 8.4.1")
    >>> header_shapes(picture, [("pg-gpu-plain", "GPU")], 16)
    76
    """
    title = wrap(picture.title, picture.width - 2 * margin, TITLE_PX)
    for i, line in enumerate(title):
        picture.texts.append(Text(margin, margin + 14 + i * TITLE_LINE, line, "pg-title"))
    x, y = margin, margin + 30 + (len(title) - 1) * TITLE_LINE
    for css, meaning in items:
        width = SWATCH + 6 + text_width(meaning, SANS_PX)
        if x + width > picture.width - margin:
            x, y = margin, y + SPACING + 2
        picture.rects.append(Rect(x, y, SWATCH, SWATCH, f"{css} pg-swatch"))
        picture.texts.append(Text(x + SWATCH + 6, y + 11, meaning, "pg-legend"))
        x += width + SPACING
    return y + SWATCH + 16
