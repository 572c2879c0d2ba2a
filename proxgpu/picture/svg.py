"""The picture as SVG: a standalone file (``inspect --format svg``) or inline in a report.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> svg = inventory_svg(inspect(DirectoryHost("examples/hosts/ct200")))
>>> svg.startswith('<?xml version="1.0"'), 'id="gpu-0000-81-00.0"' in svg
(True, True)
"""

from __future__ import annotations

import re
from xml.sax.saxutils import escape

from proxgpu.inspection.inventory import Inventory
from proxgpu.picture.layout import lay_out
from proxgpu.picture.shapes import Picture
from proxgpu.picture.topology import Assignment
from proxgpu.rendering.templating import render_markup


def render_svg(picture: Picture, *, standalone: bool = True) -> str:
    """``picture`` as SVG text; ``standalone`` adds the XML declaration, namespace and style
    sheet a file needs (an HTML page puts an inline ``<svg>`` in its namespace by itself and
    holds the style sheet once for all its pictures).

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


_SIZE = re.compile(r'<svg [^>]*?width="(\d+)" height="(\d+)"')
#: The height of the heading above each host's picture.
_HEADING = 28


def stack_svgs(pictures: list[tuple[str, str | None]]) -> str:
    """One SVG file holding several hosts' standalone pictures one below the other, each under
    its host's name (a host without a picture, ``None``, says it could not be read).

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> one = inventory_svg(inspect(DirectoryHost("examples/hosts/ct200")))
    >>> both = stack_svgs([("a", one), ("b", None)])
    >>> both.count("<svg "), "b: not read" in both
    (2, True)
    """
    parts, width, top = [], 0, 0
    for name, svg in pictures:
        heading = escape(name if svg is not None else f"{name}: not read (see stderr)")
        parts.append(f'<text x="8" y="{top + 20}" font-size="16">{heading}</text>')
        top += _HEADING
        if svg is None:
            continue
        found = _SIZE.search(svg)
        w, h = (int(found[1]), int(found[2])) if found else (0, 0)
        body = svg[svg.index("<svg ") :].replace("<svg ", f'<svg y="{top}" ', 1)
        parts.append(body)
        width, top = max(width, w), top + h
    head = '<?xml version="1.0" encoding="UTF-8"?>\n'
    head += f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top}" '
    head += f'viewBox="0 0 {width} {top}">\n'
    return head + "\n".join(parts) + "\n</svg>\n"
