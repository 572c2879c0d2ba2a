"""The picture as SVG: a standalone file (``inspect --format svg``) or inline in a report.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> svg = inventory_svg(inspect(DirectoryHost("examples/hosts/ct200")))
>>> svg.startswith('<?xml version="1.0"'), 'id="gpu-0000-81-00.0"' in svg
(True, True)
"""

from __future__ import annotations

from proxgpu.inspection.inventory import Inventory
from proxgpu.picture.layout import Picture, lay_out
from proxgpu.picture.topology import Assignment
from proxgpu.rendering.templating import render_markup


def render_svg(picture: Picture, *, standalone: bool = True) -> str:
    """``picture`` as SVG text; ``standalone`` adds the XML declaration, namespace and style
    sheet a file needs (an HTML page puts an inline ``<svg>`` in its namespace by itself and
    holds the style sheet once for all its pictures).

    >>> from proxgpu.picture.layout import Picture
    >>> render_svg(Picture(width=10, height=10, title="a & b"), standalone=False)[:4]
    '<svg'
    """
    return render_markup("picture.svg.j2", picture=picture, standalone=standalone)


def inventory_svg(
    inventory: Inventory, roles: dict[str, Assignment] | None = None, *, standalone: bool = True
) -> str:
    """The host's picture as SVG; with a plan's ``roles`` each GPU shows its role and guest.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> "NUMA node 1" in inventory_svg(inspect(DirectoryHost("examples/hosts/ct200")))
    True
    """
    return render_svg(lay_out(inventory, roles), standalone=standalone)
