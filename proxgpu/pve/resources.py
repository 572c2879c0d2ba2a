"""What a guest config says about the resources a guest takes: memory, hotplug.

>>> config = GuestConfig.parse("memory: current=4096,max=65536\\nhotplug: disk,memory\\n")
>>> memory_mib(config), hotplugs_memory(config)
(4096, True)
"""

from __future__ import annotations

import re

from proxgpu.pve.config import GuestConfig, parse_property_string

#: qemu-server's and pve-container's ``memory`` default in MiB, when the config names none.
DEFAULT_MEMORY_MIB = 512


def memory_mib(config: GuestConfig) -> int | None:
    """``memory:`` in MiB (a VM's ``current`` when it is a property string); ``None`` when the
    value is not one Proxmox would take.

    >>> memory_mib(GuestConfig.parse("cores: 2\\n")), memory_mib(GuestConfig.parse("memory: x\\n"))
    (512, None)
    """
    value = config.get("memory")
    if value is None:
        return DEFAULT_MEMORY_MIB
    try:
        current = parse_property_string(value, "current").get("current", str(DEFAULT_MEMORY_MIB))
    except ValueError:
        return None
    return int(current) if current.isdigit() else None


def hotplugs_memory(config: GuestConfig) -> bool:
    """Whether a VM's ``hotplug:`` holds ``memory`` (``1`` is Proxmox's default, without it).

    >>> hotplugs_memory(GuestConfig.parse("hotplug: 1\\n"))
    False
    """
    value = (config.get("hotplug") or "").strip()
    return value not in ("", "0", "1") and "memory" in re.split(r"[,;\s]+", value)
