"""The one action plugin behind every module of the collection: proxgpu runs on the controller
and reaches the host through the task's connection (:mod:`.host`); what each module does is in
:mod:`.tasks`, by name.

proxgpu is imported when a task runs, not when Ansible loads the plugin: a controller without it
gets a failed task that says so, not a plugin that silently falls back to running the module's
documentation stub on the host.
"""

from __future__ import annotations

import sys
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display


class ProxgpuAction(ActionBase):  # type: ignore[misc]  # ansible-core ships no type hints
    """Runs the module :attr:`module` of :data:`.tasks.MODULES` against the task's host."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False
    #: The module's name in :data:`.tasks.MODULES`.
    module = ""

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> Any:
        """The task's result: the module's, or ``failed``/``unreachable`` with ``msg``."""
        result = super().run(tmp, task_vars)
        try:
            from ansible_collections.proxgpu.pve.plugins.plugin_utils import (  # noqa: PLC0415
                host,
                tasks,
            )

            from proxgpu.ansible import results  # noqa: PLC0415
            from proxgpu.errors import HostUnreachableError, ProxgpuError  # noqa: PLC0415
        except ImportError as exc:
            msg = (
                f"proxgpu is not installed for the Python running Ansible ({sys.executable}): "
                f"pip install proxgpu there; the managed hosts need nothing ({exc})"
            )
            return {**result, "failed": True, "msg": msg}
        arguments, work = tasks.MODULES[self.module]
        params = self.validate_argument_spec(argument_spec=arguments)[1]
        name = str((task_vars or {}).get("inventory_hostname", "host"))
        mode = tasks.Mode(check=bool(self._task.check_mode), diff=bool(self._task.diff))
        try:
            with host.action_host(self, name, params["root"]) as target:
                done, warnings = work(target, params, mode)
        except HostUnreachableError as exc:
            return {**result, "unreachable": True, **results.failure(exc)}
        except ProxgpuError as exc:
            return {**result, "failed": True, **results.failure(exc)}
        for warning in warnings:
            Display().warning(f"{name}: {warning}")
        return {**result, **done}
