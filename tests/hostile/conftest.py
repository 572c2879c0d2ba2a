"""What the hostile cases share: each case's scratch folder, checked afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hostile_scratch import Scratch, make_scratch


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Scratch]:
    """The case's scratch folder; afterwards, proof that nothing outside it changed."""
    made = make_scratch(tmp_path)
    yield made
    made.assert_untouched()
