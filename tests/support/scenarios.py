"""The rendering scenarios whose change sets are kept as goldens in ``tests/golden/NAME.diff``.

Each is an example host with a split policy and render options; :func:`scenario` inspects the host
(or a copy of it) and renders the plan.

>>> sorted(SCENARIOS)[:2]
['ct200-driverctl', 'ct200-lxc-vm']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.inspection.recognition import GpuFilter
from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy
from proxgpu.rendering import render
from proxgpu.rendering.changes import ChangeSet
from proxgpu.rendering.context import RenderOptions
from tests.support.trees import EXAMPLES

#: name -> (example host, SplitPolicy fields, RenderOptions fields).
SCENARIOS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "ct200-lxc-vm": ("ct200", {"lxc": 200, "vms": [(300, None)]}, {}),
    "ct200-mapping": ("ct200", {"lxc": 200, "vms": [(300, None)]}, {"mapping": "gpu-node1"}),
    "ct200-driverctl": ("ct200", {"lxc": 200}, {"bind_method": "driverctl"}),
    "uneven-enable-iommu": ("uneven-5-3", {"enable_iommu": True, "lxc": 150}, {}),
    "single-socket-by-address": ("single-socket", {"vfio_gpus": ["0000:0b:00.0"], "lxc": 101}, {}),
    "shared-group": ("shared-iommu-group", {}, {}),
    "vgpu-add": ("vgpu", {"lxc": 200, "vgpus": [(400, "nvidia-1155")]}, {}),
    "mig-two-containers": (
        "mig",
        {
            "lxc_mig": [
                {"vmid": 200, "gpu": "0", "gi": 2},
                {"vmid": 201, "gpu": "0000:18:00.0", "gi": 3, "ci": 1},
            ],
            "vms": [(300, None)],
        },
        {},
    ),
}


def scenario(name: str, root: Path | None = None) -> tuple[Inventory, ChangeSet]:
    """Inspect the scenario's host (``root``, a copy of it, when given) and render its plan."""
    host, policy, options = SCENARIOS[name]
    inventory = inspect(DirectoryHost(str(root or EXAMPLES / host)), GpuFilter())
    plan = plan_split(inventory, SplitPolicy(**policy))
    return inventory, render(inventory, plan, RenderOptions(**options))
