"""Tests for proxgpu.pve.config: exact round trips, and edits that touch only their own lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxgpu.pve.config import (
    INDEX_LIMITS,
    GuestConfig,
    format_property_string,
    parse_property_string,
)
from proxgpu.pve.mapping import PciMappingConfig
from tests.proxmox.sources import corpus
from tests.support.pvevalidate import corpus_files, proxmox_sources

# Proxmox's own test configs, from the pinned sources (tests/proxmox/sources.toml): third-party
# AGPL test data, read where the sources lie, never copied into the project.
CORPUS_FILES = [*corpus_files("qemu"), *corpus_files("lxc")]
#: qemu-server's 229 and pve-container's 117 at the pinned commits.
CORPUS_SIZE = 346

# An oracle for the end of the main section that does not reuse the module's own code.
HEADER_LINE = re.compile(r"^\[[^\]\n]*\]\s*$", re.MULTILINE)


def split_main(text: str) -> tuple[str, str]:
    """The text before the first section header, and the rest."""
    match = HEADER_LINE.search(text)
    return (text[: match.start()], text[match.start() :]) if match else (text, "")


def lines(text: str) -> list[str]:
    """Lines without endings, so a last line that gains its newline still compares equal."""
    return [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")] if text else []


def is_entry_of(line: str, key: str) -> bool:
    return re.fullmatch(rf"{re.escape(key)}(:\s*|\s*=\s*).*", line) is not None


def without(key: str, text: str, value: str | None = None) -> list[str]:
    """The lines of ``text`` that are not entries of ``key`` (with ``value``, if given)."""
    return [
        line
        for line in lines(text)
        if not (is_entry_of(line, key) and (value is None or line.endswith(value)))
    ]


def assert_only_main_changed(before: str, after: str) -> None:
    """Every section after the main one is byte-identical, and the line ending style is kept."""
    assert split_main(after)[1] == split_main(before)[1]
    # A blank line is kept with its line ending, even when it becomes the last line.
    if before and after.strip() and not after.endswith(("\n\n", "\r\n\r\n")):
        assert after.endswith("\n") == before.endswith("\n")
    if "\r\n" in before and "\n" not in before.replace("\r\n", ""):
        assert "\n" not in after.replace("\r\n", "")


def _corpus_id(path: Path | None) -> str:
    """``REPOSITORY/src/test/...``: upstream's folders reuse file names."""
    return str(path.relative_to(proxmox_sources())) if path else "absent"


CORPUS_PARAMS: list[Path | None] = [*CORPUS_FILES] or [None]


@pytest.fixture(params=CORPUS_PARAMS, ids=_corpus_id)
def corpus_bytes(request: pytest.FixtureRequest) -> bytes:
    if request.param is None:
        proxmox_sources()  # fails, saying how to get them
    path: Path = request.param
    return path.read_bytes()


# --- the real configs --------------------------------------------------------------------------


def test_corpus_is_complete() -> None:
    # Without the sources the parametrised tests below have one failing case; this one counts.
    sources = proxmox_sources()
    assert len(CORPUS_FILES) == CORPUS_SIZE
    assert {p.relative_to(sources).parts[0] for p in CORPUS_FILES} == {
        "qemu-server",
        "pve-container",
    }
    assert len(corpus(sources, "lxc")) == 117


def test_corpus_round_trips_byte_for_byte(corpus_bytes: bytes) -> None:
    assert GuestConfig.parse(corpus_bytes.decode()).render().encode() == corpus_bytes


def test_corpus_set_new_key_inserts_one_line_after_last_normal_key(corpus_bytes: bytes) -> None:
    text = corpus_bytes.decode()
    cfg = GuestConfig.parse(text)
    last_key = cfg.entries()[-1][0]
    cfg.set("hostpci15", "0000:81:00.0,pcie=1")
    after = cfg.render()
    assert_only_main_changed(text, after)
    new_lines = lines(split_main(after)[0])
    at = new_lines.index("hostpci15: 0000:81:00.0,pcie=1")
    assert is_entry_of(new_lines[at - 1], last_key)
    assert new_lines[:at] + new_lines[at + 1 :] == lines(split_main(text)[0])


