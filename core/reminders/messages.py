"""What a reminder says: its fixed text, an agent job's request and answer, why an occurrence ended, and the
message an adapter sends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TypedDict

from asyncpg import Record

from core.quoting import quoted
from core.reminders.buttons import BUTTONS
from core.reminders.recurrence import latest_missed, zone_name
from core.timeutil import fmt_local, zone
from core.types import JOB_MESSAGE_PREFIX, ChatKind, Incoming, Quoted

SUPERSEDED = "the task changed before this reminder could be delivered"
TOO_OLD = "older than the grace window"
# after a reminder moved to another private chat of its owner because its chat refused it for good
MOVED_NOTE = "(Sent here because I can no longer write to {where}. This task's later reminders come here too.)"

PartsSent = Callable[[int], Awaitable[None]]


@dataclass(frozen=True)
class ReminderMessage:
    """A reminder ready for an adapter: where, whose, what (Markdown), and its buttons."""

    task_id: int
    scheduled_at: datetime
    platform: str
    chat_id: str
    thread_id: str
    chat_kind: str
    owner_id: str
    owner_name: str
    text: str
    buttons: tuple[str, ...] = BUTTONS
    sent_parts: int = 0  # a retry: the platform already has this many of its parts; send only the rest
    on_sent: PartsSent | None = field(default=None, repr=False, compare=False)

    async def mark_sent(self, parts: int) -> None:
        """Adapters call this right after the platform accepted the first `parts` parts (best effort, never raises:
        a failure only risks sending a part twice)."""
        if self.on_sent is not None:
            await self.on_sent(parts)


def message_for(row: Record, text: str, on_sent: PartsSent) -> ReminderMessage:
    """The message for a claimed occurrence, addressed to its task's chat and owner."""
    return ReminderMessage(
        task_id=row["task_id"],
        scheduled_at=row["scheduled_at"],
        **_chat(row),
        owner_id=row["platform_user_id"],
        owner_name=row["display_name"],
        text=text,
        sent_parts=row["sent_parts"],
        on_sent=on_sent,
    )


def moved_message(msg: ReminderMessage, chat: Record, text: str, on_sent: PartsSent) -> ReminderMessage:
    """The message for another private chat of its owner (`chat`, with the identity there), all of `text` to send."""
    return replace(
        msg,
        platform=chat["platform"],
        chat_id=chat["platform_chat_id"],
        thread_id=chat["thread_id"],
        chat_kind="private",
        owner_id=chat["platform_user_id"],
        owner_name=chat["display_name"],
        text=text,
        sent_parts=0,
        on_sent=on_sent,
    )


def moved_text(text: str, platform: str, chat_kind: str) -> str:
    """A reminder's text with the note naming the chat (of `platform`, of `chat_kind`) it could not reach; a note
    from an earlier move is replaced."""
    name = platform.capitalize()
    group = "channel" if platform == "discord" else "group"
    where = f"your {name} chat" if chat_kind == "private" else f"the {name} {group}"
    base = text.split(f"\n\n{MOVED_NOTE.split('{', 1)[0]}", 1)[0]
    return f"{base}\n\n{MOVED_NOTE.format(where=where)}"


class _Chat(TypedDict):
    """Where a task's reminders and jobs go: its chat (and thread) as the platform knows it."""

    platform: str
    chat_id: str
    thread_id: str
    chat_kind: ChatKind


def _chat(row: Record) -> _Chat:
    """The chat of a claimed occurrence's task."""
    return {
        "platform": row["platform"],
        "chat_id": row["platform_chat_id"],
        "thread_id": row["thread_id"],
        "chat_kind": row["chat_kind"],
    }


def plain_text(title: str, details: str, scheduled: datetime, tz_name: str, late: bool, now: datetime) -> str:
    """`⏰ Buy milk — due 09:00` (or `was due Sat 22 Nov 09:00` when late): fixed text, no LLM."""
    tz = zone(tz_name)
    local = scheduled.astimezone(tz)
    same_day = local.date() == now.astimezone(tz).date()
    when = local.strftime("%H:%M") if same_day else fmt_local(scheduled, tz, now)
    text = f"⏰ {title} — {'was due' if late else 'due'} {when}"
    return f"{text}\n{details}" if details else text


def reminder_text(row: Record, now: datetime, late_after: timedelta, default_tz: str | None) -> str:
    """A claimed occurrence's fixed text in its owner's current zone: a series behind schedule shows its latest
    missed time, marked late when that is more than `late_after` ago."""
    shown = latest_missed(row, now, default_tz)
    late = bool(row["late"]) or now - shown > late_after
    return plain_text(row["title"], row["details"] or "", shown, zone_name(row, default_tz), late, now)


def job_request(row: Record, shown: datetime) -> Incoming:
    """The turn an agent job runs, as its owner in its chat; a job written with others' text around runs as a
    quoted request, with no admin or memory tools (front_door.Core._turn)."""
    prompt = row["agent_prompt"] or row["title"]
    own = bool(row["own_words"])
    return Incoming(
        **_chat(row),
        user_id=row["platform_user_id"],
        user_name=row["display_name"],
        text=f"[scheduled job: {row['title']}] {prompt}" if own else "",
        quoted=() if own else (Quoted("job", quoted(row["title"]), prompt),),
        message_id=f"{JOB_MESSAGE_PREFIX}{row['task_id']}:{shown.isoformat()}",
    )


def job_text(title: str, answer: str | None, fallback: str) -> str:
    """An agent job's reminder: its title over the turn's answer, or the fixed text when there is no answer."""
    return f"⏰ {title}\n\n{answer}" if answer else fallback


def span_text(span: timedelta) -> str:
    """A grace window as `24 h`, `1.5 h`, `90 min` or `30 s`."""
    s = span.total_seconds()
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    return f"{s / 60:.3g} min" if s >= 60 else f"{s:.3g} s"


def not_delivered(grace: timedelta, error: str) -> str:
    """Why an occurrence failed after retrying for its whole grace window."""
    return f"not delivered within {span_text(grace)} (last error: {error})"


def error_text(e: BaseException) -> str:
    """A send failure as `Kind: message` (or just `Kind` when it has no message)."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def refusal_text(e: BaseException) -> str:
    """A permanent refusal's reason as the user sees it: its message, else its kind."""
    return str(e) or type(e).__name__
