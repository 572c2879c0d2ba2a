"""What gpu_split's options ask for, read the same way by both Ansible front ends: the module
proxgpu ships for running on the host (:mod:`proxgpu.ansible.proxgpu_split`) and the
``proxgpu.pve`` collection's action plugin, which runs on the controller.

>>> request = split_request({"lxc": [200], "vms": ["300:2"], "host_nodes": [], "vfio_nodes": [],
...     "host_gpus": [], "vfio_gpus": [], "enable_iommu": False, "bind_method": "driverctl",
...     "mapping": None, "gpu_vendor": ["0x10DE"]})
>>> request.policy.vms, request.options.bind_method, request.gpu_filter.vendors
([(300, 2)], 'driverctl', ('10de',))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxgpu.apply import ApplyOptions
from proxgpu.apply.options import ACTION_TIMEOUT
from proxgpu.inspection import GpuFilter
from proxgpu.planning import SplitPolicy
from proxgpu.rendering import RenderOptions


@dataclass(frozen=True)
class SplitRequest:
    """The split, the rendering choices and the GPUs the options ask for."""

    policy: SplitPolicy
    options: RenderOptions
    gpu_filter: GpuFilter


def gpu_filter(params: dict[str, Any]) -> GpuFilter:
    """The GPUs the options ask for: ``gpu_vendor`` and ``gpu_class`` as the CLI takes them.

    >>> gpu_filter({"gpu_vendor": ["0x10DE"], "gpu_class": None})
    GpuFilter(classes=('03', '12'), vendors=('10de',))
    """
    return GpuFilter.of(params.get("gpu_class"), params.get("gpu_vendor"))


def split_request(params: dict[str, Any]) -> SplitRequest:
    """The options (validated as the modules' ``ARGUMENTS`` say) as a request.

    :raises UsageError: for a VM spec or policy that cannot be.
    """
    policy = SplitPolicy(
        lxc=[str(spec) for spec in params["lxc"] or []],
        vms=params["vms"] or [],
        host_nodes=params["host_nodes"],
        vfio_nodes=params["vfio_nodes"],
        host_gpus=params["host_gpus"],
        vfio_gpus=params["vfio_gpus"],
        enable_iommu=params["enable_iommu"],
    )
    options = RenderOptions(bind_method=params["bind_method"], mapping=params["mapping"])
    return SplitRequest(policy, options, gpu_filter(params))


def change_options(params: dict[str, Any], *, check: bool) -> ApplyOptions:
    """How the task's change runs, as the command line's options say it: check mode is a dry
    run; ``live``, ``force``, ``break_lock`` and ``trust_unsigned`` as the module takes them (a
    module without one: off), and ``action_timeout`` (a module without one, or ``None``: the
    command line's default).

    >>> change_options({"live": True, "trust_unsigned": True, "action_timeout": 60}, check=True)
    ApplyOptions(dry_run=True, live=True, skip_guest_check=False, break_lock=False, force=False, \
trust_unsigned=True, action_timeout=60.0, action_output=0, run_actions=True)
    """
    timeout = params.get("action_timeout")
    return ApplyOptions(
        dry_run=check,
        live=bool(params.get("live")),
        break_lock=bool(params.get("break_lock")),
        force=bool(params.get("force")),
        trust_unsigned=bool(params.get("trust_unsigned")),
        action_timeout=ACTION_TIMEOUT if timeout is None else float(timeout),
    )
