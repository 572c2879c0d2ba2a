"""Read what the tests need from a PDF that chromium printed (Skia's writer: plain objects, each
content stream Flate-compressed with a direct ``/Length``), with the standard library alone:
the pages' sizes and the fill colours its pages paint with.

>>> import zlib
>>> content = zlib.compress(b"0.9 1 0.925 rg 0 0 10 10 re f")
>>> page = b"%PDF-1.4\\n1 0 obj\\n<</Type /Page\\n/MediaBox [0 0 612 792]>>\\nendobj\\n"
>>> stream = b"2 0 obj\\n<</Filter /FlateDecode\\n/Length %d>> stream\\n" % len(content)
>>> data = page + stream + content + b"\\nendstream\\nendobj\\n"
>>> document = read_pdf(data)
>>> document.pages, document.fills
([(612.0, 792.0)], {(0.9, 1.0, 0.925)})
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

PAGE = re.compile(rb"/Type /Page\b(?!s).*?/MediaBox \[([-\d. ]+)\]", re.DOTALL)
STREAM = re.compile(rb"<<((?:(?!>>).)*?)>>\s*stream\r?\n", re.DOTALL)
LENGTH = re.compile(rb"/Length (\d+)(?! \d+ R)")
FILL = re.compile(rb"([\d.]+) ([\d.]+) ([\d.]+) rg\b")


@dataclass
class Pdf:
    """Each page's width and height in points, and every RGB fill colour painted (0 to 1)."""

    pages: list[tuple[float, float]]
    fills: set[tuple[float, float, float]]


def read_pdf(data: bytes) -> Pdf:
    """The pages and fill colours of ``data``, a PDF as chromium writes it."""
    if not data.startswith(b"%PDF-"):
        raise ValueError("not a PDF")
    pages = []
    for match in PAGE.finditer(data):
        x0, y0, x1, y1 = (float(v) for v in match.group(1).split())
        pages.append((x1 - x0, y1 - y0))
    fills = set()
    for content in _streams(data):
        for match in FILL.finditer(content):
            red, green, blue = (float(v) for v in match.groups())
            fills.add((red, green, blue))
    return Pdf(pages, fills)


def _streams(data: bytes) -> list[bytes]:
    streams = []
    for match in STREAM.finditer(data):
        length = LENGTH.search(match.group(1))
        if length is None:
            raise ValueError("a stream without a direct /Length: not a PDF chromium wrote")
        body = data[match.end() : match.end() + int(length.group(1))]
        if b"/FlateDecode" in match.group(1):
            body = zlib.decompress(body)
        streams.append(body)
    return streams
