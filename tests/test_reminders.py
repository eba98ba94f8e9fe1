"""Reminders: on time, once, in the user's zone; downtime, two processes, leases, retries, agent jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest

from core.commands import Ask, StatusBoard, status_text
from core.commands.tasks import tasks as tasks_answer
from core.commands.tasks import timezone as timezone_answer
from core.front_door import Core
from core.reminders import queries
from core.reminders.buttons import press
from core.reminders.engine import DeliveryRefused, ReminderEngine
from core.reminders.messages import ReminderMessage
from core.reminders.scheduler import ReminderScheduler
from core.storage.db import Pool
from core.types import Incoming
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, incoming, run

T = TypeVar("T")


class Outbox:
    """A platform that records what it was asked to send: it can fail the first N sends (transient), refuse
    every send (permanent), or hold sends to some chats until released."""

    def __init__(self, fail_first: int = 0, refuse: str = "", hold: frozenset[str] = frozenset()) -> None:
        """Start empty."""
        self.sent: list[ReminderMessage] = []
        self.fail_first = fail_first
        self.refuse = refuse
        self.hold = hold
        self.held = asyncio.Event()  # a held send has started
        self.release = asyncio.Event()
        self.calls = 0

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Record, fail, refuse or hold one send."""
        self.calls += 1
        if self.refuse:
            raise DeliveryRefused(self.refuse)
        if self.calls <= self.fail_first:
            raise ConnectionError("platform down")
        if msg.chat_id in self.hold:
            self.held.set()
            await self.release.wait()
        self.sent.append(msg)
        return str(len(self.sent))


async def soon(aw: Awaitable[T]) -> T:
    """Await an event of the code under test, failing (not hanging) when it never comes."""
    return await asyncio.wait_for(aw, 5)


async def _never(_: float) -> None:
    """Lease renewal that never comes round (the test clock does not move while a send runs)."""
    await asyncio.Event().wait()


class Steps:
    """An injected sleep the test releases one wait at a time (for the lease keeper)."""

    def __init__(self) -> None:
        """No waits yet."""
        self.entered: asyncio.Queue[float] = asyncio.Queue()
        self.go: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(self, s: float) -> None:
        """Report the wait, then wait for the test."""
        self.entered.put_nowait(s)
        await self.go.get()


def engine(pool: Pool, clock: FakeClock, outbox: Outbox | None, **kw: Any) -> ReminderEngine:
    """An engine on the test database whose clock is the test's (no outbox: no adapter running)."""
    kw.setdefault("sleep", _never)
    return ReminderEngine(pool, {"telegram": outbox} if outbox else {}, clock, **kw)


async def occurrence(pool: Pool) -> Any:
    """The only occurrence row."""
    row = await pool.fetchrow("SELECT status, attempts, lease_until, error, delivered_at FROM occurrences")
    assert row is not None
    return row


async def create(core: Core, fake: FakeOpenAI, args: dict[str, Any], *, user: str = "100", **kw: Any) -> None:
    """Have the model create a task for `user` in their private chat."""
    fake.script(Reply(tool_calls=[("manage_tasks", {"action": "create", **args})]), Reply(text="ok"))
    answer(await run(core, incoming("task", user=user, **kw)))


async def due_now(make_core: MakeCore, fake: FakeOpenAI, clock: FakeClock, title: str) -> Core:
    """A core whose model created a one-shot task due at 10:01, with the clock moved to that minute."""
    core = make_core()
    await create(core, fake, {"title": title, "due_at": "2026-11-21T10:01"})
    clock.advance(minutes=1)
    return core


