"""Watching a page: start, list and stop the speaking person's page watches — the `watch_page` tool, and /watch
(core/commands/tasks.py) without a model call. A watch is a task of kind 'watch' repeating every N minutes, under the
task rules: it counts among MAX_OPEN_TASKS, and is checked at most every JOB_MIN_INTERVAL_MINUTES. Its page is read
once at once (the baseline; a page that cannot be read makes nothing), then by the reminder engine when due."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

import asyncpg
from pydantic import BaseModel, Field

from core.constants import WATCH_EVERY_MINUTES, WATCH_MOST_MINUTES, WATCH_URL_CHARS
from core.reminders import recurrence
from core.reminders.watching import PageReader, every_text, fingerprint, kept, read, shown
from core.storage.db import Conn, Pool
from core.timeutil import fmt_local
from core.tools.framework import Tool, ToolContext, ToolError
from core.tools.tasks import OPEN_STATUSES, check_open_cap

NOT_AN_ADDRESS = "Give the page's web address, starting with http:// or https:// (e.g. /watch https://example.com)."
TOO_OFTEN = (
    "I check a page at most every {least} minutes (asked: {asked}); "
    "e.g. /watch {url} every {least} minutes, or less often."
)
TOO_RARELY = "I check a page at least once a year; give a shorter interval."
ALREADY = "You already watch {url} (#{id}), {every}; next check {next}."
NO_WATCHES = "You watch no pages. /watch <address> [every 2 hours] starts one (every hour unless you say)."
NOT_YOURS = "You have no watch #{id} here (/watch lists yours)."
STOPPED = "⏹ Stopped watching {url}."
_SCOPE = "t.user_id = $1 AND ($2::bigint IS NULL OR t.chat_id = $2)"  # the person's, in a group only this chat's
_COLUMNS = "t.id, t.status, t.due_at, t.recurrence, w.url, w.title, w.failures, w.failing_since, w.last_error"
_WATCHES_SQL = f"""
SELECT {_COLUMNS} FROM tasks t JOIN watches w ON w.task_id = t.id
WHERE {_SCOPE} AND t.kind = 'watch' AND t.status = ANY($3::text[])
ORDER BY t.status = 'paused', t.id
"""
_WATCHING_SQL = f"""
SELECT {_COLUMNS} FROM tasks t JOIN watches w ON w.task_id = t.id
WHERE {_SCOPE} AND t.kind = 'watch' AND t.status = ANY($3::text[]) AND w.url = $4 LIMIT 1
"""
LISTED = (*OPEN_STATUSES, "paused")


@dataclass(frozen=True)
class Watched:
    """A watch just made: its task, its page, how often and when it is checked next."""

    task_id: int
    url: str
    title: str
    every_minutes: int
    next_check: datetime

    def text(self, tz: ZoneInfo, now: datetime) -> str:
        """What the person is told (Markdown)."""
        title = f" (“{shown(self.title)}”)" if shown(self.title) else ""
        return (
            f"👀 Watching {self.url}{title} {every_text(self.every_minutes)}; next check "
            f"{fmt_local(self.next_check, tz, now)}. I tell you here when it changes."
        )


def address(raw: str) -> str:
    """The web address to watch (`example.com/x` → `https://example.com/x`); ToolError when it is not one."""
    url = raw.strip().strip("<>")
    if url and "://" not in url and "." in url.split("/")[0]:
        url = "https://" + url
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in ("http", "https") or not rest or any(c.isspace() for c in url):
        raise ToolError(NOT_AN_ADDRESS)
    if len(url) > WATCH_URL_CHARS:
        raise ToolError(f"That address is longer than {WATCH_URL_CHARS} characters.")
    return url


def check_every(minutes: int, least: int, url: str) -> None:
    """Refuse an interval shorter than JOB_MIN_INTERVAL_MINUTES (`least`) or longer than a year."""
    if minutes < least:
        raise ToolError(TOO_OFTEN.format(least=least, asked=every_text(minutes), url=url), code="forbidden")
    if minutes > WATCH_MOST_MINUTES:
        raise ToolError(TOO_RARELY)


async def _watching(conn: Conn | Pool, ctx: ToolContext, url: str) -> asyncpg.Record | None:
    """The person's open watch of this address here, if any."""
    return await conn.fetchrow(_WATCHING_SQL, ctx.user.account_id, ctx.task_chat, list(OPEN_STATUSES), url)


def _already(row: asyncpg.Record, ctx: ToolContext) -> ToolError:
    """The refusal of a second watch of one page."""
    rec = recurrence.from_json(row["recurrence"])
    every = every_text(rec.every_minutes or WATCH_EVERY_MINUTES) if rec else ""
    when = fmt_local(row["due_at"], ctx.tz, ctx.now()) if row["due_at"] else "soon"
    return ToolError(ALREADY.format(url=row["url"], id=row["id"], every=every, next=when))


