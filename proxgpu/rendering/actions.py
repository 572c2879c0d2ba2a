"""The follow-up actions a change set needs (initramfs, boot loader) and whether to reboot."""

from __future__ import annotations

from proxgpu.paths import (
    BIND_SCRIPT,
    DRIVERCTL_DIR,
    GRUB_DEFAULT,
    INITRAMFS_HOOK,
    KERNEL_CMDLINE,
    MODPROBE_CONF,
    MODULES_LOAD,
    guest_of,
)
from proxgpu.rendering.changes import Action, ChangeSet
from proxgpu.rendering.context import RenderContext, containers_named
from proxgpu.rendering.nodes import (
    GUESTS_DROPIN,
    HA_DROPIN,
    NODES_SCRIPT,
    NODES_UNIT,
    NODES_UNIT_NAME,
)


def with_actions(ctx: RenderContext) -> ChangeSet:
    changed = {f.path for f in ctx.files if f.changed}
    initramfs = bool(changed & {MODPROBE_CONF, BIND_SCRIPT, INITRAMFS_HOOK})
    cmdline = bool(changed & {KERNEL_CMDLINE, GRUB_DEFAULT})
    boot = (
        initramfs
        or cmdline
        or any(p == MODULES_LOAD or p.startswith(DRIVERCTL_DIR) for p in changed)
    )
    actions = []
    if initramfs:
        actions.append(
            Action(
                argv=["update-initramfs", "-u", "-k", "all"],
                why="the initramfs must carry the new binding",
            )
        )
    # proxmox-boot-tool keeps the boot files on every ESP, for systemd-boot and GRUB alike.
    boot_tool = ctx.inventory.boot_loader == "systemd-boot" or (
        "/etc/kernel/proxmox-boot-uuids" in ctx.inventory.host_files
    )
    if boot_tool and (initramfs or cmdline):
        actions.append(
            Action(
                argv=["proxmox-boot-tool", "refresh"],
                why="copy kernel command line and initramfs to the ESPs",
            )
        )
    elif GRUB_DEFAULT in changed:
        actions.append(Action(argv=["update-grub"], why="regenerate grub.cfg"))
    if changed & {NODES_UNIT, GUESTS_DROPIN, HA_DROPIN}:
        actions.append(
            Action(argv=["systemctl", "daemon-reload"], why="let systemd read the changed units")
        )
    # Without a reboot to run it, the unit runs now, so that a changed container starts with its
    # nodes (and, without devN entries, their cgroup rules) in place.
    unit = next((f for f in ctx.files if f.path == NODES_UNIT), None)
    if not boot and unit and unit.after is not None and changed & {NODES_UNIT, NODES_SCRIPT}:
        actions.append(
            Action(
                argv=["systemctl", "restart", NODES_UNIT_NAME],
                why=f"make the NVIDIA device nodes of {containers_named(ctx)} now",
            )
        )
    guests = sorted(p for p in changed if guest_of(p) is not None)
    if guests:
        ctx.warnings.append(
            "restart the changed guests to apply their new config: " + ", ".join(guests)
        )
    return ChangeSet(
        host=ctx.inventory.source,
        files=ctx.files,
        actions=actions,
        reboot_required=boot,
        # Each container (and the boot unit serving them) asks the same questions of the host:
        # a fact is said once.
        warnings=list(dict.fromkeys(ctx.warnings)),
        notes=list(dict.fromkeys(ctx.notes)),
    )
