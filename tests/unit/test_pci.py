"""PCI addresses (proxgpu.pci): every form a user types reads as one canonical address."""

from __future__ import annotations

import pytest

from proxgpu.pci import normalize_pci_address


@pytest.mark.parametrize(
    ("value", "normal"),
    [("81:00.0", "0000:81:00.0"), ("0000:E1:00", "0000:e1:00"), (" 1234:f0:43.7 ", "1234:f0:43.7")],
)
def test_normalize_pci_address(value: str, normal: str) -> None:
    assert normalize_pci_address(value) == normal
