"""Reminder buttons: Done and Snooze, and Undo under `/remind`'s answer, pressed only by the task's owner."""

from __future__ import annotations

from datetime import timedelta

from core.reminders import queries
from core.storage.db import Pool
from core.timeutil import Clock, zone

BUTTONS = ("done", "snooze10", "snooze60")  # under a reminder; `/remind`'s answer has UNDO
UNDO = "undo"
SNOOZE = {"snooze10": timedelta(minutes=10), "snooze60": timedelta(hours=1)}
NOT_THE_OWNER = "Only the person this reminder is for can use these buttons."
UNKNOWN_BUTTON = "Unknown button."
UNDONE = "↩️ Undone: #{id} {title} is deleted."
GONE = "That reminder is already gone."


async def press(
    pool: Pool, clock: Clock, *, platform: str, presser_id: str, task_id: int, action: str, default_tz: str = "UTC"
) -> tuple[bool, str]:
    """Apply a reminder button for its task's owner (Done ends a series, Snooze moves it); (applied, what to say)."""
    row = await queries.owned_task(pool, task_id, platform, presser_id)
    if row is None:
        return False, NOT_THE_OWNER
    if action == UNDO:
        gone = await queries.delete_task(pool, task_id)
        return gone, UNDONE.format(id=task_id, title=row["title"]) if gone else GONE
    if action == "done":
        await queries.mark_done(pool, task_id)
        return True, f"✅ Done: {row['title']}"
    if action in SNOOZE:
        until = clock() + SNOOZE[action]
        await queries.snooze(pool, task_id, until)
        tz = zone(row["timezone"], default_tz)
        return True, f"😴 Snoozed: {row['title']} — until {until.astimezone(tz):%H:%M}"
    return False, UNKNOWN_BUTTON
