"""The speaker's open tasks (pending or in progress), soonest due first, with local due times and what is overdue."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the type checker only: at run time the bot hands the context in
    from core.capabilities.runtime import CapabilityContext

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "at most this many (default 10)"}
    },
    "additionalProperties": False,
}

# capability_user_id() is the speaker's account id (tasks.user_id): without it an admin (who may read every row)
# would get everyone's.
SQL = (
    "SELECT id, title, status, due_at FROM tasks WHERE user_id = capability_user_id()"
    " AND status IN ('pending', 'in_progress') ORDER BY due_at NULLS LAST, id LIMIT $1::int"
)


async def my_open_tasks(params: dict[str, Any], ctx: CapabilityContext) -> dict[str, Any]:
    """One read-only query as the speaker; timestamps arrive as ISO text and are shown in the speaker's zone."""
    now = ctx.now()
    tasks = []
    for row in await ctx.query(SQL, params.get("limit", 10)):
        due = None if row["due_at"] is None else datetime.fromisoformat(row["due_at"]).astimezone(ctx.tz)
        tasks.append(
            {
                "id": row["id"],
                "title": row["title"],
                "status": row["status"],
                "due": None if due is None else due.strftime("%Y-%m-%d %H:%M"),
                "overdue": due is not None and due < now,
            }
        )
    return {"as_of": now.strftime("%Y-%m-%d %H:%M"), "timezone": ctx.timezone, "tasks": tasks}
