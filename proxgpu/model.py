"""The base of the pydantic models proxgpu passes between its stages (plans, changes, journal
entries); the inventory's records are plain frozen dataclasses.

>>> class Point(FrozenModel):
...     x: int
>>> Point(x=1).model_dump()
{'x': 1}
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class FrozenModel(BaseModel):
    """The base of proxgpu's data: immutable, and strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")
