"""The host scripts' answer format and arguments (proxgpu.host.scripts), with no script run.

Running the scripts, and the prelude's ``rec`` that writes the records, is in
``tests/local/test_scripts.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxgpu.host.scripts import ScriptArgs, ScriptOutput, ScriptRecord, parse_records


def test_records_are_the_lines_that_start_with_a_hash() -> None:
    text = "#uid\t0\nplain output\n  #indented\n#file\t0\tfile\tab12\t644\n\n#end\n"
    assert parse_records(text) == [
        ScriptRecord("uid", ("0",)),
        ScriptRecord("file", ("0", "file", "ab12", "644")),
        ScriptRecord("end", ()),
    ]


def test_fields_are_split_on_tabs_only_and_may_be_empty() -> None:
    [record] = parse_records("#file\ta b\t\t#x\\t\t\n")
    assert record.kind == "file"
    assert record.fields == ("a b", "", "#x\\t", "")
    assert (record[0], record[2]) == ("a b", "#x\\t")


def test_carriage_returns_and_other_line_breaks_end_a_record() -> None:
    assert parse_records("#a\t1\r\n#b\t2") == [ScriptRecord("a", ("1",)), ScriptRecord("b", ("2",))]
    assert parse_records("") == []


def output(text: str, returncode: int = 0) -> ScriptOutput:
    return ScriptOutput(parse_records(text), returncode, text.encode(), "")


def test_records_are_found_by_kind_in_order() -> None:
    answer = output("#file\t0\n#uid\t0\n#file\t1\n#end\n")
    assert [r[0] for r in answer.of("file")] == ["0", "1"]
    assert answer.first("file") == ScriptRecord("file", ("0",))
    assert answer.first("lock") is None
    assert answer.has("uid") and not answer.has("lock")


@dataclass(frozen=True)
class Item(ScriptArgs):
    path: str
    mode: int | None
    owner: str | None
    size: int


def test_script_args_are_the_fields_in_order_with_none_as_a_dash() -> None:
    assert Item("/etc/x", 0o644, None, 0).argv() == ["/etc/x", "420", "-", "0"]
    assert Item("", None, "0:0", 12).argv() == ["", "-", "0:0", "12"]
