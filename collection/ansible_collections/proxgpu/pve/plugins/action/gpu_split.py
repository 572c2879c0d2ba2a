"""Action plugin ``proxgpu.pve.gpu_split`` (documentation: ``plugins/modules/gpu_split.py``)."""

from __future__ import annotations

from ansible_collections.proxgpu.pve.plugins.plugin_utils.action import ProxgpuAction


class ActionModule(ProxgpuAction):
    """Plan the split (check mode) or apply it, and say whether the host must reboot."""

    module = "gpu_split"
