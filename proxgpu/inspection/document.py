"""The inventory as ``proxgpu inspect --json`` prints it: the JSON contract of docs/inspecting.md.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> inventory_document(inspect(DirectoryHost("examples/hosts/ct200")))["hostname"]
'ct200'
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from proxgpu.inspection.inventory import Inventory
from proxgpu.redact import redact_document


def inventory_document(inventory: Inventory) -> dict[str, Any]:
    """The inventory as ``inspect --json`` prints it, every secret redacted (guest configs, and
    any warning quoting one)."""
    document: dict[str, Any] = redact_document(asdict(inventory))
    return document
