"""proxgpu's two kinds of record, and the one way to print either as JSON data.

The rule: a record proxgpu validates from outside input (a policy, a saved plan, a journal
entry, the cluster's member list) is a :class:`FrozenModel`, with everything it holds; every
other record (the inventory, results, options) is a frozen dataclass. :func:`plain` dumps both.

>>> from dataclasses import dataclass
>>> class Point(FrozenModel):
...     x: int
>>> @dataclass(frozen=True)
... class Seen:
...     where: Point
...     notes: tuple[str, ...] = ()
>>> Point.model_validate({"x": "1"}).model_dump()
{'x': 1}
>>> plain(Seen(Point(x=1), ("near",)))
{'where': {'x': 1}, 'notes': ['near']}
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict


class FrozenModel(BaseModel):
    """The base of proxgpu's data: immutable, and strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def plain(record: object) -> Any:
    """``record`` as JSON data: a model as pydantic dumps it in JSON mode, a dataclass field by
    field in order, lists, tuples and dicts item by item, anything else as it is."""
    if isinstance(record, BaseModel):
        return record.model_dump(mode="json")
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: plain(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, list | tuple):
        return [plain(item) for item in record]
    if isinstance(record, dict):
        return {key: plain(item) for key, item in record.items()}
    return record
