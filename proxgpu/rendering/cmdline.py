"""The kernel command line of the boot loader in use: ``/etc/kernel/cmdline`` or
``/etc/default/grub``, edited so that every other parameter, quote and comment stays."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from proxgpu.errors import RenderError
from proxgpu.paths import GRUB_DEFAULT, KERNEL_CMDLINE
from proxgpu.rendering.context import RenderContext


def iommu_parameters(ctx: RenderContext) -> list[str]:
    if ctx.inventory.cpu_vendor == "AuthenticAMD":
        ctx.warnings.append(
            "AMD IOMMU is on by default in the kernel: if it stays off after the reboot, "
            "enable IOMMU/SVM in the firmware setup"
        )
        return ["iommu=pt"]
    return ["intel_iommu=on", "iommu=pt"]


def _with_parameters(cmdline: str, parameters: Iterable[str], remove: Iterable[str] = ()) -> str:
    gone = set(remove)
    words = [w for w in cmdline.split() if w not in gone]
    missing = [p for p in parameters if p not in words]
    return " ".join([*words, *missing])


def render_kernel_cmdline(ctx: RenderContext) -> None:
    if ctx.inventory.iommu_enabled or not ctx.plan.enable_iommu:
        return
    parameters = iommu_parameters(ctx)
    if ctx.inventory.boot_loader == "systemd-boot":
        current = ctx.inventory.host_files.get(KERNEL_CMDLINE)
        if current is None:
            ctx.warnings.append(f"{KERNEL_CMDLINE} is missing: it was built from /proc/cmdline")
            current = " ".join(
                w
                for w in (ctx.inventory.kernel_cmdline or "").split()
                if not w.startswith(("initrd=", "BOOT_IMAGE="))
            )
        after = _with_parameters(current.strip(), parameters) + "\n"
        ctx.file(KERNEL_CMDLINE, after, "turn the IOMMU on")
        return
    grub = ctx.inventory.host_files.get(GRUB_DEFAULT)
    if grub is None:
        raise RenderError(
            ctx.inventory.source,
            GRUB_DEFAULT,
            "missing, cannot turn the IOMMU on",
            f"add {' '.join(parameters)} to the boot loader's kernel command line by hand",
        )
    ctx.file(GRUB_DEFAULT, grub_with_parameters(grub, parameters), "turn the IOMMU on")
    for path, text in sorted(ctx.inventory.host_files.items()):
        if path.startswith("/etc/default/grub.d/") and _GRUB_DEFAULT_LINE.search(text):
            ctx.warnings.append(
                f"{path} sets GRUB_CMDLINE_LINUX_DEFAULT after {GRUB_DEFAULT}: add "
                f"{' '.join(parameters)} there too, or its value wins"
            )


_GRUB_DEFAULT_LINE = re.compile(
    r"^(?P<head>[ \t]*GRUB_CMDLINE_LINUX_DEFAULT=)"
    r"""(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>\S*))"""
    r"(?P<tail>[ \t]*(?:#.*)?)$",
    re.MULTILINE,
)


def grub_with_parameters(text: str, parameters: Sequence[str], remove: Sequence[str] = ()) -> str:
    """``/etc/default/grub`` with ``parameters`` added to GRUB_CMDLINE_LINUX_DEFAULT (and the
    words in ``remove`` taken out of it, as a rollback does).

    Only that value changes: its quotes, a trailing comment and every other line stay.

    >>> grub_with_parameters('A=1\\nGRUB_CMDLINE_LINUX_DEFAULT="quiet" # x\\n', ["iommu=pt"])
    'A=1\\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt" # x\\n'
    """
    matches = list(_GRUB_DEFAULT_LINE.finditer(text))
    if not matches and not parameters:
        return text
    if not matches:
        line = f'GRUB_CMDLINE_LINUX_DEFAULT="{" ".join(parameters)}"\n'
        return text + ("" if text.endswith("\n") or not text else "\n") + line
    match = matches[-1]  # the shell reads the file top to bottom: the last assignment wins
    quote = "'" if match["sq"] is not None else '"'
    old = next(v for v in (match["dq"], match["sq"], match["bare"]) if v is not None)
    value = _with_parameters(old, parameters, remove)
    line = f"{match['head']}{quote}{value}{quote}{match['tail']}"
    return text[: match.start()] + line + text[match.end() :]
