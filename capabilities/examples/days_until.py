"""How many days are left until a date (negative once it is past), counted from today in the speaker's time zone."""

from __future__ import annotations

from datetime import date
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the type checker only: at run time the bot hands the context in
    from core.capabilities.runtime import CapabilityContext

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"date": {"type": "string", "description": "the day, as YYYY-MM-DD"}},
    "required": ["date"],
    "additionalProperties": False,
}


async def days_until(params: dict[str, Any], ctx: CapabilityContext) -> dict[str, Any]:
    """The day, its weekday and the days from the speaker's today to it (a bad date raises, the model sees why)."""
    day = date.fromisoformat(params["date"])
    return {"date": day.isoformat(), "weekday": day.strftime("%A"), "days": (day - ctx.now().date()).days}
