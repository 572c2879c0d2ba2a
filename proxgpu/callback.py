"""Callbacks a script hands proxgpu (``progress``, a fleet's ``work``), checked where they are
handed over: a callback of the wrong shape is a ``TypeError`` at that call, naming the shape
wanted, rather than one raised deep inside a step, halfway through a change.

>>> require_callable(lambda step, message: None, "progress", "progress(step, message)", 2)
>>> require_callable(lambda message: None, "progress", "progress(step, message)", 2)
Traceback (most recent call last):
...
TypeError: progress must be callable as progress(step, message); <lambda>(message) is not: \
too many positional arguments
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def require_callable(callback: Callable[..., Any], name: str, shape: str, arguments: int) -> None:
    """Refuse ``callback`` unless it can be called with ``arguments`` positional arguments, as
    ``shape`` shows the call. A callable whose signature Python cannot read (a builtin) passes.

    :raises TypeError: naming ``name``, ``shape`` and why not.
    """
    if not callable(callback):
        raise TypeError(f"{name} must be callable as {shape}; got {type(callback).__name__}")
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(arguments))
    except TypeError as why:
        title = getattr(callback, "__name__", type(callback).__name__)
        raise TypeError(
            f"{name} must be callable as {shape}; {title}{signature} is not: {why}"
        ) from None
