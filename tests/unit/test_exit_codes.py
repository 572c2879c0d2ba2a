"""README's exit-code table is the error classes' own ``exit_code``: the two cannot drift."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from proxgpu import errors

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| (\d+) \| [^|]+ \|([^|]*)\|$")


def readme_codes() -> dict[str, int]:
    """Error class name -> the exit code README's table gives it."""
    codes: dict[str, int] = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            for name in re.findall(r"`(\w+)`", match[2]):
                assert name not in codes, f"{name} is in README's exit-code table twice"
                codes[name] = int(match[1])
    return codes


def error_classes() -> dict[str, type[errors.ProxgpuError]]:
    return {
        name: cls
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.ProxgpuError) and cls.__module__ == errors.__name__
    }


def test_every_error_class_is_in_the_table_with_its_own_exit_code() -> None:
    documented = readme_codes()
    classes = error_classes()
    assert set(documented) == set(classes), "README's table and proxgpu.errors differ"
    for name, cls in classes.items():
        assert cls.exit_code == documented[name], f"{name}: README says {documented[name]}"
