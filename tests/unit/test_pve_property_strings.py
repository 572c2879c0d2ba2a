"""Proxmox property strings (``key=value,...`` with a default key) and hostpci values, read and
written as pve-common does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxgpu.pve.config import (
    format_property_string,
    parse_property_string,
)


@pytest.mark.parametrize(
    ("text", "default_key", "expected"),
    [
        (
            "host=0000:81:00,pcie=1,x-vga=1",
            "host",
            {"host": "0000:81:00", "pcie": "1", "x-vga": "1"},
        ),
        ("0000:81:00.0,pcie=1", "host", {"host": "0000:81:00.0", "pcie": "1"}),
        ("pcie=1,0000:81:00.0", "host", {"pcie": "1", "host": "0000:81:00.0"}),
        ("/dev/nvidia0,gid=44", "path", {"path": "/dev/nvidia0", "gid": "44"}),
        (
            "cpus=0-3;8-11,hostnodes=0,policy=bind",
            None,
            {"cpus": "0-3;8-11", "hostnodes": "0", "policy": "bind"},
        ),
        ("mapping=gpu-node1,pcie=1,", "host", {"mapping": "gpu-node1", "pcie": "1"}),
        ("args=a=b", None, {"args": "a=b"}),
    ],
)
def test_parse_property_string(
    text: str, default_key: str | None, expected: dict[str, str]
) -> None:
    props = parse_property_string(text, default_key)
    assert props == expected
    assert list(props) == list(expected)


@pytest.mark.parametrize(
    ("text", "default_key"),
    [
        ("0000:81:00.0,pcie=1", None),
        ("pcie=1,pcie=0", None),
        ("81:00,host=82:00", "host"),
        ("pcie=", None),
        ("=1", None),
    ],
)
def test_parse_property_string_rejects_what_pve_rejects(text: str, default_key: str | None) -> None:
    with pytest.raises(ValueError):
        parse_property_string(text, default_key)


def test_format_property_string_writes_default_key_first_and_bare() -> None:
    props = {"pcie": "1", "host": "0000:81:00"}
    assert format_property_string(props, default_key="host") == "0000:81:00,pcie=1"
    assert format_property_string(props) == "pcie=1,host=0000:81:00"
    assert format_property_string({"path": "/dev/a=b"}, default_key="path") == "path=/dev/a=b"


@pytest.mark.parametrize("props", [{"a": "x,y"}, {"a=b": "1"}, {"": "1"}, {"a": ""}, {"a": " "}])
def test_format_property_string_rejects_unreadable_items(props: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        format_property_string(props)


PROP_KEYS = st.from_regex(r"[a-z][a-z0-9\-]{0,8}", fullmatch=True)
PROP_VALUES = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters=","), min_size=1, max_size=10
).filter(str.strip)


@given(st.dictionaries(PROP_KEYS, PROP_VALUES, max_size=6), st.sampled_from([None, "host", "a"]))
def test_property_strings_round_trip(props: dict[str, str], default_key: str | None) -> None:
    text = format_property_string(props, default_key)
    assert parse_property_string(text, default_key) == props
