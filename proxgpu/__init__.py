"""proxgpu: partition a Proxmox VE host's GPUs along NUMA lines, safely and reversibly.

>>> import proxgpu
>>> host = proxgpu.connect(root="examples/hosts/ct200")  # doctest: +SKIP
>>> [gpu.address for gpu in proxgpu.inspect(host).gpus][:2]  # doctest: +SKIP
['0000:01:00.0', '0000:11:00.0']
"""

from proxgpu.errors import ProxgpuError
from proxgpu.hosts import connect
from proxgpu.inspection import GpuFilter, inspect
from proxgpu.inventory import Gpu, Inventory, NumaNode, PciFunction

__all__ = [
    "Gpu",
    "GpuFilter",
    "Inventory",
    "NumaNode",
    "PciFunction",
    "ProxgpuError",
    "connect",
    "inspect",
]
