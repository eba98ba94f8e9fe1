"""Splitting a Matrix message's HTML into parts within a limit: never inside a tag, an entity or a visible character;
the elements open at a cut are closed at the end of its part and opened again at the start of the next (a code block
keeps its language, a numbered list its numbering); a cut between blocks is preferred, then a line break, then a
space. Sizes count characters as the event's JSON holds them (see size())."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from adapters.markdown import drop_empty_pairs, glued, units_of
from adapters.matrix.limits import MATRIX_MIN_LIMIT, MATRIX_SPLIT_FLOOR

_UNIT = re.compile(r"<[^<>]*>|&(?:#\d+|#x[0-9a-fA-F]+|[a-zA-Z]+);")
_TAG = re.compile(r"<(/?)([a-z0-9]+)([^>]*)>")
_VOID = {"br", "hr", "img"}
_BLOCK_ENDS = {"p", "li", "pre", "blockquote", "ul", "ol", "table", "tr", "details", "summary", "hr", "thead", "tbody"}
_BLOCK_ENDS |= {f"h{i}" for i in range(1, 7)}
_EMPTY_PAIR = re.compile(r"<((?!t[dh]\b)[a-z0-9]+)(?: [^>]*)?>(\s*)</\1>")  # an empty table cell keeps its column
_START = re.compile(r'start="(\d+)"')


@functools.lru_cache(maxsize=4096)
def _char_size(ch: str) -> int:
    """One character's size in JSON (a quote, backslash or control character is escaped)."""
    return len(json.dumps(ch, ensure_ascii=False)) - 2


def size(text: str) -> int:
    """The text's length as its JSON string holds it: each character 1, `"` `\\` and \\n 2, another control character
    6. With UTF-8 a character is at most 4 bytes, so a part of `limit` is at most 4 × `limit` bytes of the event."""
    return sum(_char_size(ch) for ch in text)


@dataclass(frozen=True)
class _Open:
    """An element open at a point: its start tag, its name and (a list) how many items it has begun."""

    tag: str
    name: str
    items: int = 0

    def reopened(self, item_open: bool) -> str:
        """The start tag that continues it in the next part (a numbered list goes on at its next number)."""
        if self.name != "ol":
            return self.tag
        found = _START.search(self.tag)
        number = (int(found.group(1)) if found else 1) + self.items - (1 if item_open else 0)
        return f'<ol start="{number}">' if number != 1 else "<ol>"


_Stack = tuple[_Open, ...]


def _after(stack: _Stack, unit: str) -> _Stack:
    """The open elements after a unit."""
    tag = _TAG.fullmatch(unit) if unit.startswith("<") else None
    if tag is None:
        return stack
    closing, name = tag.group(1) == "/", tag.group(2)
    if closing:
        for i in range(len(stack) - 1, -1, -1):
            if stack[i].name == name:
                return stack[:i]
        return stack
    if name in _VOID:
        return stack
    if name == "li" and stack and stack[-1].name in ("ol", "ul"):
        parent = stack[-1]
        stack = (*stack[:-1], _Open(parent.tag, parent.name, parent.items + 1))
    return (*stack, _Open(unit, name))


def _opening(stack: _Stack) -> str:
    """The start tags that reopen the elements of `stack`."""
    return "".join(e.reopened(i + 1 < len(stack) and stack[i + 1].name == "li") for i, e in enumerate(stack))


def _closing(stack: _Stack) -> str:
    """The end tags of the elements of `stack`, innermost first."""
    return "".join(f"</{e.name}>" for e in reversed(stack))


def _rank(units: list[str], end: int, stack: _Stack) -> int:
    """How good a cut before `units[end]` is: 3 after a block, 2 after a line break, 1 after a space, 0 elsewhere,
    -1 where it may not be (after a start tag, inside a visible character)."""
    unit = units[end - 1]
    if unit.startswith("<"):
        tag = _TAG.fullmatch(unit)
        name = tag.group(2) if tag else ""
        if tag and (tag.group(1) or name == "hr") and name in _BLOCK_ENDS:
            return 3
        if name == "br":
            return 2
        return 0 if tag and tag.group(1) else -1
    if unit == "\n":
        return 2 if any(e.name == "pre" for e in stack) else 3
    if unit == " ":
        return 0 if any(e.name == "a" for e in stack) else 1  # a link's label is not cut at a space by choice
    return -1 if end < len(units) and glued(unit, units[end]) else 0