def test_corpus_replace_and_delete_touch_one_line(corpus_bytes: bytes) -> None:
    text = corpus_bytes.decode()
    key, _ = GuestConfig.parse(text).entries()[0]
    replaced = GuestConfig.parse(text)
    replaced.set(key, "changed")
    deleted = GuestConfig.parse(text)
    assert deleted.delete(key)
    for after in (replaced.render(), deleted.render()):
        assert_only_main_changed(text, after)
        assert without(key, after) == without(key, text)
    assert replaced.get(key) == "changed"
    assert deleted.get(key) is None


def test_corpus_hostpci_values_are_property_strings() -> None:
    proxmox_sources()
    values = [
        value
        for path in CORPUS_FILES
        for key, value in GuestConfig.parse(path.read_text()).entries()
        if key.startswith("hostpci")
    ]
    assert values
    for value in values:
        props = parse_property_string(value, default_key="host")
        assert "host" in props or "mapping" in props
        assert format_property_string(props, default_key="host") == value


# --- generated configs ---------------------------------------------------------------------------

NORMAL_KEYS = ["memory", "cores", "hostpci0", "hostpci1", "dev0", "numa", "affinity", "amd-sev"]
RAW_KEYS = ["lxc.cgroup2.devices.allow", "lxc.mount.entry", "lxc.cgroup2.cpuset.cpus"]
VALUES = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=12
).map(str.strip)


def _entry_line(keys: list[str], seps: list[str]) -> st.SearchStrategy[str]:
    return st.builds("".join, st.tuples(st.sampled_from(keys), st.sampled_from(seps), VALUES))


LINE = st.one_of(
    _entry_line(NORMAL_KEYS, [": ", ":", ":  ", ":\t"]),
    _entry_line(RAW_KEYS, [": ", " = ", "=", ":"]),
    st.builds("#{}".format, VALUES),
    st.sampled_from(["", "  ", "Unknown line", " indented: x", "#qmdump#map:x"]),
)
HEADERS = st.sampled_from(
    ["[PENDING]", "[pve:pending]", "[special:cloudinit]", "[snap1]", "[test]", "[:3]"]
)


@st.composite
def configs(draw: st.DrawFn) -> str:
    """A config whose sections after the main one reuse the main section's keys."""
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    body = draw(st.lists(LINE, max_size=8))
    for header in draw(st.lists(HEADERS, max_size=3)):
        body += [header, *draw(st.lists(LINE, max_size=4))]
    text = eol.join(body)
    terminated: bool = draw(st.booleans())
    return text + eol if body and terminated else text


KEYS = st.sampled_from(NORMAL_KEYS + RAW_KEYS + ["hostpci7", "lxc.apparmor.profile"])
CLEAN_VALUES = VALUES.filter(lambda v: "," not in v)


@given(st.text())
def test_any_text_round_trips(text: str) -> None:
    assert GuestConfig.parse(text).render() == text
    assert PciMappingConfig.parse(text).render() == text


@given(configs(), KEYS, CLEAN_VALUES)
def test_set_touches_only_that_key_in_main(text: str, key: str, value: str) -> None:
    cfg = GuestConfig.parse(text)
    cfg.set(key, value)
    after = cfg.render()
    assert_only_main_changed(text, after)
    assert cfg.get_all(key) == [value]
    assert without(key, split_main(after)[0]) == without(key, split_main(text)[0])


@given(configs(), KEYS)
def test_delete_touches_only_that_key_in_main(text: str, key: str) -> None:
    cfg = GuestConfig.parse(text)
    had = cfg.get(key) is not None
    assert cfg.delete(key) == had
    after = cfg.render()
    assert_only_main_changed(text, after)
    assert cfg.get(key) is None
    assert lines(split_main(after)[0]) == without(key, split_main(text)[0])


@given(configs(), st.sampled_from(RAW_KEYS), CLEAN_VALUES)
def test_add_then_remove_raw_touches_only_that_entry(text: str, key: str, value: str) -> None:
    cfg = GuestConfig.parse(text)
    cfg.add_raw(key, value)
    assert value in cfg.get_all(key)
    assert_only_main_changed(text, cfg.render())
    assert without(key, split_main(cfg.render())[0], value) == without(
        key, split_main(text)[0], value
    )
    assert cfg.remove_raw(key, value) >= 1
    assert value not in cfg.get_all(key)
    assert_only_main_changed(text, cfg.render())


