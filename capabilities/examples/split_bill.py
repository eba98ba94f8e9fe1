"""Split a bill between people, tip included, in whole cents: the shares always add up to the total."""

from __future__ import annotations

from typing import Any

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "total": {"type": "number", "exclusiveMinimum": 0, "description": "the bill before the tip"},
        "people": {"type": "integer", "minimum": 1, "maximum": 100},
        "tip_percent": {"type": "number", "minimum": 0, "maximum": 100, "description": "default 0"},
    },
    "required": ["total", "people"],
    "additionalProperties": False,
}


async def split_bill(params: dict[str, Any]) -> dict[str, Any]:
    """No context needed: a capability may take `params` alone; the first shares take the odd cents."""
    cents = round(params["total"] * (100 + params.get("tip_percent", 0)))
    share, odd = divmod(cents, params["people"])
    shares = [(share + (1 if i < odd else 0)) / 100 for i in range(params["people"])]
    return {"with_tip": cents / 100, "shares": shares}