@dataclass
class _Cut:
    """A place a part may end: the unit index, the part's size there and the elements open there."""

    end: int
    size: int
    stack: _Stack
    rank: int


def _cuts(units: list[str], widths: list[int], start: int, stack: _Stack, limit: int) -> tuple[list[_Cut], bool]:
    """Every cut the part from `start` may end at within `limit` (its end tags counted), and whether all fit."""
    cuts: list[_Cut] = []
    total = size(_opening(stack))
    shown = False
    for i in range(start, len(units)):
        after = _after(stack, units[i])
        if total + widths[i] + size(_closing(after)) > limit:
            return cuts, False
        total += widths[i]
        stack = after
        shown = shown or not (units[i].startswith("<") or units[i].isspace())
        if shown:
            cuts.append(_Cut(i + 1, total, stack, _rank(units, i + 1, stack)))
    return cuts, True


def _best(cuts: list[_Cut], limit: int) -> _Cut | None:
    """The latest cut of the best rank in the part's second half, else the latest allowed one."""
    for rank in (3, 2, 1):
        for cut in reversed(cuts):
            if cut.size < limit // 2:
                break
            if cut.rank == rank:
                return cut
    return next((c for c in reversed(cuts) if c.rank >= 0), cuts[-1] if cuts else None)


def _split(markup: str, limit: int) -> list[str]:
    """The parts of `markup`, each at most `limit` in size()."""
    if size(markup) <= limit:
        return [markup]
    units = units_of(markup, _UNIT)
    widths = [size(u) for u in units]
    parts: list[str] = []
    start, stack = 0, _Stack()
    while start < len(units):
        cuts, whole = _cuts(units, widths, start, stack, limit)
        if whole:
            parts.append(_opening(stack) + "".join(units[start:]))
            break
        cut = _best(cuts, limit)
        if cut is None:  # not even one unit fits after the reopened tags: give the unit a part of its own
            cut = _Cut(start + 1, 0, _after(stack, units[start]), 0)
        parts.append(_opening(stack) + "".join(units[start : cut.end]) + _closing(cut.stack))
        start, stack = cut.end, cut.stack
        while start < len(units) and units[start] in (" ", "\n") and not any(e.name == "pre" for e in stack):
            start += 1
    return parts


def drop_empty(markup: str) -> str:
    """Remove elements with nothing inside (left by a split), table cells excepted."""
    return drop_empty_pairs(markup, _EMPTY_PAIR)


def split_html(markup: str, limit: int) -> list[str]:
    """Split HTML into parts of at most `limit` (at least MATRIX_MIN_LIMIT) in size(); empty parts dropped."""
    parts = [drop_empty(p).strip() for p in _split(markup, max(limit, MATRIX_MIN_LIMIT))]
    return [p for p in parts if p]


def split_both(markup: str, limit: int, plain_size: Callable[[str], int] | None = None) -> list[str]:
    """split_html(), each part split again smaller while `plain_size` of it (its plain body) is over `limit`."""
    out: list[str] = []
    for part in split_html(markup, limit):
        out.extend(_fit(part, limit, max(limit, MATRIX_MIN_LIMIT), plain_size))
    return out


def _fit(part: str, limit: int, html_limit: int, plain_size: Callable[[str], int] | None) -> list[str]:
    """The part, or its pieces split smaller until each one's plain body fits `limit` too."""
    if plain_size is None or plain_size(part) <= limit or html_limit <= MATRIX_SPLIT_FLOOR:
        return [part]
    smaller = html_limit * 3 // 4
    pieces = [drop_empty(p).strip() for p in _split(part, smaller)]
    return [q for p in pieces if p for q in _fit(p, limit, smaller, plain_size)]