async def test_one_shot_on_time_once_in_local_time(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core(DEFAULT_TIMEZONE="Europe/Berlin")
    await create(core, fake_llm, {"title": "Buy milk", "due_at": "2026-11-21T12:30"})
    out = Outbox()
    eng = engine(pool, clock, out)
    assert await eng.tick() == 0  # 11:00 Berlin: not yet
    clock.now = datetime(2026, 11, 21, 11, 30, 1, tzinfo=UTC)  # 12:30:01 Berlin
    requests = len(fake_llm.requests)
    assert await eng.tick() == 1
    assert await eng.tick() == 0  # once
    [msg] = out.sent
    assert msg.text == "⏰ Buy milk — due 12:30" and msg.chat_id == "100" and msg.owner_id == "100"
    assert msg.buttons == ("done", "snooze10", "snooze60")
    assert len(fake_llm.requests) == requests  # a plain reminder never calls the LLM
    row = await pool.fetchrow("SELECT status, ran_at, delivered_at, late FROM occurrences")
    assert row is not None and row["status"] == "delivered" and row["late"] is False
    assert row["ran_at"] is not None and row["delivered_at"] is not None


async def test_snooze_and_done(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Stretch", "due_at": "2026-11-21T10:05"})
    out = Outbox()
    eng = engine(pool, clock, out)
    clock.advance(minutes=5)
    assert await eng.tick() == 1
    ok, text = await press(pool, clock, platform="telegram", presser_id="100", task_id=1, action="snooze10")
    assert ok and text == "😴 Snoozed: Stretch — until 10:15"
    clock.advance(minutes=9)
    assert await eng.tick() == 0
    clock.advance(minutes=1)
    assert await eng.tick() == 1 and len(out.sent) == 2
    ok, text = await press(pool, clock, platform="telegram", presser_id="100", task_id=1, action="done")
    assert ok and text == "✅ Done: Stretch"
    assert await pool.fetchval("SELECT status FROM tasks") == "done"


async def test_done_ends_a_series(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Water", "recurrence": {"kind": "interval", "every_minutes": 60}})
    out = Outbox()
    eng = engine(pool, clock, out)
    clock.advance(minutes=60)
    assert await eng.tick() == 1
    clock.advance(minutes=60)
    assert await eng.tick() == 1
    await press(pool, clock, platform="telegram", presser_id="100", task_id=1, action="done")
    clock.advance(minutes=60)
    assert await eng.tick() == 0 and len(out.sent) == 2


async def test_other_user_cannot_press(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Mine", "due_at": "2026-11-21T11:00"})
    ok, text = await press(pool, clock, platform="telegram", presser_id="666", task_id=1, action="done")
    assert not ok and "Only the person" in text
    ok, _ = await press(pool, clock, platform="discord", presser_id="100", task_id=1, action="done")
    assert not ok
    assert await pool.fetchval("SELECT status FROM tasks") == "pending"


async def test_daily_stays_local_across_dst(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    clock.now = datetime(2026, 3, 28, 7, 0, tzinfo=UTC)  # Sat 08:00 CET, the day before summer time
    core = make_core(DEFAULT_TIMEZONE="Europe/Berlin")
    await create(core, fake_llm, {"title": "Meds", "recurrence": {"kind": "cron", "time": "09:00"}})
    out = Outbox()
    eng = engine(pool, clock, out)
    clock.now = datetime(2026, 3, 28, 8, 0, 5, tzinfo=UTC)  # 09:00 CET
    assert await eng.tick() == 1
    # the next one is 09:00 CEST = 07:00 UTC, not 08:00 UTC
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 3, 29, 7, 0, tzinfo=UTC)
    clock.now = datetime(2026, 3, 29, 7, 0, 5, tzinfo=UTC)
    assert await eng.tick() == 1
    assert [m.text for m in out.sent] == ["⏰ Meds — due 09:00", "⏰ Meds — due 09:00"]


async def test_downtime_rules(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "One-shot", "due_at": "2026-11-21T11:00"})
    await create(core, fake_llm, {"title": "Hourly", "recurrence": {"kind": "interval", "every_minutes": 60}})
    await create(core, fake_llm, {"title": "Ancient", "due_at": "2026-11-21T10:30"})
    # the bot was down: ancient's time is pushed back beyond the grace window
    await pool.execute("UPDATE tasks SET due_at = $1 WHERE title = 'Ancient'", clock.now - timedelta(hours=30))
    clock.advance(hours=5, minutes=30)  # 15:30: one-shot missed once, hourly missed five times
    out = Outbox()
    assert await engine(pool, clock, out).tick() == 2
    texts = sorted(m.text for m in out.sent)
    assert texts == ["⏰ Hourly — was due 15:00", "⏰ One-shot — was due 11:00"]  # only the latest hourly one
    assert await pool.fetchval("SELECT due_at FROM tasks WHERE title = 'Hourly'") == datetime(
        2026, 11, 21, 16, 0, tzinfo=UTC
    )
    skipped = await pool.fetchrow(
        "SELECT o.status, o.error FROM occurrences o JOIN tasks t ON t.id = o.task_id WHERE t.title = 'Ancient'"
    )
    assert skipped is not None and skipped["status"] == "skipped"
    assert await engine(pool, clock, out).tick() == 0


async def test_between_hourly_full_sweeps_only_times_that_left_the_grace_window_are_read(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Soon", "due_at": "2026-11-21T10:20"})
    asked: list[datetime | None] = []
    stale = queries.stale

    async def seen(*a: Any) -> Any:
        asked.append(a[4] if len(a) > 4 else None)
        return await stale(*a)

    monkeypatch.setattr(queries, "stale", seen)
    eng = engine(pool, clock, Outbox(), grace=timedelta(minutes=5))
    first = clock.now  # 10:00
    await eng.tick()  # the first sweep reads every past-due task (the process may have been down)
    clock.advance(minutes=15)
    await eng.tick()  # then only what left the grace window since the last sweep (and a minute before)
    clock.advance(minutes=25)  # Soon (due 10:20) left the window between the two sweeps: skipped all the same
    await eng.tick()
    window = timedelta(minutes=6)
    assert asked == [None, first - window, first + timedelta(minutes=15) - window]
    status = await pool.fetchval("SELECT o.status FROM occurrences o JOIN tasks t ON t.id = o.task_id")
    assert status == "skipped"


async def test_two_schedulers_on_one_database(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "t0", "due_at": "2026-11-21T10:00:30"})
    for i in range(1, 40):
        await pool.execute(
            "INSERT INTO tasks (user_id, chat_id, title, due_at) SELECT u.id, c.id, $1, $2 FROM users u, chats c",
            f"t{i}",
            clock.now + timedelta(seconds=i % 5),
        )
    clock.advance(minutes=1)
    a, b = Outbox(), Outbox()
    results = await asyncio.gather(engine(pool, clock, a, batch=7).tick(), engine(pool, clock, b, batch=7).tick())
    assert sum(results) == 40
    titles = sorted(m.text for m in a.sent + b.sent)
    assert len(titles) == len(set(titles)) == 40  # none lost, none doubled
    assert await pool.fetchval("SELECT count(*) FROM occurrences WHERE status = 'delivered'") == 40


async def test_claim_left_by_a_crashed_process_is_retried_after_the_lease(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Orphan", "due_at": "2026-11-21T10:10"})
    clock.advance(minutes=10)
    # another process claimed it and died before sending
    await pool.execute(
        "INSERT INTO occurrences (task_id, scheduled_at, claimed_by, lease_until) SELECT id, due_at, 'dead', $1"
        " FROM tasks",
        clock.now + timedelta(minutes=2),
    )
    out = Outbox()
    eng = engine(pool, clock, out, lease=timedelta(minutes=2))
    assert await eng.tick() == 0  # the lease still holds
    clock.advance(minutes=2, seconds=1)
    assert await eng.tick() == 1
    assert out.sent[0].text == "⏰ Orphan — was due 10:10"
    assert await pool.fetchval("SELECT attempts FROM occurrences") == 2


async def test_agent_job_runs_a_turn_and_falls_back_when_llm_down(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(
        core,
        fake_llm,
        {"title": "Morning summary", "job": "summarise my open tasks", "recurrence": {"kind": "cron", "time": "11:00"}},
    )
    out = Outbox()
    eng = engine(pool, clock, out, agent=core.answer_text)
    clock.now = datetime(2026, 11, 21, 11, 0, 1, tzinfo=UTC)
    fake_llm.script(Reply(text="You have 1 open task: Morning summary."))
    assert await eng.tick() == 0  # agent jobs run as their own tasks
    assert await eng.drain() == 1
    assert out.sent[0].text == "⏰ Morning summary\n\nYou have 1 open task: Morning summary."
    assert "summarise my open tasks" in fake_llm.requests[-1]["messages"][-1]["content"]
    fake_llm.down()
    clock.now = datetime(2026, 11, 22, 11, 0, 1, tzinfo=UTC)
    await eng.tick()
    assert await eng.drain() == 1
    assert out.sent[1].text == "⏰ Morning summary — due 11:00"


async def test_sweep_never_calls_llm_when_nothing_due(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Later", "job": "do things", "due_at": "2026-11-22T10:00"})
    requests = len(fake_llm.requests)
    eng = engine(pool, clock, Outbox(), agent=core.answer_text)
    for _ in range(5):
        assert await eng.tick() == 0
    assert len(fake_llm.requests) == requests


async def test_apscheduler_date_job_fires_on_time(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    from core.timeutil import system_clock

    core = make_core()
    await run(core, incoming("hi"))  # creates the user and chat
    out = Outbox()
    eng = ReminderEngine(pool, {"telegram": out}, system_clock)
    sched = ReminderScheduler(eng, sweep_s=3600)
    await sched.start()
    try:
        due = system_clock() + timedelta(seconds=0.6)
        await pool.execute(
            "INSERT INTO tasks (user_id, chat_id, title, due_at) SELECT u.id, c.id, 'Soon', $1 FROM users u, chats c",
            due,
        )
        sched.tasks_changed()  # what manage_tasks triggers
        delivered_at = None
        for _ in range(40):  # at most 2 s of real time
            delivered_at = await pool.fetchval("SELECT delivered_at FROM occurrences")
            if delivered_at is not None:
                break
            await asyncio.sleep(0.05)
        assert out.sent and out.sent[0].text.startswith("⏰ Soon — due")
        assert delivered_at is not None
        lateness = delivered_at - due
        assert timedelta(0) <= lateness < timedelta(seconds=1)
    finally:
        await sched.stop()


@pytest.mark.parametrize("kind", ["group"])
async def test_group_reminder_goes_to_the_group(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock, kind: str
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Standup", "due_at": "2026-11-21T10:15"}, chat="-500", kind=kind)
    clock.advance(minutes=15)
    out = Outbox()
    assert await engine(pool, clock, out).tick() == 1
    assert (out.sent[0].chat_id, out.sent[0].chat_kind, out.sent[0].owner_id) == ("-500", "group", "100")


async def test_transient_failures_retry_with_growing_backoff_until_delivered(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    await due_now(make_core, fake_llm, clock, "Retry")
    out = Outbox(fail_first=8)
    eng = engine(pool, clock, out)
    waits = []
    for _ in range(8):
        assert await eng.tick() == 0
        row = await occurrence(pool)
        assert row["status"] == "claimed" and row["error"] == "ConnectionError: platform down"
        waits.append((row["lease_until"] - clock.now).total_seconds())
        assert await eng.tick() == 0  # not before its next attempt
        clock.now = row["lease_until"]
    assert waits == [5, 10, 20, 40, 80, 160, 300, 300]  # growing, capped at 5 min
    assert await eng.tick() == 1
    row = await occurrence(pool)
    assert row["status"] == "delivered" and row["attempts"] == 9 and row["error"] is None
    assert out.calls == 9 and len(out.sent) == 1
    assert out.sent[0].text.startswith("⏰ Retry — was due")
    assert eng.failed_deliveries == 0


async def test_a_long_outage_keeps_retrying_every_five_minutes(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    # hours of a platform outage: the 45th attempt's wait would pass the largest timedelta if it kept doubling
    await due_now(make_core, fake_llm, clock, "Outage")
    out = Outbox(fail_first=2)
    eng = engine(pool, clock, out)
    assert await eng.tick() == 0
    clock.now = (await occurrence(pool))["lease_until"]
    await pool.execute("UPDATE occurrences SET attempts = 60")
    assert await eng.tick() == 0
    row = await occurrence(pool)
    assert row["status"] == "claimed" and (row["lease_until"] - clock.now).total_seconds() == 300
    clock.now = row["lease_until"]
    assert await eng.tick() == 1 and len(out.sent) == 1


async def test_no_adapter_yet_is_retried_and_survives_a_restart(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = await due_now(make_core, fake_llm, clock, "Early")
    assert await engine(pool, clock, None).tick() == 0  # the Telegram adapter is not running yet
    row = await occurrence(pool)
    assert row["status"] == "claimed" and "no telegram adapter is running" in row["error"]
    status = await status_text(core, StatusBoard())
    assert "reminders being retried: 1" in status and "failed" not in status
    tasks = await tasks_answer(Ask(incoming("/tasks"), {}, core))
    assert "Reminders not sent yet" in tasks and "no telegram adapter is running" in tasks
    clock.advance(seconds=5)
    out = Outbox()
    assert await engine(pool, clock, out).tick() == 1  # another process (a restart) picks up the retry
    assert (await occurrence(pool))["status"] == "delivered" and len(out.sent) == 1


async def test_a_retry_of_a_task_done_or_snoozed_meanwhile_is_neither_sent_nor_listed(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = await due_now(make_core, fake_llm, clock, "Call Bob")
    out = Outbox(fail_first=1)
    eng = engine(pool, clock, out)
    assert await eng.tick() == 0  # the first attempt failed: retrying
    assert "reminders being retried: 1" in await status_text(core, StatusBoard())
    ok, _ = await press(pool, clock, platform="telegram", presser_id="100", task_id=1, action="snooze10")
    assert ok
    clock.advance(seconds=5)
    assert await eng.tick() == 0 and out.calls == 1  # the old time is not retried after the snooze
    assert "Reminders not sent yet" not in await tasks_answer(Ask(incoming("/tasks"), {}, core))
    assert "being retried" not in await status_text(core, StatusBoard())
    clock.advance(minutes=10)
    assert await eng.tick() == 1 and out.sent[0].text.startswith("⏰ Call Bob")  # the snoozed time is sent


async def test_refusal_ends_it_as_failed_shown_in_tasks_and_status(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Daily", "recurrence": {"kind": "cron", "time": "10:30"}})
    clock.advance(minutes=30)
    out = Outbox(refuse="Forbidden: bot was blocked by the user")
    eng = engine(pool, clock, out)
    assert await eng.tick() == 0
    row = await occurrence(pool)
    assert row["status"] == "failed" and row["error"] == "Forbidden: bot was blocked by the user"
    assert eng.failed_deliveries == 1 and out.calls == 1
    # the series moves on to tomorrow; nothing is retried
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 11, 22, 10, 30, tzinfo=UTC)
    clock.advance(minutes=10)
    assert await eng.tick() == 0 and out.calls == 1
    tasks = await tasks_answer(Ask(incoming("/tasks"), {}, core))
    assert "could not be delivered" in tasks and "Forbidden: bot was blocked by the user" in tasks
    # counted from the database: a fresh process (empty board) still shows it
    assert "failed reminder deliveries (7 days): 1" in await status_text(core, StatusBoard())


async def test_grace_window_ends_retries_visibly(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Short", "due_at": "2026-11-21T10:01"})
    await create(core, fake_llm, {"title": "Hourly", "recurrence": {"kind": "interval", "every_minutes": 60}})
    clock.advance(minutes=1)
    out = Outbox(fail_first=999)
    eng = engine(pool, clock, out, grace=timedelta(seconds=30))
    for _ in range(3):  # 10:01:00, :05, :15; the next try is at the end of the window, :30 (not :35)
        assert await eng.tick() == 0
        clock.now = await pool.fetchval("SELECT lease_until FROM occurrences WHERE status = 'claimed'")
    assert clock.now == datetime(2026, 11, 21, 10, 1, 30, tzinfo=UTC)
    assert await eng.tick() == 0
    row = await occurrence(pool)
    assert row["status"] == "failed"
    assert row["error"] == "not delivered within 30 s (last error: ConnectionError: platform down)"
    calls = out.calls
    clock.advance(minutes=10)
    assert await eng.tick() == 0 and out.calls == calls  # ended, not retried
    # a retry left behind when the bot went down past the grace window: ended by the sweep, series moves on
    clock.now = datetime(2026, 11, 21, 11, 0, 0, tzinfo=UTC)
    eng = engine(pool, clock, out, grace=timedelta(hours=1))
    assert await eng.tick() == 0
    clock.advance(hours=2)
    assert await eng.tick() == 0
    hourly = await pool.fetchrow(
        "SELECT o.status, o.error, t.due_at FROM occurrences o JOIN tasks t ON t.id = o.task_id"
        " WHERE t.title = 'Hourly'"
    )
    assert (
        hourly is not None and hourly["status"] == "failed" and hourly["error"].startswith("not delivered within 1 h")
    )
    assert hourly["due_at"] == datetime(2026, 11, 21, 14, 0, tzinfo=UTC)
    tasks = await tasks_answer(Ask(incoming("/tasks"), {}, core))
    assert "#2 Hourly — was due Sat 21 Nov 11:00 UTC: not delivered within 1 h" in tasks
    assert "failed reminder deliveries (7 days): 2" in await status_text(core, StatusBoard())


async def test_retry_times_get_date_jobs(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    await due_now(make_core, fake_llm, clock, "Blip")
    sched = ReminderScheduler(engine(pool, clock, Outbox(fail_first=1)), sweep_s=3600)
    await sched.wake()
    retry_at = datetime(2026, 11, 21, 10, 1, 5, tzinfo=UTC)
    assert [j.id for j in sched.scheduler.get_jobs()] == [f"due:{retry_at.isoformat()}"]
    await sched.engine.close()


async def test_outcome_recorded_when_sent_not_after_the_slowest(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Slow", "due_at": "2026-11-21T10:01"}, user="100")
    await create(core, fake_llm, {"title": "Fast", "due_at": "2026-11-21T10:01"}, user="200")
    clock.advance(minutes=1)
    out = Outbox(hold=frozenset({"100"}))
    tick = asyncio.create_task(engine(pool, clock, out).tick())
    await soon(out.held.wait())
    for _ in range(200):  # tiny waits until the fast one is recorded, while the slow one is still sending
        if await pool.fetchval("SELECT count(*) FROM occurrences WHERE status = 'delivered'") == 1:
            break
        await asyncio.sleep(0.005)
    assert (
        await pool.fetchval(
            "SELECT t.title FROM occurrences o JOIN tasks t ON t.id = o.task_id WHERE o.status = 'delivered'"
        )
        == "Fast"
    )
    out.release.set()
    assert await tick == 2


async def test_plain_reminder_never_waits_for_an_agent_job(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Summary", "job": "summarise", "due_at": "2026-11-21T10:01"})
    await create(core, fake_llm, {"title": "Plain", "due_at": "2026-11-21T10:01"})
    clock.advance(minutes=1)
    started, finish = asyncio.Event(), asyncio.Event()

    async def slow_agent(_: Incoming) -> str:
        started.set()
        await finish.wait()
        return "all done"

    out = Outbox()
    eng = engine(pool, clock, out, agent=slow_agent)
    assert await soon(eng.tick()) == 1  # returns while the agent job still runs
    await soon(started.wait())
    assert [m.text for m in out.sent] == ["⏰ Plain — due 10:01"]
    assert await pool.fetchval("SELECT count(*) FROM occurrences WHERE status = 'delivered'") == 1
    finish.set()
    assert await eng.drain() == 1
    assert out.sent[1].text == "⏰ Summary\n\nall done"


@pytest.mark.parametrize("slow", ["send", "agent job"])
async def test_lease_renewed_while_sending_so_no_second_process_resends(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock, slow: str
) -> None:
    core = make_core()
    job = {"job": "summarise"} if slow == "agent job" else {}
    await create(core, fake_llm, {"title": "Slow", "due_at": "2026-11-21T10:01", **job})
    clock.advance(minutes=1)
    finish = asyncio.Event()

    async def slow_agent(_: Incoming) -> str:
        await finish.wait()
        return "summary"

    a_out = Outbox(hold=frozenset({"100"}) if slow == "send" else frozenset())
    a_out.release = finish
    steps = Steps()
    a = engine(pool, clock, a_out, agent=slow_agent, sleep=steps.sleep, lease=timedelta(minutes=2))
    b_out = Outbox()
    b = engine(pool, clock, b_out, agent=slow_agent, lease=timedelta(minutes=2))
    tick = asyncio.create_task(a.tick())
    assert await soon(steps.entered.get()) == 40  # a third of the lease
    for _ in range(4):  # 4 renewals, 40 s apart: 2 min 40 s in all, longer than the lease
        clock.advance(seconds=40)
        steps.go.put_nowait(None)
        await soon(steps.entered.get())  # renewed, sleeping again
        assert await b.tick() == 0
    assert await pool.fetchval("SELECT lease_until FROM occurrences") == clock.now + timedelta(minutes=2)
    finish.set()
    await tick
    await a.drain()
    assert len(a_out.sent) == 1 and b_out.calls == 0
    row = await occurrence(pool)
    assert row["status"] == "delivered" and row["attempts"] == 1
    clock.advance(minutes=5)
    assert await b.tick() == 0 and b_out.calls == 0


async def test_latest_missed_is_arithmetic_for_intervals(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Minutely", "recurrence": {"kind": "interval", "every_minutes": 1}})
    clock.advance(minutes=600, seconds=30)  # down for 10 h: 600 occurrences missed (old code stopped at 500)
    out = Outbox()
    assert await engine(pool, clock, out).tick() == 1
    assert out.sent[0].text == "⏰ Minutely — was due 20:00"
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 11, 21, 20, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "rec",
    [
        {"kind": "cron", "time": "09:00"},
        {"kind": "cron", "time": "02:30"},  # skipped/doubled at the DST changes
        {"kind": "cron", "time": "07:15", "days_of_week": "mon-fri"},
        {"kind": "cron", "time": "09:00", "day_of_month": "31"},
        {"kind": "interval", "every_minutes": 97},
    ],
)
def test_latest_time_matches_stepping_forward_with_few_trigger_steps(
    rec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from apscheduler.triggers.cron import CronTrigger

    from core.reminders import recurrence
    from core.timeutil import zone

    r = recurrence.Recurrence.model_validate(rec)
    tz = zone("Europe/Berlin")
    start = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
    times = recurrence.next_times(r, tz, start - timedelta(microseconds=1), start, count=400)
    assert len(set(times)) == len(times)  # stepping forward never repeats (the doubled hour in October)
    nows = [start + timedelta(days=d, hours=h) for d in (0, 1, 3, 40, 86, 298) for h in (0, 7, 13)]
    for now in [t for t in nows if t <= times[-1]]:
        expected = max((t for t in times if t <= now), default=None)
        assert recurrence.latest_time(r, tz, start, now) == expected, now
    calls = 0
    original = CronTrigger.get_next_fire_time

    def counting(self: CronTrigger, prev: datetime | None, now: datetime) -> Any:
        nonlocal calls
        calls += 1
        return original(self, prev, now)

    monkeypatch.setattr(CronTrigger, "get_next_fire_time", counting)
    recurrence.latest_time(r, tz, start, start + timedelta(hours=23))  # one missed within a day's grace
    assert calls <= 12  # the old loop asked the trigger for 500 fire times


async def test_daily_follows_a_zone_change_between_occurrences(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core(DEFAULT_TIMEZONE="Europe/Berlin")
    await create(core, fake_llm, {"title": "Meds", "recurrence": {"kind": "cron", "time": "12:00"}})
    out = Outbox()
    eng = engine(pool, clock, out, default_tz="Europe/Berlin")
    clock.now = datetime(2026, 11, 21, 11, 0, 5, tzinfo=UTC)  # 12:00 in Berlin
    assert await eng.tick() == 1
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 11, 22, 11, 0, tzinfo=UTC)
    answer_text = await timezone_answer(Ask(incoming("/timezone"), {"zone": "America/New_York"}, core))
    assert "America/New_York" in answer_text
    # the next one is 12:00 in New York (17:00 UTC, today there), computed and shown there
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 11, 21, 17, 0, tzinfo=UTC)
    assert "Sat 21 Nov 12:00 EST" in await tasks_answer(Ask(incoming("/tasks"), {}, core))
    clock.now = datetime(2026, 11, 21, 17, 0, 5, tzinfo=UTC)
    assert await eng.tick() == 1
    assert out.sent[1].text == "⏰ Meds — due 12:00"
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 11, 22, 17, 0, tzinfo=UTC)
    # the same at once after the set_timezone tool (a sweep checks every zone only once an hour)
    fake_llm.script(Reply(tool_calls=[("set_timezone", {"timezone": "Asia/Tokyo"})]), Reply(text="ok"))
    answer(await run(core, incoming("I moved to Tokyo")))
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
    assert await eng.tick() == 0
    clock.now = datetime(2026, 11, 22, 3, 0, 5, tzinfo=UTC)
    assert await eng.tick() == 1 and out.sent[2].text == "⏰ Meds — due 12:00"
