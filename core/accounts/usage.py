"""Token usage and spending limits: each model call's tokens per account and model, the budgets checked before each
call (USER_DAILY_TOKENS, USER_MONTHLY_TOKENS, an admin's /budget, BOT_DAILY_TOKENS), /usage, /budget and the admins'
line of /status. The figures live in PostgreSQL (sql/022); writes happen in the background, never losing an answer."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from asyncpg import Record

from core.agent.llm import LLMReply, Usage
from core.constants import USAGE_BUSY_POLL_S, USAGE_CALL_RESERVE, USAGE_LEASE_MARGIN
from core.settings import PLATFORMS, Settings
from core.storage.db import Pool
from core.timeutil import Clock, zone
from core.types import Tokens, UserRef

log = logging.getLogger(__name__)

_ADMIT_SQL = "SELECT usage_admit($1, $2, $3, $4, $5, $6, $7, $8)"
_RECORD_SQL = "SELECT usage_record($1, $2, $3, $4, $5, $6, $7, $8)"
_RELEASE_SQL = "DELETE FROM token_reservations WHERE id = $1"
_ACCOUNT_SQL = "SELECT coalesce(timezone, $2) AS tz, daily_tokens FROM accounts WHERE id = $1"
_USAGE_SQL = """
SELECT model, day >= ($2::timestamptz AT TIME ZONE $3)::date AS today, sum(prompt_tokens)::bigint AS prompt,
       sum(completion_tokens)::bigint AS completion, sum(cached_tokens)::bigint AS cached, sum(calls)::bigint AS calls
FROM token_usage
WHERE account_id = $1 AND day >= date_trunc('month', ($2::timestamptz AT TIME ZONE $3)::date)::date
GROUP BY 1, 2 ORDER BY 1
"""
_BOT_SQL = """
SELECT coalesce(sum(prompt_tokens), 0)::bigint AS prompt, coalesce(sum(completion_tokens), 0)::bigint AS completion,
       coalesce(sum(cached_tokens), 0)::bigint AS cached, coalesce(sum(calls), 0)::bigint AS calls
FROM token_usage_bot WHERE day = ($1::timestamptz AT TIME ZONE $2)::date
"""
_SET_BUDGET_SQL = """
UPDATE accounts SET daily_tokens = $3 WHERE id = (
    SELECT account_id FROM users WHERE platform = $1 AND platform_user_id = $2) RETURNING id
"""

# usage_record's arguments: identity, reservation, at, default time zone, model, prompt, completion, cached tokens
UsageRow = tuple[int, int | None, datetime, str, str, int, int, int]

WEB = "(web)"  # token_usage rows of a person's web searches and fetches: calls, no tokens (USER_DAILY_WEB_CALLS)
_WEB_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended('web calls ' || $1::bigint, 0))"
_WEB_TODAY_SQL = """
WITH today AS (SELECT ($2::timestamptz AT TIME ZONE coalesce(timezone, $3))::date AS day FROM accounts WHERE id = $1)
SELECT day, (SELECT coalesce(sum(calls), 0) FROM token_usage u
             WHERE account_id = $1 AND model = $4 AND u.day = today.day)::bigint AS used
FROM today
"""
_WEB_ADD_SQL = """
WITH bumped AS (
    UPDATE token_usage SET calls = calls + 1
    WHERE id = (SELECT id FROM token_usage WHERE account_id = $1 AND day = $2 AND model = $3 LIMIT 1) RETURNING id)
