"""The inventory as ``proxgpu inspect --json`` prints it: the README's JSON contract.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> inventory_document(inspect(DirectoryHost("examples/hosts/ct200")))["hostname"]
'ct200'
"""

from __future__ import annotations

from typing import Any

from proxgpu.inspection.inventory import Inventory
from proxgpu.pve.config import redact_secrets


def inventory_document(inventory: Inventory) -> dict[str, Any]:
    """The inventory as ``inspect --json`` prints it, guest configs redacted."""
    configs = {p: redact_secrets(t) for p, t in inventory.guest_configs.items()}
    return inventory.model_copy(update={"guest_configs": configs}).model_dump(mode="json")