async def start(ctx: ToolContext, reader: PageReader, raw_url: str, every_minutes: int | None) -> Watched:
    """Watch a page for the speaking person in this chat: its interval checked, its page read at once for the
    baseline, then the watch made under MAX_OPEN_TASKS (a paused watch of the same page is replaced). ToolError with
    the one line to say when not."""
    url = address(raw_url)
    every = every_minutes or WATCH_EVERY_MINUTES
    check_every(every, ctx.caps.job_min_interval_minutes, url)
    if (row := await _watching(ctx.pool, ctx, url)) is not None:
        raise _already(row, ctx)
    got = await read(reader, url)
    if isinstance(got, str):
        raise ToolError(got)
    now = ctx.now()
    due = now + timedelta(minutes=every)
    async with ctx.pool.acquire() as conn, conn.transaction():
        await check_open_cap(conn, ctx)  # holds the person's row: a second /watch of theirs waits here
        if (row := await _watching(conn, ctx, url)) is not None:
            raise _already(row, ctx)
        await conn.execute(
            "DELETE FROM tasks t USING watches w WHERE w.task_id = t.id AND t.user_id = $1 AND t.status = 'paused'"
            " AND w.url = $2",
            ctx.user.account_id,
            url,
        )
        task_id = await conn.fetchval(
            "INSERT INTO tasks (user_id, chat_id, title, due_at, recurrence, timezone, kind, own_words, created_by)"
            " VALUES ($1, $2, $3, $4, $5, $6, 'watch', $7, $8) RETURNING id",
            ctx.user.account_id,
            ctx.chat.id,
            f"Watch {url}"[:500],
            due,
            {"kind": "interval", "every_minutes": every},
            ctx.tz.key,
            ctx.own_words,
            ctx.user.id,
        )
        await conn.execute(
            "INSERT INTO watches (task_id, url, title, seen_hash, seen_text, checked_at)"
            " VALUES ($1, $2, $3, $4, $5, $6)",
            task_id,
            url,
            got.title,
            fingerprint(got.text),
            kept(got.text),
            now,
        )
    ctx.on_tasks_changed()
    return Watched(task_id, url, got.title, every, due)


async def watches(pool: Pool, account_id: int, chat_id: int | None = None) -> list[asyncpg.Record]:
    """The person's open and paused watches (only those of `chat_id` when given), paused last."""
    return await pool.fetch(_WATCHES_SQL, account_id, chat_id, list(LISTED))


def line(row: asyncpg.Record, tz: ZoneInfo, now: datetime) -> str:
    """`👀 Watching <url> every 1 hour, next check Sat 21 Nov 12:00 CET`, or a paused one with why."""
    if row["status"] == "paused":
        since = fmt_local(row["failing_since"], tz, now) if row["failing_since"] else "a day"
        return (
            f"⏸ Paused: {row['url']} — could not be read since {since} ({row['last_error'] or 'no reason'}); "
            f"/watch {row['url']} starts again"
        )
    rec = recurrence.from_json(row["recurrence"])
    every = every_text(rec.every_minutes or WATCH_EVERY_MINUTES) if rec else ""
    nxt = f", next check {fmt_local(row['due_at'], tz, now)}" if row["due_at"] is not None else ""
    failing = f" (the last {row['failures']} checks failed: {row['last_error']})" if row["failures"] else ""
    return f"👀 Watching {row['url']} {every}{nxt}{failing}"


async def stop(ctx: ToolContext, task_id: int) -> str | None:
    """Stop one of the speaking person's watches (it is deleted with what it saw): the line to say, None when they
    have no such watch here."""
    url = await ctx.pool.fetchval(
        "DELETE FROM tasks t USING watches w WHERE w.task_id = t.id AND t.id = $3 AND t.kind = 'watch'"
        f" AND {_SCOPE} RETURNING w.url",
        ctx.user.account_id,
        ctx.task_chat,
        task_id,
    )
    if url is None:
        return None
    ctx.on_tasks_changed()
    return STOPPED.format(url=url)


class WatchPageParams(BaseModel):
    """Parameters of watch_page."""

    action: Literal["watch", "list", "stop"] = "watch"
    url: str | None = Field(default=None, max_length=WATCH_URL_CHARS)
    every_minutes: int | None = Field(default=None, ge=1, le=WATCH_MOST_MINUTES, description="default 60")
    id: int | None = Field(default=None, description="stop: from list")


def watch_page_tool(reader: PageReader) -> Tool:
    """The watch_page tool, reading pages with `reader`."""

    async def watch_page(p: WatchPageParams, ctx: ToolContext) -> dict[str, Any]:
        """Watch, list or stop the speaking person's page watches."""
        now, tz = ctx.now(), ctx.tz
        if p.action == "list":
            rows = await watches(ctx.pool, ctx.user.account_id, ctx.task_chat)
            listed = [{"id": r["id"], "watch": line(r, tz, now)} for r in rows]
            return {"watches": listed, "summary": f"{len(rows)} watch{'es' if len(rows) != 1 else ''}"}
        if p.action == "stop":
            if p.id is None:
                raise ToolError("id is required to stop a watch (action=list shows them)")
            said = await stop(ctx, p.id)
            if said is None:
                raise ToolError(NOT_YOURS.format(id=p.id))
            return {"stopped": p.id, "summary": said}
        if not p.url:
            raise ToolError("url is required to watch a page")
        made = await start(ctx, reader, p.url, p.every_minutes)
        return {
            "id": made.task_id,
            "watching": made.url,
            "title": made.title,
            "every": every_text(made.every_minutes),
            "next_check": fmt_local(made.next_check, tz, now),
            "summary": made.text(tz, now),
        }

    return Tool(
        name="watch_page",
        description="Tell the user when a web page changes; list or stop watches.",
        params=WatchPageParams,
        handler=watch_page,
    )
