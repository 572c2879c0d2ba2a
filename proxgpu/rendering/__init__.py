"""Rendering: turn a plan into the exact files a Proxmox VE host needs, as a change set.

Pure: the inventory carries every file's current text, so rendering reads nothing and writes
nothing. Whole files proxgpu owns come from the Jinja2 templates in ``templates/``; guest configs
are edited entry by entry (:mod:`proxgpu.pve.config`), so every unrelated byte stays as it was.
Rendering against files that already hold the result yields no change.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> from proxgpu.planning import SplitPolicy, plan_split
>>> inventory = inspect(DirectoryHost("examples/hosts/ct200"))
>>> plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
>>> render(inventory, plan).summary()
'10 files to change; then: update-initramfs -u -k all; proxmox-boot-tool refresh; systemctl \
daemon-reload; reboot required.'
"""

from __future__ import annotations

from proxgpu.errors import RenderError
from proxgpu.inspection.inventory import Inventory
from proxgpu.paths import GuestKind, guest_config
from proxgpu.planning.model import Plan, PlanGroup
from proxgpu.rendering.actions import with_actions
from proxgpu.rendering.binding import render_binding
from proxgpu.rendering.changes import ChangeSet
from proxgpu.rendering.cmdline import render_kernel_cmdline
from proxgpu.rendering.conflicts import refuse_conflicting_binding
from proxgpu.rendering.context import RenderContext, RenderOptions
from proxgpu.rendering.lxc import render_lxc
from proxgpu.rendering.vm import render_mapping, render_vgpu, render_vm


def render(inventory: Inventory, plan: Plan, options: RenderOptions | None = None) -> ChangeSet:
    """Every file change and follow-up action ``plan`` needs on the inspected host.

    :raises RenderError: when a target guest has no config or a GPU's device node is unknown.
    """
    ctx = RenderContext(inventory, plan, options or RenderOptions())
    refuse_conflicting_binding(ctx)
    render_binding(ctx)
    render_kernel_cmdline(ctx)
    # The mapping first: Proxmox refuses a VM config naming a mapping that does not exist yet.
    render_mapping(ctx, plan.groups)
    for group in plan.groups:
        for guest in group.guests:
            _render_guest(ctx, group, guest.type, guest.vmid)
        for use in group.vgpus:
            if use.added:
                render_vgpu(ctx, group, use, guest_config("vm", use.vmid))
    return with_actions(ctx)


def _render_guest(ctx: RenderContext, group: PlanGroup, kind: GuestKind, vmid: int) -> None:
    path = guest_config(kind, vmid)
    try:
        if kind == "lxc":
            render_lxc(ctx, group, path, vmid)
        else:
            render_vm(ctx, group, path, vmid)
    except ValueError as exc:
        # An entry Proxmox itself would reject (a malformed devN or hostpciN value).
        raise RenderError(ctx.inventory.source, path, str(exc)) from exc


__all__ = ["RenderOptions", "render"]
