"""proxgpu: partition a Proxmox VE host's GPUs along NUMA lines, safely and reversibly.

The pipeline, one package per stage: :mod:`proxgpu.host` (reach a host) ->
:mod:`proxgpu.pve` (Proxmox's formats and API) -> :mod:`proxgpu.inspection` ->
:mod:`proxgpu.planning` -> :mod:`proxgpu.rendering` -> :mod:`proxgpu.apply` ->
:mod:`proxgpu.pipeline` (the whole job in one call) -> :mod:`proxgpu.fleet` (many hosts,
clusters) -> :mod:`proxgpu.cli`. The names a script needs are here, loaded on first use.

>>> import proxgpu
>>> host = proxgpu.connect(root="examples/hosts/ct200")
>>> [gpu.address for gpu in proxgpu.inspect(host).gpus][:2]
['0000:01:00.0', '0000:11:00.0']
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from proxgpu.errors import ProxgpuError

if TYPE_CHECKING:
    __version__: str  # looked up when asked for (see __getattr__)

    from proxgpu.apply import ApplyOptions, history, verify
    from proxgpu.fleet import (
        Target,
        apply_cluster,
        each_host,
        find_nodes,
        plan_cluster,
        roll_out,
        snapshot_nodes,
    )
    from proxgpu.host import connect
    from proxgpu.host.ssh import SSHOptions
    from proxgpu.inspection import Gpu, GpuFilter, Inventory, NumaNode, PciFunction, inspect
    from proxgpu.pipeline import propose, split_host
    from proxgpu.pipeline.undoing import undo
    from proxgpu.planning import ContainerRequest, MigSpec, SplitPolicy, VgpuRequest, VmRequest
    from proxgpu.rendering import RenderOptions

# Loaded on first use (PEP 562): they bring pydantic, dataclasses and subprocess, which the
# command line's --help and usage errors never need.
_LAZY = {
    "ApplyOptions": "proxgpu.apply",
    "history": "proxgpu.apply",
    "verify": "proxgpu.apply",
    "connect": "proxgpu.host",
    "SSHOptions": "proxgpu.host.ssh",
    **{
        name: "proxgpu.planning"
        for name in ("SplitPolicy", "ContainerRequest", "MigSpec", "VmRequest", "VgpuRequest")
    },
    "RenderOptions": "proxgpu.rendering",
    "propose": "proxgpu.pipeline",
    "split_host": "proxgpu.pipeline",
    "undo": "proxgpu.pipeline.undoing",
    **{
        name: "proxgpu.fleet"
        for name in (
            "Target",
            "apply_cluster",
            "each_host",
            "find_nodes",
            "plan_cluster",
            "roll_out",
            "snapshot_nodes",
        )
    },
    **{
        name: "proxgpu.inspection"
        for name in ("Gpu", "GpuFilter", "Inventory", "NumaNode", "PciFunction", "inspect")
    },
}


def __getattr__(name: str) -> object:
    """The names above, loaded on first use, and ``__version__``, looked up when asked for.

    >>> import proxgpu, re
    >>> bool(re.match(r"\\d+\\.\\d+", proxgpu.__version__))
    True
    """
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if name == "__version__":
        return import_module("proxgpu.version").version()
    raise AttributeError(f"module 'proxgpu' has no attribute {name!r}")


__all__ = [
    "ApplyOptions",
    "ContainerRequest",
    "Gpu",
    "GpuFilter",
    "Inventory",
    "MigSpec",
    "NumaNode",
    "PciFunction",
    "ProxgpuError",
    "RenderOptions",
    "SSHOptions",
    "SplitPolicy",
    "Target",
    "VgpuRequest",
    "VmRequest",
    "apply_cluster",
    "connect",
    "each_host",
    "find_nodes",
    "history",
    "inspect",
    "plan_cluster",
    "propose",
    "roll_out",
    "snapshot_nodes",
    "split_host",
    "undo",
    "verify",
]
