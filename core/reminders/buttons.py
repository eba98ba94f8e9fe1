"""Reminder buttons: Done and Snooze, pressed only by the task's owner."""

from __future__ import annotations

from datetime import timedelta

from core.storage.db import Pool
from core.timeutil import Clock, zone

BUTTONS = ("done", "snooze10", "snooze60")
SNOOZE = {"snooze10": timedelta(minutes=10), "snooze60": timedelta(hours=1)}


async def press(
    pool: Pool, clock: Clock, *, platform: str, presser_id: str, task_id: int, action: str, default_tz: str = "UTC"
) -> tuple[bool, str]:
    """A reminder button: only the task's owner may press; Done ends a series, Snooze moves it."""
    row = await pool.fetchrow(
        "SELECT t.id, t.title, t.status, t.recurrence, u.timezone FROM tasks t JOIN users u ON u.id = t.user_id"
        " WHERE t.id = $1 AND u.platform = $2 AND u.platform_user_id = $3",
        task_id, platform, presser_id,
    )  # fmt: skip
    if row is None:
        return False, "Only the person this reminder is for can use these buttons."
    if action == "done":
        await pool.execute("UPDATE tasks SET status = 'done', updated_at = now() WHERE id = $1", task_id)
        return True, f"✅ Done: {row['title']}"
    if action in SNOOZE:
        until = clock() + SNOOZE[action]
        await pool.execute(
            "UPDATE tasks SET due_at = $2, status = 'pending', updated_at = now() WHERE id = $1", task_id, until
        )
        tz = zone(row["timezone"], default_tz)
        return True, f"😴 Snoozed: {row['title']} — until {until.astimezone(tz):%H:%M}"
    return False, "Unknown button."