@given(configs())
def test_sections_are_read_but_never_edited(text: str) -> None:
    cfg = GuestConfig.parse(text)
    before = {name: cfg.section_entries(name) for name in cfg.section_names()}
    for key in NORMAL_KEYS + RAW_KEYS:
        cfg.set(key, "x")
    assert {name: cfg.section_entries(name) for name in cfg.section_names()} == before
    assert split_main(cfg.render())[1] == split_main(text)[1]


# --- GuestConfig units ----------------------------------------------------------------------------

LXC = """\
#GPU container
arch: amd64
cores: 8
hostname: gpu1
memory: 16384
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow = c 511:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file

[pve:pending]
cores: 4
hostpci3: 0000:c1:00.0

[before-gpu]
cores: 8
lxc.cgroup2.devices.allow: c 195:* rwm
snaptime: 1700000000
"""


def test_entries_list_the_main_section_in_order() -> None:
    assert GuestConfig.parse(LXC).entries() == [
        ("arch", "amd64"),
        ("cores", "8"),
        ("hostname", "gpu1"),
        ("memory", "16384"),
        ("lxc.cgroup2.devices.allow", "c 195:* rwm"),
        ("lxc.cgroup2.devices.allow", "c 511:* rwm"),
        ("lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"),
    ]


def test_get_reads_only_the_main_section() -> None:
    cfg = GuestConfig.parse(LXC)
    assert cfg.get("cores") == "8"
    assert cfg.get("snaptime") is None
    assert cfg.get("hostpci3") is None
    assert cfg.get_all("lxc.cgroup2.devices.allow") == ["c 195:* rwm", "c 511:* rwm"]


def test_get_takes_the_last_of_repeated_keys_like_pve() -> None:
    assert GuestConfig.parse("cores: 1\ncores: 2\n").get("cores") == "2"


def test_set_existing_key_replaces_in_place() -> None:
    cfg = GuestConfig.parse(LXC)
    cfg.set("cores", "28")
    assert cfg.render() == LXC.replace("cores: 8\nhostname", "cores: 28\nhostname")


def test_set_new_key_goes_after_last_normal_key() -> None:
    cfg = GuestConfig.parse(LXC)
    cfg.set("dev0", "/dev/nvidia0,gid=44")
    assert cfg.render() == LXC.replace("16384\n", "16384\ndev0: /dev/nvidia0,gid=44\n", 1)


def test_set_new_raw_key_goes_at_end_of_lxc_block() -> None:
    cfg = GuestConfig.parse(LXC)
    cfg.set("lxc.cgroup2.cpuset.cpus", "0-27,56-83")
    assert cfg.render() == LXC.replace(
        "create=file\n", "create=file\nlxc.cgroup2.cpuset.cpus: 0-27,56-83\n", 1
    )


def test_set_new_raw_key_without_lxc_block_follows_normal_keys() -> None:
    cfg = GuestConfig.parse("#desc\ncores: 2\n\n[snap]\ncores: 1\n")
    cfg.set("lxc.cgroup2.cpuset.mems", "0")
    assert cfg.render() == "#desc\ncores: 2\nlxc.cgroup2.cpuset.mems: 0\n\n[snap]\ncores: 1\n"


def test_set_new_normal_key_before_raw_only_block() -> None:
    cfg = GuestConfig.parse("lxc.mount.entry: a\n")
    cfg.set("cores", "2")
    assert cfg.render() == "cores: 2\nlxc.mount.entry: a\n"


def test_set_in_main_without_entries_stays_above_blank_lines_and_sections() -> None:
    cfg = GuestConfig.parse("#only a description\n\n[snap]\ncores: 1\n")
    cfg.set("cores", "2")
    assert cfg.render() == "#only a description\ncores: 2\n\n[snap]\ncores: 1\n"


