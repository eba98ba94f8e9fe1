"""Text that PostgreSQL can hold: it refuses U+0000 in `text` and `jsonb`, and no UTF-8 holds a lone surrogate (JSON
may carry one as an escape), so every way in cleans what it takes with these."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

NUL = "\x00"
_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def strip_nul(text: str) -> str:
    """`text` without U+0000 and with any lone surrogate replaced by U+FFFD (the same object when it is clean)."""
    if NUL in text:
        text = text.replace(NUL, "")
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = _SURROGATE.sub(REPLACEMENT, text)
    return text


def clean_json(value: Any) -> Any:
    """A JSON-like value with every string cleaned by strip_nul, keys included."""
    if isinstance(value, str):
        return strip_nul(value)
    if isinstance(value, dict):
        return {strip_nul(k) if isinstance(k, str) else k: clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def clean_fields(obj: Any) -> None:
    """Clean a (frozen) dataclass's str fields and tuples of str in place: for its `__post_init__`."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        clean: str | tuple[str, ...]
        if isinstance(value, str):
            clean = strip_nul(value)
        elif isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
            clean = tuple(strip_nul(v) for v in value)
        else:
            continue
        if clean != value:
            object.__setattr__(obj, f.name, clean)
