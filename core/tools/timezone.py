"""The user's own settings: the `set_timezone` tool."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from core.reminders.queries import replan_zones
from core.storage import conversations
from core.timeutil import fmt_local, valid_zone, zone
from core.tools.framework import Tool, ToolContext, ToolError


class SetTimezoneParams(BaseModel):
    """Parameters of set_timezone."""

    timezone: str = Field(description="IANA zone name, e.g. Europe/Berlin or America/New_York")


async def set_timezone(p: SetTimezoneParams, ctx: ToolContext) -> dict[str, Any]:
    """Validate and store the speaking user's time zone."""
    if not ctx.own_words:  # the zone times every private reminder: others' text must not move them
        raise ToolError(
            "the time zone can only be changed in a conversation of your own words (your private chat with me); "
            "this one holds someone else's text",
            code="forbidden",
        )
    name = valid_zone(p.timezone)
    if name is None:
        raise ToolError(f"'{p.timezone}' is not an IANA time zone; use a name like Europe/Berlin")
    await conversations.set_timezone(ctx.pool, ctx.user, name)
    now = ctx.now()
    await replan_zones(ctx.pool, now, None, ctx.user.account_id)  # a daily 09:00 moves to 09:00 there now
    return {
        "timezone": name,
        "local_time": fmt_local(now, zone(name), now),
        "summary": f"time zone {name}, now {fmt_local(now, zone(name), now)}",
    }


SET_TIMEZONE = Tool(
    name="set_timezone",
    description="Set the user's time zone (IANA name).",
    params=SetTimezoneParams,
    handler=set_timezone,
)
