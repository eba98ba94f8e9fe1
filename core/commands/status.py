"""/status: how the bot is doing (version, uptime, model, adapters, reminders, MCP, the fleet; admins: spend and
dead letters), from the StatusBoard the adapters and the scheduler report into."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version

from core.commands.base import Ask, Command, CoreParts
from core.commands.board import StatusBoard
from core.commands.model import NO_MODEL_STATUS, your_model
from core.constants import FLEET_SEEN_S
from core.storage import dead_letters, fleet
from core.storage.db import Pool
from core.timeutil import system_clock


def app_version() -> str:
    """The installed version of the bot."""
    try:
        return version("assistant-bot")
    except PackageNotFoundError:
        return "dev"


def _uptime(seconds: float) -> str:
    """`2 d 3 h`, `3 h 12 min` or `45 s`."""
    s = int(seconds)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d} d {h} h"
    if h:
        return f"{h} h {m} min"
    return f"{m} min {sec} s" if m else f"{sec} s"


async def status(ask: Ask) -> str:
    """/status for the asker: admins also see the bot's spend today and the dead letters."""
    core = ask.core
    admin = [await core.spending.status_line(), *await dead_letter_lines(core.pool)] if core.is_admin(ask.inc) else []
    yours = [] if core.settings.model_off else [await your_model(ask)]
    return await status_text(core, core.status_board, yours, admin)


async def status_text(core: CoreParts, board: StatusBoard, yours: Sequence[str] = (), admin: Sequence[str] = ()) -> str:
    """Version, uptime, model (and the asker's: `yours`), adapters, last successful polls, pending reminders, the
    lines only admins see (`admin`: the bot's spend today, dead letters), then the fleet."""
    pending = await core.pool.fetchval(
        "SELECT count(*) FROM tasks WHERE status IN ('pending', 'in_progress') AND due_at IS NOT NULL"
    )
    failed, retrying = await _delivery_counts(core)
    now = system_clock()
    lines = [
        f"**Status** — version {app_version()}",
        f"- uptime: {_uptime(time.monotonic() - board.started_monotonic)}",
        f"- model: {NO_MODEL_STATUS if core.settings.model_off else core.llm.model}",
        *yours,
        "- adapters: " + (", ".join(f"{k} ({v})" for k, v in board.adapters.items()) or "none"),
    ]
    for name, when in board.last_poll.items():
        lines.append(f"- last successful {name} poll: {int((now - when).total_seconds())} s ago")
    lines.append(f"- pending reminders: {pending}")
    lines += [f"- MCP {line}" for line in core.mcp.lines()]
    if retrying:
        lines.append(f"- reminders being retried: {retrying}")
    if failed or board.failed_deliveries:
        lines.append(
            f"- failed reminder deliveries (7 days): {failed}"
            + (f" ({board.failed_deliveries} since this start)" if board.failed_deliveries else "")
        )
    lines += admin
    lines += await _fleet(core.pool, board.process_id)
    return "\n".join(lines)


async def _fleet(pool: Pool, me: str | None) -> list[str]:
    """This process's id and the processes seen in the last minute (nothing while no process beats)."""
    procs = await fleet.seen(pool, timedelta(seconds=FLEET_SEEN_S))
    if [p.id for p in procs] == [me]:
        return [f"- this process: `{me}`, the only one seen in the last minute"]
    lines = [f"- this process: `{me}`"] if me else []
    if procs or me:
        n = f"{len(procs)} process" + ("" if len(procs) == 1 else "es")
        lines.append(f"- fleet: {n} seen in the last minute" + (":" if procs else ""))
    for p in procs:
        mark = " (this one)" if p.id == me else ""
        adapters = ", ".join(p.adapters) or "no adapters"
        lines.append(f"  - `{p.id}`{mark}: {adapters} · version {p.version} · seen {round(p.seen_s_ago)} s ago")
    return lines


async def _delivery_counts(core: CoreParts) -> tuple[int, int]:
    """Reminder occurrences failed in the last 7 days, and ones waiting for a retry (from the database)."""
    row = await core.pool.fetchrow(
        "SELECT (SELECT count(*) FROM occurrences WHERE status = 'failed' AND scheduled_at > $1) AS failed,"
        " (SELECT count(*) FROM occurrences o JOIN tasks t ON t.id = o.task_id WHERE o.status = 'claimed'"
        "  AND o.error IS NOT NULL AND t.due_at = o.scheduled_at AND t.status IN ('pending', 'in_progress'))"
        " AS retrying",
        core.clock() - timedelta(days=7),
    )
    assert row is not None
    return int(row["failed"]), int(row["retrying"])


async def dead_letter_lines(pool: Pool) -> list[str]:
    """The admins' /status line about updates kept as dead letters (none when there are none)."""
    kept = await dead_letters.summary(pool)
    if not kept.count or kept.newest_at is None:
        return []
    ago = _uptime((system_clock() - kept.newest_at).total_seconds())
    return [
        f"- dead letters (updates that could not be stored or read): {kept.count}, newest {ago} ago: "
        f"{kept.newest_reason}"
    ]


STATUS = Command("status", "how the bot is doing", "how the bot is doing", status, private=True)