INSERT INTO token_usage (account_id, day, model, calls) SELECT $1, $2, $3, 1 WHERE NOT EXISTS (SELECT 1 FROM bumped)
"""
WEB_SPENT = "refused: you used your {cap:,} web searches and fetches for today; more tomorrow."

WHOSE = {
    "day": "You have used your daily budget",
    "month": "You have used your monthly budget",
    "bot": "The bot has used its daily budget",
}
BUDGET_USAGE = (
    "Use /budget <platform:id> <tokens per day> (e.g. /budget telegram:123456 20000), or /budget <platform:id> off."
)
BUDGET_ADMINS_ONLY = "Only an admin can set budgets."


@dataclass(frozen=True)
class Spent:
    """Tokens summed over some calls."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    calls: int = 0

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens: what a budget counts."""
        return self.prompt + self.completion

    def plus(self, other: Spent) -> Spent:
        """Both together."""
        return Spent(
            self.prompt + other.prompt,
            self.completion + other.completion,
            self.cached + other.cached,
            self.calls + other.calls,
        )


def _spent(row: Record) -> Spent:
    """A Spent from a row with prompt, completion, cached and calls."""
    return Spent(int(row["prompt"]), int(row["completion"]), int(row["cached"]), int(row["calls"]))


def next_midnight(now: datetime, tz: ZoneInfo) -> datetime:
    """The next 00:00 in `tz` after `now`."""
    return datetime.combine(now.astimezone(tz).date() + timedelta(days=1), time(0), tzinfo=tz)


def next_month(now: datetime, tz: ZoneInfo) -> datetime:
    """00:00 on the first of the next month in `tz`."""
    local = now.astimezone(tz).date()
    first = date(local.year + local.month // 12, local.month % 12 + 1, 1)
    return datetime.combine(first, time(0), tzinfo=tz)


def span(seconds: float) -> str:
    """`2 d 3 h`, `3 h 12 min`, `3 h` or `5 min` (rounded up to a minute)."""
    minutes = max(1, math.ceil(seconds / 60))
    d, rest = divmod(minutes, 1440)
    h, m = divmod(rest, 60)
    if d:
        return f"{d} d {h} h" if h else f"{d} d"
    if h:
        return f"{h} h {m} min" if m else f"{h} h"
    return f"{m} min"


def resets(at: datetime, now: datetime, tz: ZoneInfo) -> str:
    """`at 00:00 (in 3 h 12 min)`, or `on Tue 1 Dec at 00:00 (in 9 d 14 h)` when further than a day, in `tz`."""
    local, wait = at.astimezone(tz), span((at - now).total_seconds())
    if at - now <= timedelta(days=1):
        return f"at {local:%H:%M} (in {wait})"
    return f"on {local:%a} {local.day} {local:%b} at {local:%H:%M} (in {wait})"


def over_line(verdict: Mapping[str, Any], now: datetime, default_tz: str) -> str:
    """The one line a person gets past a budget: which one, how much is used, when it resets (in their zone)."""
    which, tz = str(verdict["over"]), zone(verdict.get("tz"), default_tz)
    if which == "month":
        at = next_month(now, tz)
    else:
        at = next_midnight(now, zone(default_tz) if which == "bot" else tz)
    used, cap = int(verdict["used"]), int(verdict["cap"])
    return f"{WHOSE.get(which, WHOSE['day'])}: {used:,} of {cap:,} tokens. It resets {resets(at, now, tz)}."


class Spending:
    """The budgets of one Core: the arguments of the admission folded into a turn's start, the meters of its turns,
    and the usage writes they leave running in the background."""

    def __init__(self, pool: Pool, settings: Settings, clock: Clock) -> None:
        """Budgets from `settings`; times from `clock`."""
        self.pool, self.settings, self.clock = pool, settings, clock
        self.lease = timedelta(seconds=settings.AGENT_STEP_TIMEOUT) + USAGE_LEASE_MARGIN
        self._writes: set[asyncio.Task[None]] = set()

    def admission(self, now: datetime) -> tuple[Any, ...]:
        """usage_admit's arguments after the account (sql/022), for the turn's start to check its first call."""
        s = self.settings
        return (
            now,
            s.DEFAULT_TIMEZONE,
            s.USER_DAILY_TOKENS,
            s.USER_MONTHLY_TOKENS,
            s.BOT_DAILY_TOKENS,
            USAGE_CALL_RESERVE,
            self.lease,
        )

    def meter(self, user: UserRef, verdict: Any, *, defer: bool = False) -> TurnMeter:
        """The meter of one turn whose start returned `verdict` for its first model call (`defer`: see TurnMeter)."""
        return TurnMeter(self, user, verdict, defer=defer)

    async def admit(self, account_id: int) -> Any:
        """Check (and admit) one model call: usage_admit's verdict."""
        return await self.pool.fetchval(_ADMIT_SQL, account_id, *self.admission(self.clock()))

    def record(self, user: UserRef, reservation: int | None, model: str, usage: Usage) -> asyncio.Task[None]:
        """Write one call's usage (and free its reservation) in the background."""
        return self.write(self.usage_row(user, reservation, model, usage))

    def usage_row(self, user: UserRef, reservation: int | None, model: str, usage: Usage) -> UsageRow:
        """usage_record's arguments (sql/022) for one call's usage, stamped now."""
        at, tz = self.clock(), self.settings.DEFAULT_TIMEZONE
        return (user.id, reservation, at, tz, model, usage.prompt, usage.completion, usage.cached)

    def write(self, row: UsageRow) -> asyncio.Task[None]:
        """Write one call's usage (usage_row's arguments) in the background."""
        return self._later(self._write(_RECORD_SQL, *row))

    def embedded(self, user: UserRef, model: str, prompt_tokens: int) -> asyncio.Task[None]:
        """Write one embedding call's usage in the background (metered only: no budget is checked before one)."""
        return self.record(user, None, model, Usage(prompt_tokens, 0))

    def release(self, reservation: int) -> asyncio.Task[None]:
        """Free a reservation whose call reported no usage (or never ran), in the background."""
        return self._later(self._write(_RELEASE_SQL, reservation))

    def _later(self, write: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a write as a task of its own, kept until it ends (flush() waits for them)."""
        task = asyncio.get_running_loop().create_task(write)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _write(self, sql: str, *args: Any) -> None:
        """One usage write; a failure is logged (the answer it belongs to goes out all the same)."""
        try:
            await self.pool.execute(sql, *args)
        except Exception as e:
            log.warning("token usage not recorded: %s: %s", type(e).__name__, e)

    async def flush(self) -> None:
        """Wait for the usage writes started so far."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    # ---- /usage, /budget, /status -----------------------------------------------------------------------------

    def money(self, spent: Spent) -> str:
        """` ≈ 0.0123 USD` when prices are set, else ``."""
        s = self.settings
        if s.LLM_PRICE_INPUT is None and s.LLM_PRICE_OUTPUT is None:
            return ""
        amount = (spent.prompt * (s.LLM_PRICE_INPUT or 0.0) + spent.completion * (s.LLM_PRICE_OUTPUT or 0.0)) / 1e6
        shown = f"{amount:.2f}" if amount >= 0.1 or amount == 0 else f"{amount:.4f}"
        return f" ≈ {shown} {s.LLM_PRICE_CURRENCY}"

    def _model_line(self, model: str, spent: Spent) -> str:
        """`- gpt-4o-mini: 12,345 tokens (10,000 prompt, 4,000 of them cached; 2,345 completion) in 3 calls`."""
        cached = f", {spent.cached:,} of them cached" if spent.cached else ""
        calls = "1 call" if spent.calls == 1 else f"{spent.calls:,} calls"
        return (
            f"- {model}: {spent.tokens:,} tokens ({spent.prompt:,} prompt{cached}; {spent.completion:,} completion)"
            f" in {calls}{self.money(spent)}"
        )

    def _period(self, title: str, by_model: Mapping[str, Spent]) -> list[str]:
        """A period's lines: one per model, and a total when there are several."""
        if not by_model:
            return [f"**{title}:** nothing yet"]
        lines = [f"**{title}:**", *(self._model_line(m, s) for m, s in by_model.items())]
        if len(by_model) > 1:
            total = Spent()
            for s in by_model.values():
                total = total.plus(s)
            lines.append(f"- all models: {total.tokens:,} tokens{self.money(total)}")
        return lines

    async def web_call(self, user: UserRef) -> str | None:
        """Count one web search or fetch of the person's (at most USER_DAILY_WEB_CALLS a day of theirs, across
        processes): None when it may go, else the line saying why not."""
        cap = self.settings.USER_DAILY_WEB_CALLS
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(_WEB_LOCK_SQL, user.account_id)
            tz = self.settings.DEFAULT_TIMEZONE
            row = await conn.fetchrow(_WEB_TODAY_SQL, user.account_id, self.clock(), tz, WEB)
            if row is None:
                return None  # the account went (forgotten mid-turn): nothing to count against
            if row["used"] >= cap:
                return WEB_SPENT.format(cap=cap)
            await conn.execute(_WEB_ADD_SQL, user.account_id, row["day"], WEB)
        return None

    async def report(self, user: UserRef) -> str:
        """/usage: today's and this month's tokens per model (money when prices are set), and the budget left."""
        now, s = self.clock(), self.settings
        account = await self.pool.fetchrow(_ACCOUNT_SQL, user.account_id, s.DEFAULT_TIMEZONE)
        tz_name = account["tz"] if account is not None else s.DEFAULT_TIMEZONE
        rows = await self.pool.fetch(_USAGE_SQL, user.account_id, now, tz_name)
        today: dict[str, Spent] = {}
        month: dict[str, Spent] = {}
        web = sum(r["calls"] for r in rows if r["model"] == WEB and r["today"])
        for r in (r for r in rows if r["model"] != WEB):
            month[r["model"]] = month.get(r["model"], Spent()).plus(_spent(r))
            if r["today"]:
                today[r["model"]] = today.get(r["model"], Spent()).plus(_spent(r))
        lines = [f"**Your token usage** ({tz_name})", *self._period("Today", today), *self._period("This month", month)]
        day_cap = account["daily_tokens"] if account is not None and account["daily_tokens"] is not None else None
        lines += await self._left(
            now,
            zone(tz_name),
            day_cap if day_cap is not None else s.USER_DAILY_TOKENS,
            sum(x.tokens for x in today.values()),
            sum(x.tokens for x in month.values()),
        )
        if web:
            lines.append(f"Web searches and fetches today: {web:,} of {s.USER_DAILY_WEB_CALLS:,}.")
        return "\n".join(lines)

    async def _left(self, now: datetime, tz: ZoneInfo, day_cap: int | None, day: int, month: int) -> list[str]:
        """The budget lines of /usage."""
        s = self.settings
        budgets = [
            ("today", day_cap, day, next_midnight(now, tz)),
            ("this month", s.USER_MONTHLY_TOKENS, month, next_month(now, tz)),
        ]
        lines = [
            f"Budget {label}: {max(0, cap - used):,} of {cap:,} tokens left; it resets {resets(at, now, tz)}."
            for label, cap, used, at in budgets
            if cap is not None
        ]
        if s.BOT_DAILY_TOKENS is not None:
            bot = await self.bot_today(now)
            left = max(0, s.BOT_DAILY_TOKENS - bot.tokens)
            at = next_midnight(now, zone(s.DEFAULT_TIMEZONE))
            lines.append(
                f"The bot's daily budget (everyone's): {left:,} of {s.BOT_DAILY_TOKENS:,} tokens left; it "
                f"resets {resets(at, now, tz)}."
            )
        return lines or ["No token budget applies to you."]

    async def bot_today(self, now: datetime) -> Spent:
        """The whole bot's usage today (a day of DEFAULT_TIMEZONE)."""
        row = await self.pool.fetchrow(_BOT_SQL, now, self.settings.DEFAULT_TIMEZONE)
        return Spent() if row is None else _spent(row)

    async def status_line(self) -> str:
        """The admins' line of /status: the whole bot's spend today."""
        s, spent = self.settings, await self.bot_today(self.clock())
        cap = f" of {s.BOT_DAILY_TOKENS:,} (BOT_DAILY_TOKENS)" if s.BOT_DAILY_TOKENS is not None else ""
        calls = "1 model call" if spent.calls == 1 else f"{spent.calls:,} model calls"
        return f"- spend today ({s.DEFAULT_TIMEZONE}): {spent.tokens:,} tokens{cap} in {calls}{self.money(spent)}"

    async def set_budget(self, identity: str, tokens: str) -> str:
        """/budget (admins): the daily budget of an identity's account, or `off` for USER_DAILY_TOKENS again."""
        platform, _, uid = identity.strip().partition(":")
        platform, uid = platform.lower(), uid.strip()
        amount = tokens.strip().replace(",", "").replace("_", "").lower()
        if platform not in PLATFORMS or not uid or not (amount == "off" or (amount.isascii() and amount.isdigit())):
            return BUDGET_USAGE
        value = None if amount == "off" else int(amount[:16])
        if value is not None and value >= 10**15:
            return BUDGET_USAGE
        who = f"{platform}:{uid}"
        if await self.pool.fetchval(_SET_BUDGET_SQL, platform, uid, value) is None:
            return f"I don't know {who} yet: they have to write to me once first."
        if value is not None:
            return f"The daily budget of {who} (their whole account) is now {value:,} tokens."
        default = self.settings.USER_DAILY_TOKENS
        back = (
            f"{default:,} tokens (USER_DAILY_TOKENS)" if default is not None else "no cap (USER_DAILY_TOKENS is unset)"
        )
        return f"The daily budget of {who} is the default again: {back}."


class TurnMeter:
    """The budget check before each model call of one turn, and the record of each call's usage after it. With
    `defer`, a call's usage waits to be written until the turn's next step (flush: its tool calls are stored, or the
    next call is admitted) or its end (close), so the turn's answer can take it along into its own statement (take)."""

    def __init__(self, spending: Spending, user: UserRef, verdict: Any, *, defer: bool = False) -> None:
        """`verdict`: what the turn's start said about its first call (usage_admit's; None: no budget applies)."""
        self.spending, self.user = spending, user
        self._defer = defer
        self._unwritten: UsageRow | None = None  # the last call's usage, deferred and not written yet
        self._first: Any = verdict  # used by the first admit()
        self._fresh = True
        self._capped = verdict is not None  # no budget applied at the start: none is checked for the rest of the turn
        self._reservation: int | None = None
        self._pending: asyncio.Task[None] | None = None
        self.used = Tokens()  # the turn's calls so far, as reported (the HTTP API's OpenAI endpoint shows them)

    async def admit(self) -> str | None:
        """None to go ahead with a model call, or the line saying which budget is used up."""
        self.flush()  # the previous call's usage first (the check below waits for it)
        if self._fresh:
            self._fresh, verdict = False, self._first
            if isinstance(verdict, Mapping) and verdict.get("missing"):  # a new identity: its account is there now
                verdict = await self._ask()
        elif not self._capped:
            return None
        else:
            verdict = await self._ask()
        if isinstance(verdict, Mapping) and verdict.get("busy"):
            verdict = await self._wait()
        if not isinstance(verdict, Mapping) or verdict.get("missing"):  # no budget applies, or the account is gone
            return None
        if verdict.get("busy"):  # still, after a whole lease (their clock stands still?): not worth stopping for
            log.warning(
                "the calls in flight of account %s did not end within %s", self.user.account_id, self.spending.lease
            )
            return None
        if "ok" in verdict:
            self._reservation = int(verdict["ok"])
            return None
        return over_line(verdict, self.spending.clock(), self.spending.settings.DEFAULT_TIMEZONE)

    async def _ask(self) -> Any:
        """usage_admit's verdict now, after this turn's own last usage is written."""
        if self._pending is not None:
            await asyncio.wait([self._pending])
        return await self.spending.admit(self.user.account_id)

    async def _wait(self) -> Any:
        """Ask again until the account's calls in flight are recorded (or their reservations lapse): at once when this
        process's own usage writes are done (often the previous turn's), then every USAGE_BUSY_POLL_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.spending.lease.total_seconds()
        await self.spending.flush()
        verdict = await self._ask()
        while isinstance(verdict, Mapping) and verdict.get("busy") and loop.time() < deadline:
            await asyncio.sleep(USAGE_BUSY_POLL_S)
            verdict = await self._ask()
        return verdict

    def spent(self, reply: LLMReply | None) -> None:
        """After a model call: record its usage (free its reservation) in the background; never raises."""
        reservation, self._reservation = self._reservation, None
        try:
            if reply is not None and reply.usage is not None:
                u, used = reply.usage, self.used
                self.used = Tokens(used.prompt + u.prompt, used.completion + u.completion, used.cached + u.cached)
                self.flush()
                row = self.spending.usage_row(self.user, reservation, reply.model, reply.usage)
                if self._defer:
                    self._unwritten = row
                else:
                    self._pending = self.spending.write(row)
            elif reservation is not None:
                self._pending = self.spending.release(reservation)
        except Exception as e:  # no running loop, …: the usage is lost, the answer is not
            log.warning("token usage not recorded: %s", e)

    def flush(self) -> None:
        """Write a deferred call's usage now, in the background; never raises."""
        row, self._unwritten = self._unwritten, None
        if row is not None:
            self.write_later(row)

    def take(self) -> UsageRow | None:
        """The deferred usage of the last call, for the caller to write in its own statement (the answer's); it is
        no longer this meter's to write (write_later gives it back when that statement fails)."""
        row, self._unwritten = self._unwritten, None
        return row

    def write_later(self, row: UsageRow) -> None:
        """Write a call's usage in the background; never raises."""
        try:
            self._pending = self.spending.write(row)
        except Exception as e:  # no running loop, …: the usage is lost, the answer is not
            log.warning("token usage not recorded: %s", e)

    def close(self) -> None:
        """The turn is over: write a deferred usage, and free a reservation no call used (also the start's, when no
        call was made)."""
        self.flush()
        if self._fresh and isinstance(self._first, Mapping) and "ok" in self._first:
            self._fresh, self._reservation = False, int(self._first["ok"])
        self.spent(None)
