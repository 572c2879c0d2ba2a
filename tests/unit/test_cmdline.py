"""Kernel command-line edits (proxgpu.rendering.cmdline) that touch only what they must."""

from __future__ import annotations

import pytest

from proxgpu.rendering.cmdline import grub_with_parameters


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ('GRUB_CMDLINE_LINUX_DEFAULT="quiet"', 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"'),
        (
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n\nX=1\n',
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"\n\nX=1\n',
        ),
        (
            "GRUB_CMDLINE_LINUX_DEFAULT='a b' # keep\n",
            "GRUB_CMDLINE_LINUX_DEFAULT='a b iommu=pt' # keep\n",
        ),
        (
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"\n',
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"\n',
        ),
        ("A=1\n", 'A=1\nGRUB_CMDLINE_LINUX_DEFAULT="iommu=pt"\n'),
    ],
)
def test_grub_edit_changes_only_the_default_cmdline_value(before: str, after: str) -> None:
    assert grub_with_parameters(before, ["iommu=pt"]) == after
