"""`/remind <when> <what>`: a reminder made from the person's own words without a model call, through the task
tool's own rules (future times only, MAX_OPEN_TASKS, the same recurrences), answered with exactly what was
understood and an Undo button."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from core.buttons import Button, OnTask
from core.reminders import recurrence
from core.reminders.buttons import UNDO
from core.reminders.when import Understood, understand, understand_parts
from core.storage.db import Pool
from core.texts import REMINDER_BUTTON_LABELS
from core.timeutil import Clock, zone
from core.tools.framework import Caps, ToolContext, ToolError
from core.tools.tasks import ManageTasksParams, manage_tasks
from core.types import ChatRef, UserRef

TOO_FAST = "You made {n} reminders in the last minute, the most I take; send the next one in a minute."
UNDONE = "↩️ Undone: #{id} {title} (deleted)"


@dataclass(frozen=True)
class Reminded:
    """`/remind`'s answer: the line saying what was made (Markdown) and the task, for its Undo button."""

    text: str
    task_id: int

    @property
    def rows(self) -> tuple[tuple[Button, ...], ...]:
        """Its one button: ↩️ Undo."""
        return ((Button(REMINDER_BUTTON_LABELS[UNDO], OnTask(UNDO, self.task_id)),),)


@dataclass(frozen=True)
class Asker:
    """Who asked and where (the platform's identity, never a model's), in their zone and languages."""

    user: UserRef
    chat: ChatRef
    languages: tuple[str, ...] = ()


def read(options: Mapping[str, str], asker: Asker, now: datetime) -> Understood | str:
    """The options as typed (`when` holds the whole text in a text chat) or given apart (Discord's `when`, `what`)."""
    tz = zone(asker.user.timezone)
    if "what" in options:
        return understand_parts(options.get("when", ""), options["what"], tz, now, asker.languages)
    return understand(options.get("when", ""), tz, now, asker.languages)


async def remind(
    pool: Pool,
    asker: Asker,
    options: Mapping[str, str],
    clock: Clock,
    caps: Caps,
    per_minute: int,
    on_tasks_changed: Callable[[], None],
) -> Reminded | str:
    """Make the reminder `options` describe for `asker` (a normal task), or say in one line why not."""
    now = clock()
    got = read(options, asker, now)
    if isinstance(got, str):
        return got
    made = await pool.fetchval(  # created_at is the database's time, so the minute is too
        "SELECT count(*) FROM tasks WHERE user_id = $1 AND created_at > now() - interval '1 minute'",
        asker.user.account_id,
    )
    if made >= per_minute:
        return TOO_FAST.format(n=per_minute)
    tz = zone(asker.user.timezone)
    due = got.due.astimezone(tz).replace(tzinfo=None).isoformat(timespec="minutes") if got.due else None
    params = ManageTasksParams(action="create", title=got.what[:500], due_at=due, recurrence=got.repeat)
    ctx = ToolContext(
        pool, asker.user, asker.chat, False, clock, on_tasks_changed=on_tasks_changed, own_words=True, caps=caps
    )
    try:
        result = await manage_tasks(params, ctx)
    except ToolError as e:
        return str(e)
    task = result["task"]
    line = f"⏰ #{task['id']} {task['title']} — {task.get('due', '')}"
    if got.repeat is not None:
        line += f" 🔁 {recurrence.describe(got.repeat)}"
    return Reminded(line, task["id"])