def test_set_on_empty_text_writes_one_terminated_line() -> None:
    cfg = GuestConfig.parse("")
    cfg.set("memory", "512")
    assert cfg.render() == "memory: 512\n"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("lxc.cgroup2.cpuset.cpus = 0-3", "lxc.cgroup2.cpuset.cpus = 4-7"),
        ("lxc.cgroup2.cpuset.cpus=0-3", "lxc.cgroup2.cpuset.cpus=4-7"),
        ("lxc.cgroup2.cpuset.cpus: 0-3", "lxc.cgroup2.cpuset.cpus: 4-7"),
        ("lxc.cgroup2.cpuset.cpus:0-3", "lxc.cgroup2.cpuset.cpus:4-7"),
    ],
)
def test_set_keeps_the_separator_style_of_the_line(line: str, expected: str) -> None:
    cfg = GuestConfig.parse(f"cores: 2\n{line}\n")
    cfg.set("lxc.cgroup2.cpuset.cpus", "4-7")
    assert cfg.render() == f"cores: 2\n{expected}\n"


def test_set_drops_repeats_of_the_key() -> None:
    cfg = GuestConfig.parse("lxc.cgroup2.cpuset.cpus: 0\ncores: 2\nlxc.cgroup2.cpuset.cpus: 1\n")
    cfg.set("lxc.cgroup2.cpuset.cpus", "0-3")
    assert cfg.render() == "lxc.cgroup2.cpuset.cpus: 0-3\ncores: 2\n"


def test_set_never_writes_into_pending_or_snapshot() -> None:
    cfg = GuestConfig.parse(LXC)
    cfg.set("hostpci3", "0000:81:00.0")
    cfg.set("snaptime", "1")
    main, rest = split_main(cfg.render())
    assert rest == split_main(LXC)[1]
    assert "hostpci3: 0000:81:00.0\nsnaptime: 1\n" in main


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cores", "1\n2"),
        ("cores", "1\r"),
        ("cores", " 2"),
        ("Cores", "2"),
        ("cores: 2\nmemory", "3"),
        ("lxc.foo = bar", "baz"),
        ("#cores", "2"),
        ("", "2"),
    ],
)
def test_set_rejects_what_cannot_be_one_line(key: str, value: str) -> None:
    cfg = GuestConfig.parse("cores: 1\n")
    with pytest.raises(ValueError, match=r"cannot be stored|not a valid config key"):
        cfg.set(key, value)
    assert cfg.render() == "cores: 1\n"


def test_delete_removes_only_that_key() -> None:
    cfg = GuestConfig.parse(LXC)
    assert cfg.delete("lxc.cgroup2.devices.allow")
    assert cfg.render() == LXC.replace(
        "lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow = c 511:* rwm\n", "", 1
    )
    assert not cfg.delete("hostpci3")


def test_remove_raw_removes_one_rule_and_keeps_the_others() -> None:
    cfg = GuestConfig.parse(LXC)
    assert cfg.remove_raw("lxc.cgroup2.devices.allow", "c 195:* rwm") == 1
    assert cfg.render() == LXC.replace("lxc.cgroup2.devices.allow: c 195:* rwm\n", "", 1)
    assert cfg.remove_raw("lxc.cgroup2.devices.allow", "c 195:* rwm") == 0


def test_remove_raw_matches_either_separator() -> None:
    cfg = GuestConfig.parse(LXC)
    assert cfg.remove_raw("lxc.cgroup2.devices.allow", "c 511:* rwm") == 1
    assert cfg.get_all("lxc.cgroup2.devices.allow") == ["c 195:* rwm"]


def test_add_raw_appends_to_lxc_block_once() -> None:
    cfg = GuestConfig.parse(LXC)
    assert cfg.add_raw("lxc.cgroup2.devices.allow", "c 195:0 rwm")
    assert not cfg.add_raw("lxc.cgroup2.devices.allow", "c 195:0 rwm")
    assert cfg.render() == LXC.replace(
        "create=file\n", "create=file\nlxc.cgroup2.devices.allow: c 195:0 rwm\n", 1
    )


@pytest.mark.parametrize("method", ["add_raw", "remove_raw"])
def test_raw_edits_refuse_normal_keys(method: str) -> None:
    cfg = GuestConfig.parse(LXC)
    with pytest.raises(ValueError, match="not a raw"):
        getattr(cfg, method)("cores", "8")


