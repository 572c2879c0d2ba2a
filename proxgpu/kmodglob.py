"""Globs as kmod matches them: glibc's ``fnmatch`` in the C locale, and the alias index's
search, for the aliases kmod keeps (see :mod:`proxgpu.kmod`, which looks modules up with them).

>>> glob_matches("pci:v000010DE*", "pci:v000010DEd00002BB1")
True
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=8192)
def alias_normalize(alias: str) -> str | None:
    """An alias as kmod keeps and looks it up: ``-`` read as ``_`` outside ``[...]``; ``None`` for
    one with a ``]`` that closes nothing or a ``[`` that nothing closes, which kmod drops
    (depmod leaves it out of ``modules.alias.bin``, the config parser skips its line).

    >>> alias_normalize("i2c-nvidia-gpu"), alias_normalize("pci:v0000[1-2]0DE*")
    ('i2c_nvidia_gpu', 'pci:v0000[1-2]0DE*')
    >>> alias_normalize("pci:v]"), alias_normalize("pci:v[0")
    (None, None)
    """
    kept = []
    at = 0
    while at < len(alias):
        char = alias[at]
        if char == "]":
            return None
        if char == "[":
            end = alias.find("]", at)
            if end < 0:
                return None
            kept.append(alias[at : end + 1])
            at = end + 1
            continue
        kept.append("_" if char == "-" else char)
        at += 1
    return "".join(kept)


@dataclass(frozen=True)
class _Chars:
    """What one character of a glob matches: a character in ``ranges`` (``negated``: any other)."""

    ranges: tuple[tuple[str, str], ...] = ()
    negated: bool = False

    def __contains__(self, char: str) -> bool:
        return any(low <= char <= high for low, high in self.ranges) != self.negated


def _bracket(pattern: str, at: int) -> tuple[_Chars | None, int] | None:
    """The bracket expression that starts after the ``[`` at ``at - 1``, and where the pattern
    goes on; ``None`` when no ``]`` closes it (glibc then reads the ``[`` as itself). Its set is
    ``None`` for one with a character class, an equivalence class or a collating symbol
    (``[[:alpha:]``), which only a glob kmod would drop anyway can hold: not modelled."""
    negated = pattern[at : at + 1] in ("!", "^")
    at += negated
    ranges: list[tuple[str, str]] = []
    first = True
    while at < len(pattern):
        char = pattern[at]
        if char == "]" and not first:
            return _Chars(tuple(ranges), negated), at + 1
        first = False
        if char == "[" and pattern[at + 1 : at + 2] in (":", "=", "."):
            return None, at
        if char == "\\":
            at += 1
            char = pattern[at : at + 1]
        at += 1
        high = char
        if pattern[at : at + 1] == "-" and pattern[at + 1 : at + 2] not in ("", "]"):
            high = pattern[at + 1]
            at += 2
            if high == "[" and pattern[at : at + 1] in (":", "=", "."):
                return None, at
            if high == "\\":
                high = pattern[at : at + 1]
                at += 1
        if not char or not high:
            return None
        ranges.append((char, high))
    return None


#: One entry of a glob: a character that stands for itself, a set of them, or ``None`` for a
#: ``*``.
_Token = str | _Chars | None


@lru_cache(maxsize=4096)
def _glob(pattern: str) -> tuple[_Token, ...] | None:
    """``pattern`` as one entry per character it matches; ``None`` for a pattern that matches
    nothing (it ends in a lone backslash); a lone ``*`` for one with a bracket not modelled
    (see :func:`_bracket`), which so counts as a match."""
    tokens: list[_Token] = []
    at = 0
    while at < len(pattern):
        char = pattern[at]
        at += 1
        if char == "*":
            tokens += [None] if not tokens or tokens[-1] is not None else []
        elif char == "?":
            tokens.append(_Chars(negated=True))
        elif char == "\\":
            if at == len(pattern):
                return None
            tokens.append(pattern[at])
            at += 1
        elif char == "[" and (found := _bracket(pattern, at)) is not None:
            if found[0] is None:
                return (None,)
            tokens.append(found[0])
            at = found[1]
        else:
            tokens.append(char)
    return tuple(tokens)


@lru_cache(maxsize=8192)
def glob_matches(pattern: str, name: str) -> bool:
    """Whether glibc's ``fnmatch(pattern, name, 0)`` in the C locale matches, as kmod calls it,
    for the globs kmod keeps (:func:`alias_normalize`): ``*`` any run of characters, ``/`` and a
    leading ``.`` included; ``?`` any one; ``[...]`` one of a set, with ranges by code point,
    ``!`` or ``^`` first to negate, and ``]`` first as a member; ``\\`` makes the next
    character stand for itself (a lone one at the end matches nothing); a ``[`` that no ``]``
    closes stands for itself. A bracket holding ``[:class:]``, ``[=c=]`` or ``[.c.]`` is not
    modelled and counts as a match, so a module named by one is never missed. Linear
    backtracking: a pattern with many ``*`` costs at most its length times the name's.

    >>> name = "pci:v000010DEd00002BB1sv000010DEsd0000204Bbc03sc00i00"
    >>> glob_matches("pci:v000010DEd*sv*sd*bc03sc*i*", name), glob_matches("pci:v*bc04*", name)
    (True, False)
    >>> [glob_matches(p, "b3") for p in ("[a-c]?", "[!a-c]*", "[^b]3", "\\\\b3", "b3\\\\")]
    [True, False, False, True, False]
    """
    tokens = _glob(pattern)
    if tokens is None:
        return False
    return _tokens_match(tokens, name)


def _tokens_match(tokens: tuple[_Token, ...], name: str) -> bool:
    """Match one character at a time; on a mismatch, give the last ``*`` one character more and
    go on from there (enough for globs, whose other entries each take exactly one character)."""
    at = step = 0
    star: tuple[int, int] | None = None  # the last * seen, and where in name it began taking
    while at < len(name):
        # Past the last entry nothing matches: the name is longer, so a * must take more.
        token = tokens[step] if step < len(tokens) else _Chars()
        if token is None:
            star, step = (step, at), step + 1
        elif token == name[at] if isinstance(token, str) else name[at] in token:
            at, step = at + 1, step + 1
        elif star is not None:
            star = (star[0], star[1] + 1)
            at, step = star[1], star[0] + 1
        else:
            return False
    return all(token is None for token in tokens[step:])


def index_matches(key: str, name: str) -> bool:
    """Whether kmod's search of an alias index (``modules.alias.bin``,
    ``modules.builtin.alias.bin``: ``index_searchwild``) finds ``key`` for ``name``: the key's
    characters up to its first ``*``, ``?`` or ``[`` are compared as they are (a backslash
    there is a backslash), the rest with :func:`glob_matches`.

    >>> index_matches("pci:v000010DEd*", "pci:v000010DEd00002BB1"), index_matches("a\\\\*", "a*")
    (True, False)
    """
    cut = min((at for at in map(key.find, "*?[") if at >= 0), default=-1)
    if cut < 0:
        return key == name
    return name.startswith(key[:cut]) and glob_matches(key[cut:], name[cut:])
