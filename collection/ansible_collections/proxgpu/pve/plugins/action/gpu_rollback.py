"""Action plugin ``proxgpu.pve.gpu_rollback`` (documentation:
``plugins/modules/gpu_rollback.py``)."""

from __future__ import annotations

from ansible_collections.proxgpu.pve.plugins.plugin_utils.action import ProxgpuAction


class ActionModule(ProxgpuAction):
    """Roll back the last apply (check mode: say what would be restored)."""

    module = "gpu_rollback"
