"""Recurring schedules in the user's zone, with next times from APScheduler's triggers (DST-correct), and a stored
task's next and latest missed times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from asyncpg import Record
from pydantic import BaseModel, Field, field_validator, model_validator

from core.constants import NEXT_OCCURRENCES
from core.timeutil import zone

_DAY_NAMES = {"mon", "tue", "wed", "thu", "fri", "sat", "sun"}


class Recurrence(BaseModel):
    """How a task repeats."""

    kind: Literal["cron", "interval"] = Field(
        description="cron: at a time of day on given days; interval: every N minutes"
    )
    time: str | None = Field(default=None, description="cron: local HH:MM")
    days_of_week: str | None = Field(default=None, description="cron: e.g. mon-fri or sat,sun; omitted: daily")
    day_of_month: str | None = Field(default=None, description="cron: 1-31 or last; omitted: any")
    every_minutes: int | None = Field(default=None, ge=1, le=525600, description="interval: minutes between")

    @field_validator("time")
    @classmethod
    def _check_time(cls, v: str | None) -> str | None:
        """Accept HH:MM (24 h)."""
        if v is None:
            return v
        hh, sep, mm = v.strip().partition(":")
        if not sep or not hh.isdigit() or not mm.isdigit() or int(hh) > 23 or int(mm) > 59:
            raise ValueError("time must be HH:MM in 24-hour form, e.g. 07:30")
        return f"{int(hh):02d}:{int(mm):02d}"

    @field_validator("days_of_week")
    @classmethod
    def _check_days(cls, v: str | None) -> str | None:
        """Accept APScheduler day-of-week expressions made of day names."""
        if v is None:
            return v
        cleaned = v.strip().lower().replace(" ", "")
        for part in cleaned.split(","):
            for name in part.split("-"):
                if name[:3] not in _DAY_NAMES:
                    raise ValueError("days_of_week uses mon..sun, e.g. mon-fri or sat,sun")
        return ",".join("-".join(n[:3] for n in part.split("-")) for part in cleaned.split(","))

    @model_validator(mode="after")
    def _check_kind(self) -> Recurrence:
        """Each kind needs its own fields."""
        if self.kind == "cron" and self.time is None:
            raise ValueError("a cron recurrence needs time (HH:MM)")
        if self.kind == "interval" and self.every_minutes is None:
            raise ValueError("an interval recurrence needs every_minutes")
        return self


def trigger(rec: Recurrence, tz: ZoneInfo, start: datetime | None) -> CronTrigger | IntervalTrigger:
    """The APScheduler trigger for a recurrence in `tz` (interval anchored at `start`)."""
    if rec.kind == "interval":
        assert rec.every_minutes is not None
        return IntervalTrigger(minutes=rec.every_minutes, start_date=start, timezone=tz)
    assert rec.time is not None
    hh, mm = rec.time.split(":")
    return CronTrigger(
        day_of_week=rec.days_of_week or "*",
        day=rec.day_of_month or "*",
        hour=int(hh),
        minute=int(mm),
        timezone=tz,
    )


def fire_at_or_after(trig: CronTrigger | IntervalTrigger, when: datetime) -> datetime | None:
    """The trigger's first fire time at or after `when`.

    In the hour repeated when summer time ends, CronTrigger can answer a time before `when` (02:30 CET for
    02:30:00.000001 CET); then look again an hour later, so callers stepping forward never loop."""
    nxt: datetime | None = trig.get_next_fire_time(None, when)
    for _ in range(3):
        if nxt is None or nxt >= when:
            return nxt
        when += timedelta(hours=1)
        nxt = trig.get_next_fire_time(None, when)
    return nxt


def next_times(
    rec: Recurrence, tz: ZoneInfo, after: datetime, start: datetime | None, count: int = NEXT_OCCURRENCES
) -> list[datetime]:
    """The next `count` occurrences strictly after `after`, in UTC."""
    trig = trigger(rec, tz, start)
    out: list[datetime] = []
    cursor = after + timedelta(microseconds=1)
    for _ in range(count):
        nxt = fire_at_or_after(trig, cursor)
        if nxt is None:
            break
        out.append(nxt.astimezone(UTC))
        cursor = nxt + timedelta(microseconds=1)
    return out


def latest_time(
    rec: Recurrence, tz: ZoneInfo, start: datetime, now: datetime, *, first_window: timedelta = timedelta(days=1)
) -> datetime | None:
    """The latest occurrence in [start, now] (an interval is anchored at `start`), in UTC; None if there is none.

    Intervals are arithmetic. A cron recurrence fires at most about once a day, so it is searched backwards
    from `now` in windows that double (1, 2, 4, ... days): a few trigger steps, however long ago `start` is."""
    if now < start:
        return None
    if rec.kind == "interval":
        assert rec.every_minutes is not None
        step = timedelta(minutes=rec.every_minutes)
        return (start + step * ((now - start) // step)).astimezone(UTC)
    trig = trigger(rec, tz, None)
    hi, span = now, first_window
    while hi >= start:
        lo = max(start, hi - span)
        best: datetime | None = None
        t = fire_at_or_after(trig, lo)
        while t is not None and t <= hi:
            best = t
            t = fire_at_or_after(trig, t + timedelta(microseconds=1))
        if best is not None:
            return best.astimezone(UTC)
        hi, span = lo - timedelta(microseconds=1), span * 2
    return None


def describe(rec: Recurrence) -> str:
    """A short human description, e.g. `every mon-fri at 08:00` or `every 90 min`."""
    if rec.kind == "interval":
        assert rec.every_minutes is not None
        m = rec.every_minutes
        return f"every {m // 60} h" if m % 60 == 0 and m >= 60 else f"every {m} min"
    days = f"{rec.days_of_week} " if rec.days_of_week else "day "
    dom = f"on day {rec.day_of_month} " if rec.day_of_month else ""
    return f"every {days}{dom}at {rec.time}".replace("every day on day", "every month on day")


def from_json(data: Any) -> Recurrence | None:
    """The recurrence stored in a task's jsonb column; None for a one-shot task."""
    return Recurrence.model_validate(data) if data else None


def zone_name(row: Record, default_tz: str | None) -> str:
    """The owner's current zone: theirs, else the bot's default, else the zone the task was set in."""
    return str(row["user_tz"] or default_tz or row["task_tz"] or "UTC")


def next_due(row: Record, after: datetime, start: datetime, default_tz: str | None = None) -> datetime | None:
    """A recurring task's next occurrence strictly after `after` (None for a one-shot task)."""
    rec = from_json(row["recurrence"])
    if rec is None:
        return None
    times = next_times(rec, zone(zone_name(row, default_tz)), after, start, count=1)
    return times[0] if times else None


def latest_missed(row: Record, now: datetime, default_tz: str | None = None) -> datetime:
    """For a recurring task behind schedule, its latest occurrence not after `now` (bounded work)."""
    rec = from_json(row["recurrence"])
    scheduled: datetime = row["scheduled_at"]
    if rec is None:
        return scheduled
    latest = latest_time(rec, zone(zone_name(row, default_tz)), scheduled, now)
    return latest if latest is not None and latest > scheduled else scheduled
