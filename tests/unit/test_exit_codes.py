"""The exit-code table of docs/exit-codes.md is the error classes' own ``exit_code``: the two
cannot drift."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from proxgpu import errors

TABLE = Path(__file__).resolve().parents[2] / "docs" / "exit-codes.md"
ROW = re.compile(r"^\| (\d+) \| [^|]+ \|([^|]*)\|$")


def documented_codes() -> dict[str, int]:
    """Error class name -> the exit code the table gives it."""
    codes: dict[str, int] = {}
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            for name in re.findall(r"`(\w+)`", match[2]):
                assert name not in codes, f"{name} is in the exit-code table twice"
                codes[name] = int(match[1])
    return codes


def error_classes() -> dict[str, type[errors.ProxgpuError]]:
    return {
        name: cls
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.ProxgpuError) and cls.__module__ == errors.__name__
    }


def test_every_error_class_is_in_the_table_with_its_own_exit_code() -> None:
    documented = documented_codes()
    classes = error_classes()
    assert set(documented) == set(classes), f"{TABLE.name}'s table and proxgpu.errors differ"
    for name, cls in classes.items():
        assert cls.exit_code == documented[name], f"{name}: {TABLE.name} says {documented[name]}"


def test_help_and_the_man_page_list_the_codes_the_table_lists() -> None:
    from proxgpu.cli.manual import EXIT_CODES  # noqa: PLC0415 - the thing under comparison

    table = re.compile(r"^\| (\d+) \|", re.MULTILINE)
    listed = [int(c) for c in table.findall(TABLE.read_text(encoding="utf-8"))]
    assert [code for code, _, _ in EXIT_CODES] == listed
    assert {cls.exit_code for cls in error_classes().values()} <= set(listed)


def test_help_ends_with_the_exit_codes_and_names_the_man_page(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from proxgpu.cli import main  # noqa: PLC0415 - the command line, as its users run it

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    tail = out[out.index("exit status:") :]
    for code in (0, 2, 5, 9, 17, 141):
        assert re.search(rf"(^|\s){code}  \S", tail, re.MULTILINE), code
    assert out.rstrip().endswith("man proxgpu")
    assert max(len(line) for line in out.splitlines()) <= 100
