"""The base of proxgpu's plain records: frozen dataclasses that answer pydantic's model methods.

An inspection's inventory is built for every command that reads a host, often for many hosts
in one process, and printed as JSON without ever being read back. A frozen dataclass does that
without importing pydantic or building its validators (about two thirds of an offline
``inspect``'s own CPU): :meth:`Record.model_dump` and :meth:`Record.model_copy` are plain Python.
Validating data from outside (:meth:`Record.model_validate`, ``model_validate_json``,
``model_json_schema``) loads pydantic on first use, which checks every field's type and refuses
unknown fields, as for a model. A subclass is declared
``@dataclass(frozen=True, kw_only=True)``: immutable, keyword-only, and mypy checks each
field's type where one is built.

>>> from dataclasses import dataclass, field
>>> @dataclass(frozen=True, kw_only=True)
... class Point(Record):
...     x: int
...     tags: list[str] = field(default_factory=list)
>>> Point(x=1).model_dump()
{'x': 1, 'tags': []}
>>> Point(x=1).model_copy(update={"x": 2})
Point(x=2, tags=[])
>>> Point.model_validate({"x": "3"})
Point(x=3, tags=[])
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any, ClassVar, Self

if TYPE_CHECKING:
    from pydantic import TypeAdapter


class Record:
    """What a frozen dataclass record shares with a pydantic model: dumping, copying with
    changes and (loading pydantic then) validating. Unknown fields are refused in both."""

    # Read by pydantic when it validates a record: unknown fields are an error, as for a model.
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]:
        """The fields as a dict, nested records as dicts and lists copied; ``mode="json"`` gives
        the same, since every field of a record is JSON data already."""
        del mode  # Both modes agree for JSON data: the argument is pydantic's spelling.
        return _plain_fields(self)

    def model_dump_json(self, *, indent: int | None = None) -> str:
        """The fields as JSON text, as pydantic writes it (no spaces unless indented, non-ASCII
        kept as it is).

        >>> from proxgpu.inspection.inventory import NumaNode
        >>> NumaNode(id=0, cpus="0-3").model_dump_json()
        '{"id":0,"cpus":"0-3","memory_kib":null}'
        """
        separators = (",", ":") if indent is None else (",", ": ")
        return json.dumps(
            self.model_dump(), indent=indent, separators=separators, ensure_ascii=False
        )

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Self:
        """A copy with the fields in ``update`` replaced (not validated, as pydantic's)."""
        return dataclasses.replace(self, **(update or {}))  # type: ignore[type-var]

    @classmethod
    def model_validate(cls, obj: Any) -> Self:
        """A record from ``obj`` (a dict, or a record), every field's type checked.

        :raises pydantic.ValidationError: when a field is missing, unknown or of a wrong type.
        """
        result: Self = _adapter(cls).validate_python(obj)
        return result

    @classmethod
    def model_validate_json(cls, data: str | bytes) -> Self:
        """A record from JSON text, every field's type checked (see :meth:`model_validate`)."""
        result: Self = _adapter(cls).validate_json(data)
        return result

    @classmethod
    def model_json_schema(cls) -> dict[str, Any]:
        """The JSON schema of the record's documents.

        >>> from proxgpu.inspection.inventory import NumaNode
        >>> sorted(NumaNode.model_json_schema()["properties"])
        ['cpus', 'id', 'memory_kib']
        """
        schema: dict[str, Any] = _adapter(cls).json_schema()
        return schema


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return _plain_fields(value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _plain_fields(record: Record) -> dict[str, Any]:
    return {name: _plain(getattr(record, name)) for name in _field_names(type(record))}


#: Each record class's field names, in order, looked up once per class.
_FIELD_NAMES: dict[type[Record], tuple[str, ...]] = {}
#: Each record class's pydantic validator, built for the first record of it validated.
_ADAPTERS: dict[type[Record], TypeAdapter[Any]] = {}


def _field_names(cls: type[Record]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields)
    return names


def _adapter(cls: type[Record]) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = import_module("pydantic").TypeAdapter(cls)
    return adapter
