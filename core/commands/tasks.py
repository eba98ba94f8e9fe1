"""/remind, /watch, /tasks and /timezone: the person's reminders and page watches, and the zone they are kept in."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from core.buttons import Button, Buttons, Confirm
from core.commands.base import Ask, Command, Option
from core.constants import WATCH_STOP_BUTTONS
from core.remind import Asker, Reminded, remind
from core.reminders import recurrence
from core.reminders.messages import SUPERSEDED
from core.reminders.queries import replan_zones
from core.reminders.watching import read_every
from core.reminders.when import languages_of
from core.storage import conversations
from core.storage.db import Pool
from core.timeutil import fmt_local, valid_zone, zone
from core.tools import watch as watching
from core.tools.framework import ToolContext, ToolError
from core.tools.tasks import open_tasks

NO_READER = "I cannot read web pages here (this bot has no page reader), so I cannot watch one."
WHICH_WATCH = "Which watch? e.g. /watch stop 12 (/watch lists yours)."


async def remind_now(ask: Ask) -> str | Reminded:
    """/remind <when> <what>: a reminder made at once, no model call (core/remind.py)."""
    user, chat = await ask.speaker()
    settings = ask.core.settings
    asker = Asker(user, chat, languages_of(ask.inc.language))
    per_minute = settings.USER_MESSAGES_PER_MINUTE
    return await remind(ask.core.pool, asker, ask.options, ask.core.clock, ask.core.caps, per_minute, ask.tasks_changed)


async def watch(ask: Ask) -> str | Buttons:
    """/watch <url> [every <interval>]: watch a page, no model call (core/tools/watch.py); /watch alone: the person's
    watches, each with a Stop button (a press runs /watch stop <id> for them)."""
    user, chat = await ask.speaker()
    core = ask.core
    ctx = ToolContext(
        core.pool, user, chat, False, core.clock, on_tasks_changed=ask.tasks_changed, own_words=True, caps=core.caps
    )
    tz, now = zone(user.timezone), core.clock()
    if ask.get("stop"):
        ref = ask.get("stop").strip()
        if not (ref.isdecimal() and len(ref) < 19):
            return WHICH_WATCH
        return await watching.stop(ctx, int(ref)) or watching.NOT_YOURS.format(id=ref)
    if not ask.get("url").strip():
        return await _watches(ask, ctx, tz, now)
    if core.page_reader is None:
        return NO_READER
    every = read_every(ask.get("every")) if ask.get("every").strip() else None
    if isinstance(every, str):
        return every
    try:
        made = await watching.start(ctx, core.page_reader, ask.get("url"), every)
    except ToolError as e:
        return str(e)
    return made.text(tz, now)


async def _watches(ask: Ask, ctx: ToolContext, tz: ZoneInfo, now: datetime) -> str | Buttons:
    """The person's watches (here, in a group) with a Stop button each."""
    rows = await watching.watches(ctx.pool, ctx.user.account_id, ctx.task_chat)
    if not rows:
        return watching.NO_WATCHES
    text = f"**Your watches** ({tz.key}):\n" + "\n".join(f"- #{r['id']} {watching.line(r, tz, now)}" for r in rows)
    stops = [
        Button(f"⏹ Stop #{r['id']}", Confirm("watch", {"stop": str(r["id"])}, ask.inc.user_id), "danger")
        for r in rows[:WATCH_STOP_BUTTONS]
    ]
    return Buttons(text, tuple(tuple(stops[i : i + 5]) for i in range(0, len(stops), 5)))


def _watch_options(text: str) -> dict[str, str]:
    """`/watch stop 12`, `/watch <url> [every 2 hours]` as options."""
    first, _, rest = text.strip().partition(" ")
    if first.lower() == "stop":
        return {"stop": rest.strip() or "?"}
    return {k: v for k, v in (("url", first), ("every", rest.strip())) if v}


async def tasks(ask: Ask) -> str:
    """The speaking user's open tasks with local due times, and their page watches."""
    user, _ = await ask.speaker()
    pool = ask.core.pool
    rows = [r for r in await open_tasks(pool, user.account_id) if r["kind"] != "watch"]
    tz, now = zone(user.timezone), ask.core.clock()
    watched = [watching.line(r, tz, now) for r in await watching.watches(pool, user.account_id)]
    watch_text = "\n\n" + "\n".join(watched) if watched else ""
    skipped = await pool.fetch(
        "SELECT t.id, t.title, o.scheduled_at FROM occurrences o JOIN tasks t ON t.id = o.task_id"
        " WHERE t.user_id = $1 AND o.status = 'skipped' AND o.scheduled_at > $2 AND o.error IS DISTINCT FROM $3"
        " AND t.kind <> 'watch' ORDER BY o.scheduled_at",
        user.account_id,
        now - timedelta(days=7),
        SUPERSEDED,
    )
    notes = [f"- #{r['id']} {r['title']} — was due {fmt_local(r['scheduled_at'], tz, now)}" for r in skipped]
    skipped_text = "\n\n**Missed while I was offline** (not sent):\n" + "\n".join(notes) if notes else ""
    skipped_text = watch_text + skipped_text + await _not_delivered(pool, user.account_id, tz, now)
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
WATCH = Command(
    "watch",
    "watch a web page for changes, e.g. /watch https://example.com every 2 hours",
    "watch a page: I read it now and then every hour (or as you say), and tell you here what changed; "
    "/watch alone lists your watches with Stop buttons",
    watch,
    (
        Option("url", "The page's address (leave empty to see your watches)"),
        Option("every", "How often: 30 minutes, 2 hours, 1 day (default: every hour)"),
        Option("stop", "The number of a watch to stop"),
    ),
    syntax="[<address> [every 2 hours] | stop <id>]",
    reader=_watch_options,
)
TASKS = Command("tasks", "your open tasks", "your open tasks and page watches", tasks, private=True)
TIMEZONE = Command(
    "timezone",
    "show or set your time zone",
    "show or set your time zone",
    timezone,
    (Option("zone", "An IANA time zone such as Europe/Berlin (leave empty to see yours)"),),
    private=True,
    syntax="Area/City",
)
