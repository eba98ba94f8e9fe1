"""/remind, /tasks and /timezone: the person's reminders and the zone they are kept in."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from core.commands.base import Ask, Command, Option
from core.remind import Asker, Reminded, remind
from core.reminders import recurrence
from core.reminders.messages import SUPERSEDED
from core.reminders.queries import replan_zones
from core.reminders.when import languages_of
from core.storage import conversations
from core.storage.db import Pool
from core.timeutil import fmt_local, valid_zone, zone
from core.tools.tasks import open_tasks


async def remind_now(ask: Ask) -> str | Reminded:
    """/remind <when> <what>: a reminder made at once, no model call (core/remind.py)."""
    user, chat = await ask.speaker()
    settings = ask.core.settings
    asker = Asker(user, chat, languages_of(ask.inc.language))
    per_minute = settings.USER_MESSAGES_PER_MINUTE
    return await remind(ask.core.pool, asker, ask.options, ask.core.clock, ask.core.caps, per_minute, ask.tasks_changed)


async def tasks(ask: Ask) -> str:
    """The speaking user's open tasks with local due times."""
    user, _ = await ask.speaker()
    pool = ask.core.pool
    rows = await open_tasks(pool, user.account_id)
    tz, now = zone(user.timezone), ask.core.clock()
    skipped = await pool.fetch(
        "SELECT t.id, t.title, o.scheduled_at FROM occurrences o JOIN tasks t ON t.id = o.task_id"
        " WHERE t.user_id = $1 AND o.status = 'skipped' AND o.scheduled_at > $2 AND o.error IS DISTINCT FROM $3"
        " ORDER BY o.scheduled_at",
        user.account_id,
        now - timedelta(days=7),
        SUPERSEDED,
    )
    notes = [f"- #{r['id']} {r['title']} — was due {fmt_local(r['scheduled_at'], tz, now)}" for r in skipped]
    skipped_text = "\n\n**Missed while I was offline** (not sent):\n" + "\n".join(notes) if notes else ""
    skipped_text += await _not_delivered(pool, user.account_id, tz, now)
    if not rows:
        return "You have no open tasks. Tell me what to remember!" + skipped_text
    lines = [f"**Your open tasks** ({tz.key}):"]
    for r in rows:
        line = f"- #{r['id']} {r['title']}"
        if r["due_at"] is not None:
            line += f" — {fmt_local(r['due_at'], tz, now)}"
            if r["due_at"] < now:
                line += " ⚠️ overdue"
        rec = recurrence.from_json(r["recurrence"])
        if rec is not None:
            line += f" 🔁 {recurrence.describe(rec)}"
        lines.append(line)
    return "\n".join(lines) + skipped_text


async def _not_delivered(pool: Pool, user_id: int, tz: ZoneInfo, now: datetime) -> str:
    """Reminders of the last 7 days that failed (with the reason) or are still being retried."""
    rows = await pool.fetch(
        "SELECT t.id, t.title, o.scheduled_at, o.status, o.error, o.lease_until FROM occurrences o"
        " JOIN tasks t ON t.id = o.task_id WHERE t.user_id = $1 AND o.scheduled_at > $2"
        " AND (o.status = 'failed' OR (o.status = 'claimed' AND o.error IS NOT NULL"
        "      AND t.due_at = o.scheduled_at AND t.status IN ('pending', 'in_progress')))"  # not done/snoozed since
        " ORDER BY o.scheduled_at",
        user_id,
        now - timedelta(days=7),
    )
    failed = [r for r in rows if r["status"] == "failed"]
    retrying = [r for r in rows if r["status"] == "claimed"]
    out = ""
    if failed:
        out += "\n\n**Reminders that could not be delivered:**\n" + "\n".join(
            f"- #{r['id']} {r['title']} — was due {fmt_local(r['scheduled_at'], tz, now)}: {r['error']}" for r in failed
        )
    if retrying:
        out += "\n\n**Reminders not sent yet** (retrying):\n" + "\n".join(
            f"- #{r['id']} {r['title']} — was due {fmt_local(r['scheduled_at'], tz, now)}, next try "
            f"{fmt_local(r['lease_until'], tz, now)}: {r['error']}"
            for r in retrying
        )
    return out


async def timezone(ask: Ask) -> str:
    """Show the user's time zone, or set it when the option names one."""
    user, _ = await ask.speaker()
    now, arg = ask.core.clock(), ask.get("zone")
    if not arg.strip():
        return (
            f"Your time zone is **{user.timezone}** (now {fmt_local(now, zone(user.timezone), now)}). "
            "Change it with /timezone Area/City, e.g. /timezone Europe/Berlin."
        )
    name = valid_zone(arg)
    if name is None:
        return f"`{arg.strip()[:60]}` is not a time zone I know. Use an IANA name like Europe/Berlin."
    await conversations.set_timezone(ask.core.pool, user, name)
    if await replan_zones(ask.core.pool, now, ask.core.settings.DEFAULT_TIMEZONE, user.account_id):
        ask.tasks_changed()  # the scheduler plans the moved times
    return f"Time zone set to **{name}** — it is {fmt_local(now, zone(name), now)} there."


REMIND = Command(
    "remind",
    "a reminder at a time you say, e.g. /remind tomorrow 9:00 Buy milk",
    "a reminder at once, no model asked: /remind in 10 minutes Tea, /remind friday 18:30 Call mum, "
    "/remind every weekday 7:30 Stretch (in your time zone; Undo takes it back)",
    remind_now,
    (
        Option("when", "When, in your words: in 10 minutes, tomorrow 9:00, every weekday 7:30"),
        Option("what", "What to remind you of"),
    ),
    syntax="<when> <what>",
)
TASKS = Command("tasks", "your open tasks", "your open tasks", tasks, private=True)
TIMEZONE = Command(
    "timezone",
    "show or set your time zone",
    "show or set your time zone",
    timezone,
    (Option("zone", "An IANA time zone such as Europe/Berlin (leave empty to see yours)"),),
    private=True,
    syntax="Area/City",
)
