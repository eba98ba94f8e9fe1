"""Text helpers the prompt needs: quote a value as data, fold a name onto one line, cut a long text."""

from __future__ import annotations

import json

_LINE_BREAKS: dict[int, str] = {ord(c): f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"}  # JSON escapes the rest


def quoted(text: str) -> str:
    """`text` as a JSON string for the prompt: quoted, and no character in it can start a line of its own (JSON
    leaves U+2028, U+2029, NEL and a few separators raw, and str.splitlines() and some models break on them)."""
    return json.dumps(text, ensure_ascii=False).translate(_LINE_BREAKS)


def one_line(text: str) -> str:
    """`text` with every kind of line break and run of white space folded into one space (names, origins)."""
    return " ".join(text.split())


def truncate(text: str, limit: int, *, one_line: bool = False) -> str:
    """`text` cut after `limit` characters with "… [truncated, N more characters]"; `one_line`: flat, "…" at `limit`."""
    if one_line:
        flat = " ".join(text.split())
        return flat if len(flat) <= limit else flat[: limit - 1] + "…"
    return text if len(text) <= limit else text[:limit] + f"… [truncated, {len(text) - limit} more characters]"
