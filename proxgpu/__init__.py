"""proxgpu: partition a Proxmox VE host's GPUs along NUMA lines, safely and reversibly.

The pipeline, one package per stage: :mod:`proxgpu.host` (reach a host) ->
:mod:`proxgpu.pve` (Proxmox's formats and API) -> :mod:`proxgpu.inspection` ->
:mod:`proxgpu.planning` -> :mod:`proxgpu.rendering` -> :mod:`proxgpu.apply` ->
:mod:`proxgpu.pipeline` (the whole job in one call) -> :mod:`proxgpu.cli`.

>>> import proxgpu
>>> host = proxgpu.connect(root="examples/hosts/ct200")
>>> [gpu.address for gpu in proxgpu.inspect(host).gpus][:2]
['0000:01:00.0', '0000:11:00.0']
"""

from proxgpu.errors import ProxgpuError
from proxgpu.host import connect
from proxgpu.inspection import Gpu, GpuFilter, Inventory, NumaNode, PciFunction, inspect

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
