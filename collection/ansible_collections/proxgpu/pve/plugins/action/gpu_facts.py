"""Action plugin ``proxgpu.pve.gpu_facts`` (documentation: ``plugins/modules/gpu_facts.py``)."""

from __future__ import annotations

from ansible_collections.proxgpu.pve.plugins.plugin_utils.action import ProxgpuAction


class ActionModule(ProxgpuAction):
    """The host's GPU inventory as the fact ``proxgpu``; never changes anything."""

    module = "gpu_facts"
