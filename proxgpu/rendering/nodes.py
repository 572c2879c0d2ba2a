"""A systemd unit that makes the containers' NVIDIA device nodes exist before the guests start.

The nvidia kernel module creates no ``/dev/nvidia*`` node; user space does (``nvidia-modprobe``,
run by nvidia-smi or CUDA). After a reboot nothing may have run yet when Proxmox starts its
guests, and Proxmox refuses to start a container whose ``devN`` node is missing. So the unit runs
``nvidia-modprobe`` for each node, and a drop-in for ``pve-guests.service`` pulls it in and
orders the guests after it. Both are plain files, so the journal and rollback cover them.

>>> modprobe_commands(["/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-modeset"])
['-c 255', '-c 2', '-u -c 0', '-m']
"""

from __future__ import annotations

import re

from proxgpu.rendering.context import RenderContext
from proxgpu.rendering.templating import render_template

NODES_UNIT_NAME = "proxgpu-nvidia-nodes.service"
NODES_UNIT = f"/etc/systemd/system/{NODES_UNIT_NAME}"
GUESTS_DROPIN = "/etc/systemd/system/pve-guests.service.d/proxgpu-nvidia-nodes.conf"
NVIDIA_MODPROBE = "/usr/bin/nvidia-modprobe"

# nvidia-modprobe's way to each node: -c N makes /dev/nvidiaN (N 255 is /dev/nvidiactl), -u -c 0
# loads nvidia-uvm and makes /dev/nvidia-uvm and /dev/nvidia-uvm-tools, -m loads nvidia-modeset
# and makes /dev/nvidia-modeset.
_FIXED = {
    "/dev/nvidiactl": "-c 255",
    "/dev/nvidia-uvm": "-u -c 0",
    "/dev/nvidia-uvm-tools": "-u -c 0",
    "/dev/nvidia-modeset": "-m",
}


def modprobe_commands(paths: list[str]) -> list[str]:
    """The ``nvidia-modprobe`` arguments that create ``paths``, one command each, control node
    first, each once. Nodes it cannot make (the MIG capability nodes) are left out."""
    commands = [_FIXED["/dev/nvidiactl"]] if "/dev/nvidiactl" in paths else []
    minors = sorted(int(m[1]) for p in paths if (m := re.fullmatch(r"/dev/nvidia(\d+)", p)))
    commands += [f"-c {minor}" for minor in minors]
    for path, arguments in _FIXED.items():
        if path in paths and arguments not in commands:
            commands.append(arguments)
    return commands


def render_nodes_unit(ctx: RenderContext, paths: list[str]) -> None:
    """The unit and its ``pve-guests.service`` drop-in for the nvidia nodes in ``paths``; with
    none, neither (a unit proxgpu wrote earlier goes)."""
    commands = modprobe_commands(paths)
    unit = dropin = None
    if commands:
        unit = render_template(
            "nvidia-nodes.service.j2",
            commands=commands,
            nvidia_modprobe=NVIDIA_MODPROBE,
            dropin=GUESTS_DROPIN,
        )
        dropin = render_template("pve-guests-nvidia-nodes.conf.j2", unit=NODES_UNIT_NAME)
    ctx.file(NODES_UNIT, unit, "make the container's NVIDIA device nodes at boot")
    ctx.file(GUESTS_DROPIN, dropin, "start the guests after those nodes exist")
