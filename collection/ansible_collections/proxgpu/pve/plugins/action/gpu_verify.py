"""Action plugin ``proxgpu.pve.gpu_verify`` (documentation: ``plugins/modules/gpu_verify.py``)."""

from __future__ import annotations

from ansible_collections.proxgpu.pve.plugins.plugin_utils.action import ProxgpuAction


class ActionModule(ProxgpuAction):
    """Compare the host with the last apply; drift fails the task."""

    module = "gpu_verify"
