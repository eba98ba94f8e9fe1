"""Text that PostgreSQL can hold: it refuses U+0000 in `text` and `jsonb`, so every way in strips it."""

from __future__ import annotations

from typing import Any

NUL = "\x00"


def strip_nul(text: str) -> str:
    """`text` without U+0000 (the same object when it has none)."""
    return text.replace(NUL, "") if NUL in text else text


def clean_json(value: Any) -> Any:
    """A JSON-like value with U+0000 stripped from every string, keys included (unchanged objects are reused)."""
    if isinstance(value, str):
        return strip_nul(value)
    if isinstance(value, dict):
        return {strip_nul(k) if isinstance(k, str) else k: clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    return value
