"""Tests for proxgpu.pve.mapping: the cluster-wide PCI mapping file, edited one id at a time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxgpu.pve.config import parse_property_string
from proxgpu.pve.mapping import PciMappingConfig

MAPPING = """\
# written by hand
gpu-node0
\tmap id=10de:2330,iommugroup=12,node=pve1,path=0000:41:00.0,subsystem-id=10de:16c1
\tmap id=10de:2330,iommugroup=13,node=pve1,path=0000:51:00.0,subsystem-id=10de:16c1
\tdescription node 0 GPUs

nic
\tmap id=8086:1572,node=pve1,path=0000:01:00
"""


def test_mapping_reads_ids_and_repeated_maps() -> None:
    cfg = PciMappingConfig.parse(MAPPING)
    assert cfg.ids() == ["gpu-node0", "nic"]
    assert [k for k, _ in cfg.entries("gpu-node0")] == ["map", "map", "description"]
    assert cfg.entries("gpu-node0")[2] == ("description", "node 0 GPUs")
    props = parse_property_string(cfg.entries("nic")[0][1])
    assert props["path"] == "0000:01:00"
    with pytest.raises(KeyError):
        cfg.entries("missing")


def test_mapping_replace_keeps_other_ids_identical() -> None:
    cfg = PciMappingConfig.parse(MAPPING)
    cfg.set_entries("gpu-node0", [("map", "id=10de:2330,node=pve1,path=0000:41:00.0")])
    assert cfg.render() == (
        "# written by hand\ngpu-node0\n\tmap id=10de:2330,node=pve1,path=0000:41:00.0\n\n"
        "nic\n\tmap id=8086:1572,node=pve1,path=0000:01:00\n"
    )


def test_mapping_add_appends_after_a_blank_line() -> None:
    cfg = PciMappingConfig.parse(MAPPING)
    cfg.set_entries("gpu-node1", [("map", "path=0000:c1:00.0"), ("map", "path=0000:d1:00.0")])
    assert (
        cfg.render() == MAPPING + "\ngpu-node1\n\tmap path=0000:c1:00.0\n\tmap path=0000:d1:00.0\n"
    )
    assert cfg.ids() == ["gpu-node0", "nic", "gpu-node1"]


def test_mapping_add_to_empty_and_unterminated_files() -> None:
    empty = PciMappingConfig.parse("")
    empty.set_entries("gpu0", [("map", "path=0000:c1:00.0")])
    assert empty.render() == "gpu0\n\tmap path=0000:c1:00.0\n"
    unterminated = PciMappingConfig.parse("a1\n\tmap path=0000:01:00.0")
    unterminated.set_entries("b1", [])
    assert unterminated.render() == "a1\n\tmap path=0000:01:00.0\n\nb1"


def test_mapping_remove_takes_its_separator_with_it() -> None:
    cfg = PciMappingConfig.parse(MAPPING)
    assert cfg.remove("gpu-node0")
    assert cfg.render() == "# written by hand\nnic\n\tmap id=8086:1572,node=pve1,path=0000:01:00\n"
    last = PciMappingConfig.parse(MAPPING)
    assert last.remove("nic")
    assert last.render() == MAPPING.split("\nnic\n", maxsplit=1)[0]
    assert not last.remove("nic")


def test_mapping_skips_blocks_without_a_valid_id() -> None:
    cfg = PciMappingConfig.parse("not an id\n\tmap path=x\n\n# c\nok1\n\t# note\n\tmap path=y\n")
    assert cfg.ids() == ["ok1"]
    assert cfg.entries("ok1") == [("map", "path=y")]


@pytest.mark.parametrize(
    ("mapping_id", "entries"),
    [("1gpu", []), ("gpu 0", []), ("gpu0", [("Map", "x")]), ("gpu0", [("map", "x\ny")])],
)
def test_mapping_rejects_unwritable_entries(
    mapping_id: str, entries: list[tuple[str, str]]
) -> None:
    with pytest.raises(ValueError):
        PciMappingConfig.parse(MAPPING).set_entries(mapping_id, entries)


MAPPING_IDS = st.sampled_from(["gpu0", "gpu1", "nic", "someGpu"])


@st.composite
def mapping_files(draw: st.DrawFn) -> str:
    blocks = []
    for mapping_id in draw(st.lists(MAPPING_IDS, unique=True, max_size=4)):
        paths = draw(st.lists(st.from_regex(r"0000:[0-9a-f]{2}:00\.0", fullmatch=True), max_size=3))
        blocks.append("".join([f"{mapping_id}\n", *(f"\tmap path={p}\n" for p in paths)]))
    text = "\n".join(blocks)
    return text if draw(st.booleans()) else text.removesuffix("\n")


@given(mapping_files(), MAPPING_IDS, st.lists(st.sampled_from(["path=0000:81:00.0", "id=1:2"])))
def test_mapping_edit_leaves_other_ids_identical(
    text: str, mapping_id: str, maps: list[str]
) -> None:
    before = PciMappingConfig.parse(text)
    others = {i: before.entries(i) for i in before.ids() if i != mapping_id}
    cfg = PciMappingConfig.parse(text)
    cfg.set_entries(mapping_id, [("map", m) for m in maps])
    assert cfg.entries(mapping_id) == [("map", m) for m in maps]
    assert {i: cfg.entries(i) for i in cfg.ids() if i != mapping_id} == others
    for block in text.split("\n\n"):
        if not block.startswith(f"{mapping_id}\n") and block != mapping_id:
            assert block.removesuffix("\n") in cfg.render()
    cfg.remove(mapping_id)
    assert cfg.ids() == [i for i in before.ids() if i != mapping_id]
