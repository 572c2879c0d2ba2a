"""proxgpu's model of the globs kmod matches a device's modalias with, against glibc's own
``fnmatch`` (the real one, called through ctypes in the C locale with flags 0, as kmod calls it)
and kmod's index search.

Only globs kmod keeps are compared: depmod leaves one whose brackets do not pair out of its
index, and kmod's config parser skips its line (:func:`~proxgpu.kmod.alias_normalize`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import locale
import time
from collections.abc import Iterator

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from proxgpu.kmodglob import alias_normalize, glob_matches, index_matches

_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_LIBC.fnmatch.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
_LIBC.fnmatch.restype = ctypes.c_int

#: The characters that mean something to fnmatch, and some that do not.
GLOBS = st.text(alphabet="abc-]![\\*?^", max_size=12)
NAMES = st.text(alphabet="abcd-]![\\^*", max_size=9)


@pytest.fixture(autouse=True)
def c_locale() -> Iterator[None]:
    """The C locale, as kmod's ranges compare characters by their code."""
    before = locale.setlocale(locale.LC_ALL)
    locale.setlocale(locale.LC_ALL, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_ALL, before)


def glibc(pattern: str, name: str) -> bool:
    return int(_LIBC.fnmatch(pattern.encode(), name.encode(), 0)) == 0


@settings(max_examples=3000, deadline=None)
@given(GLOBS, NAMES)
def test_a_glob_matches_as_glibcs_fnmatch(pattern: str, name: str) -> None:
    assume(alias_normalize(pattern) == pattern)
    assert glob_matches(pattern, name) == glibc(pattern, name)


@pytest.mark.parametrize(
    ("pattern", "name"),
    [
        ("pci:v000010DEd*sv*sd*bc03sc*i*", "pci:v000010DEd00002BB1sv000010DEsd0000204Bbc03sc00i00"),
        ("pci:v*d*sv*sd*bc04sc03i00*", "pci:v000010DEd000022E8sv000010DEsd0000204Bbc04sc03i00"),
        ("pci:v0000[!2]002d*\\s?0*", "pci:v00001002d0000744Csv00001002sd00000E3Bbc03sc00i00"),
        ("pci:v0000[1-2]0DEd*", "pci:v000010DEd00002BB1"),
        ("pci:v0000[^1]0DEd*", "pci:v000010DEd00002BB1"),
        ("a\\", "a\\"),
        ("x[]", "x[]"),
    ],
)
def test_the_globs_of_modules_and_configs_match_as_glibcs(pattern: str, name: str) -> None:
    assert glob_matches(pattern, name) == glibc(pattern, name)


def test_many_stars_cost_no_more_than_the_globs_length_times_the_names() -> None:
    """A hostile alias with a star before every character cannot make the match backtrack
    without end (a regular expression would take longer than the universe has)."""
    pattern, name = "*a" * 40 + "b", "a" * 55
    start = time.monotonic()
    assert not glob_matches(pattern, name)
    assert time.monotonic() - start < 1


def test_the_index_compares_an_aliass_start_as_it_is() -> None:
    """kmod's index keeps each alias in a tree of its characters up to the first ``*``, ``?``
    or ``[``: a backslash there is a character of its own, not an escape as for fnmatch."""
    assert index_matches("pci:v000010DEd*", "pci:v000010DEd00002BB1")
    assert not index_matches("pci\\:v*", "pci:v")
    assert glob_matches("pci\\:v*", "pci:v")
    assert index_matches("pci:v00001002d0000744C*", "pci:v00001002d0000744Csv0")
    assert not index_matches("pci:v00001002d0000744C", "pci:v00001002d0000744Csv0")


def test_a_bracket_with_a_class_counts_as_a_match() -> None:
    """``[[:alpha:]`` and its kind, which glibc reads in ways kmod's own pairing of brackets
    makes odd, are not modelled: such a glob counts as matching, so its module is never missed."""
    assert alias_normalize("pci:v[[:xdigit:]*") is not None
    assert glob_matches("pci:v[[:xdigit:]*", "usb:anything")
