"""Read what the tests need from a PDF that chromium printed (Skia's writer: plain objects, each
content stream Flate-compressed with a direct ``/Length``), with the standard library alone:
the pages' sizes and the fill colours its pages paint with.

>>> import zlib
>>> content = zlib.compress(b"0.9 1 0.925 rg 0 0 10 10 re f")
>>> page = b"%PDF-1.4\\n1 0 obj\\n<</Type /Page\\n/MediaBox [0 0 612 792]>>\\nendobj\\n"
>>> stream = b"2 0 obj\\n<</Filter /FlateDecode\\n/Length %d>> stream\\n" % len(content)
>>> data = page + stream + content + b"\\nendstream\\nendobj\\n"
>>> document = read_pdf(data)
>>> document.pages, document.fills, document.texts
([(612.0, 792.0)], {(0.9, 1.0, 0.925)}, [0])
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

PAGE = re.compile(rb"/Type /Page\b(?!s).*?/MediaBox \[([-\d. ]+)\]", re.DOTALL)
STREAM = re.compile(rb"<<((?:(?!>>).)*?)>>\s*stream\r?\n", re.DOTALL)
LENGTH = re.compile(rb"/Length (\d+)(?! \d+ R)")
FILL = re.compile(rb"([\d.]+) ([\d.]+) ([\d.]+) rg\b")
OBJECT = re.compile(rb"(\d+) 0 obj\b")
CONTENTS = re.compile(rb"/Contents (\d+) 0 R")
TEXT = re.compile(rb"\bT[Jj]\b")


@dataclass
class Pdf:
    """Each page's width and height in points, every RGB fill colour painted (0 to 1), and
    how many runs of text each page shows (its content's ``Tj`` and ``TJ`` operators: a page
    with a title and a heading shows a few, a page of diff hundreds)."""

    pages: list[tuple[float, float]]
    fills: set[tuple[float, float, float]]
    texts: list[int]


def read_pdf(data: bytes) -> Pdf:
    """The pages, fill colours and text runs of ``data``, a PDF as chromium writes it."""
    if not data.startswith(b"%PDF-"):
        raise ValueError("not a PDF")
    streams = _streams(data)
    pages, texts = [], []
    for match in PAGE.finditer(data):
        x0, y0, x1, y1 = (float(v) for v in match.group(1).split())
        pages.append((x1 - x0, y1 - y0))
        contents = CONTENTS.search(data, match.start(), data.find(b"endobj", match.start()))
        body = streams.get(int(contents.group(1)), b"") if contents else b""
        texts.append(len(TEXT.findall(body)))
    fills = set()
    for content in streams.values():
        for match in FILL.finditer(content):
            red, green, blue = (float(v) for v in match.groups())
            fills.add((red, green, blue))
    return Pdf(pages, fills, texts)


def _streams(data: bytes) -> dict[int, bytes]:
    """Each stream's decoded bytes, by the number of the object that holds it. Read in order,
    each search starting past the body before: a compressed body may hold any bytes, ``<<``
    and ``0 obj`` among them."""
    streams = {}
    position = 0
    while (match := STREAM.search(data, position)) is not None:
        length = LENGTH.search(match.group(1))
        headers = OBJECT.findall(data, position, match.start())
        if length is None or not headers:
            raise ValueError("a stream without a direct /Length: not a PDF chromium wrote")
        body = data[match.end() : match.end() + int(length.group(1))]
        position = match.end() + len(body)
        if b"/FlateDecode" in match.group(1):
            body = zlib.decompress(body)
        streams[int(headers[-1])] = body
    return streams