def test_missing_final_newline_survives_append_and_delete() -> None:
    cfg = GuestConfig.parse("cores: 2\nmemory: 512")
    cfg.set("numa", "1")
    assert cfg.render() == "cores: 2\nmemory: 512\nnuma: 1"
    cfg.delete("numa")
    assert cfg.render() == "cores: 2\nmemory: 512"
    cfg.set("memory", "1024")
    assert cfg.render() == "cores: 2\nmemory: 1024"


def test_crlf_is_kept_and_used_for_new_lines() -> None:
    cfg = GuestConfig.parse("#desc\r\ncores: 2\r\n\r\n[snap]\r\ncores: 1\r\n")
    cfg.set("memory", "512")
    cfg.set("cores", "4")
    assert cfg.render() == "#desc\r\ncores: 4\r\nmemory: 512\r\n\r\n[snap]\r\ncores: 1\r\n"


def test_description_comments_and_unknown_lines_are_kept_verbatim() -> None:
    text = "# TEST: hostpci\n#qmdump#map:x\nodd line\ncores: 2\n# tail note\n"
    cfg = GuestConfig.parse(text)
    assert cfg.entries() == [("cores", "2")]
    cfg.set("memory", "1")
    assert cfg.render() == text.replace("cores: 2\n", "cores: 2\nmemory: 1\n")


def test_empty_value_with_trailing_blank_reads_as_empty() -> None:
    cfg = GuestConfig.parse("boot: \ncores: 1\n")
    assert cfg.get("boot") == ""
    assert cfg.render() == "boot: \ncores: 1\n"


def test_sections_pending_and_snapshots_are_readable() -> None:
    text = (
        "cores: 2\n\n[PENDING]\nhostpci0: 81:00\ndelete: numa\n\n[special:cloudinit]\n"
        "name: x\n\n[snap]\n#snap note\ncores: 1\n\n[:3]\nname: y\n"
    )
    cfg = GuestConfig.parse(text)
    assert cfg.section_names() == ["PENDING", "special:cloudinit", "snap", ":3"]
    assert cfg.pending_entries() == [("hostpci0", "81:00"), ("delete", "numa")]
    assert cfg.section_entries("snap") == [("cores", "1")]
    assert cfg.section_entries("missing") == []
    assert GuestConfig.parse("a: 1\n[pve:pending]\nb: 2\n").pending_entries() == [("b", "2")]


def test_repeated_section_names_are_all_read() -> None:
    cfg = GuestConfig.parse("a: 1\n[foo]\nb: 1\n[foo]\nb: 2\n")
    assert cfg.section_entries("foo") == [("b", "1"), ("b", "2")]


def test_free_indices_skip_main_and_pending_but_not_snapshots() -> None:
    cfg = GuestConfig.parse(
        "hostpci0: 81:00\nhostpci2: c1:00\n[PENDING]\nhostpci1: 82:00\n[snap]\nhostpci3: d1:00\n"
    )
    assert cfg.free_indices("hostpci") == [3]
    assert cfg.free_indices("hostpci", 3) == [3, 4, 5]
    assert cfg.free_indices("dev", 2) == [0, 1]


def test_free_indices_ignore_keys_that_only_share_the_prefix() -> None:
    cfg = GuestConfig.parse("net0: x\nnetx: y\nnet1a: z\n")
    assert cfg.free_indices("net") == [1]


def test_free_indices_run_out_at_the_limit() -> None:
    text = "".join(f"hostpci{n}: 81:00\n" for n in range(INDEX_LIMITS["hostpci"] - 1))
    cfg = GuestConfig.parse(text)
    assert cfg.free_indices("hostpci") == [15]
    with pytest.raises(ValueError, match="only 1 of 16"):
        cfg.free_indices("hostpci", 2)
    assert cfg.free_indices("hostpci", 2, limit=20) == [15, 16]


def test_free_indices_need_a_limit_for_unknown_prefixes() -> None:
    with pytest.raises(ValueError, match="no known index limit"):
        GuestConfig.parse("").free_indices("scsi")
    assert GuestConfig.parse("scsi0: x\n").free_indices("scsi", limit=31) == [1]
