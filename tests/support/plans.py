"""Refused plans: the error the planner raises, and the codes of its problems."""

from __future__ import annotations

import pytest

from proxgpu.errors import PlanRefusedError
from proxgpu.inspection.inventory import Inventory
from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy


def refusal(inventory: Inventory, policy: SplitPolicy | None = None) -> PlanRefusedError:
    """The error ``plan_split`` refuses with (the test fails if it plans instead)."""
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(inventory, policy)
    return caught.value


def codes(error: PlanRefusedError) -> list[str]:
    """The code of each problem, in order."""
    return [problem.code for problem in error.problems]
