"""Reminders: on time, once, in the user's zone; downtime, two processes, leases, retries, agent jobs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.db import Pool
from core.reminders import ReminderEngine, ReminderMessage, ReminderScheduler, press
from core.service import Core
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, incoming, run


class Outbox:
    """A platform that records what it was asked to send (optionally failing the first sends)."""

    def __init__(self, fail_first: int = 0) -> None:
        """Start empty."""
        self.sent: list[ReminderMessage] = []
        self.fail_first = fail_first
        self.calls = 0

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Record (or fail) one send."""
        self.calls += 1
        if self.calls <= self.fail_first:
            raise ConnectionError("platform down")
        self.sent.append(msg)
        return str(len(self.sent))


async def _no_sleep(_: float) -> None:
    """Backoff without waiting (the test clock does not move)."""


def engine(pool: Pool, clock: FakeClock, outbox: Outbox, **kw: Any) -> ReminderEngine:
    """An engine on the test database whose clock is the test's."""
    return ReminderEngine(pool, {"telegram": outbox}, clock, sleep=_no_sleep, **kw)


async def create(core: Core, fake: FakeOpenAI, args: dict[str, Any], *, user: str = "100", **kw: Any) -> None:
    """Have the model create a task for `user` in their private chat."""
    fake.script(Reply(tool_calls=[("manage_tasks", {"action": "create", **args})]), Reply(text="ok"))
    answer(await run(core, incoming("task", user=user, **kw)))


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
    skipped = await pool.fetchrow("SELECT o.status, o.error FROM occurrences o JOIN tasks t ON t.id = o.task_id"
                                  " WHERE t.title = 'Ancient'")  # fmt: skip
    assert skipped is not None and skipped["status"] == "skipped"
    assert await engine(pool, clock, out).tick() == 0


async def test_two_schedulers_on_one_database(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "t0", "due_at": "2026-11-21T10:00:30"})
    for i in range(1, 40):
        await pool.execute(
            "INSERT INTO tasks (user_id, chat_id, title, due_at) SELECT u.id, c.id, $1, $2 FROM users u, chats c",
            f"t{i}", clock.now + timedelta(seconds=i % 5),
        )  # fmt: skip
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
        " FROM tasks", clock.now + timedelta(minutes=2),
    )  # fmt: skip
    out = Outbox()
    eng = engine(pool, clock, out, lease=timedelta(minutes=2))
    assert await eng.tick() == 0  # the lease still holds
    clock.advance(minutes=2, seconds=1)
    assert await eng.tick() == 1
    assert out.sent[0].text == "⏰ Orphan — was due 10:10"
    assert await pool.fetchval("SELECT attempts FROM occurrences") == 2


async def test_send_failing_twice_then_succeeding(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Retry", "due_at": "2026-11-21T10:01"})
    clock.advance(minutes=1)
    out = Outbox(fail_first=2)
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    eng = ReminderEngine(pool, {"telegram": out}, clock, sleep=sleep, backoff_s=0.5)
    assert await eng.tick() == 1
    assert out.calls == 3 and waits == [0.5, 1.0]
    assert await pool.fetchval("SELECT status FROM occurrences") == "delivered"


async def test_delivery_that_finally_fails_is_recorded(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock, allowed_errors: list[str]
) -> None:
    allowed_errors.append("could not be delivered")
    core = make_core()
    await create(core, fake_llm, {"title": "Doomed", "due_at": "2026-11-21T10:01"})
    clock.advance(minutes=1)
    eng = engine(pool, clock, Outbox(fail_first=99), send_attempts=3)
    assert await eng.tick() == 0
    assert eng.failed_deliveries == 1
    row = await pool.fetchrow("SELECT status, error FROM occurrences")
    assert row is not None and row["status"] == "failed" and "platform down" in row["error"]
    assert await eng.tick() == 0  # not retried forever


async def test_agent_job_runs_a_turn_and_falls_back_when_llm_down(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Morning summary", "job": "summarise my open tasks",
                                  "recurrence": {"kind": "cron", "time": "11:00"}})  # fmt: skip
    out = Outbox()
    eng = engine(pool, clock, out, agent=core.answer_text)
    clock.now = datetime(2026, 11, 21, 11, 0, 1, tzinfo=UTC)
    fake_llm.script(Reply(text="You have 1 open task: Morning summary."))
    assert await eng.tick() == 1
    assert out.sent[0].text == "⏰ Morning summary\n\nYou have 1 open task: Morning summary."
    assert "summarise my open tasks" in fake_llm.requests[-1]["messages"][-1]["content"]
    fake_llm.down()
    clock.now = datetime(2026, 11, 22, 11, 0, 1, tzinfo=UTC)
    assert await eng.tick() == 1
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
    eng = ReminderEngine(pool, {"telegram": out}, system_clock, sleep=_no_sleep)
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


async def test_final_failure_counted_in_status(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock, allowed_errors: list[str]
) -> None:
    from core.commands import Commands, StatusBoard

    allowed_errors.append("could not be delivered")
    core = make_core()
    await create(core, fake_llm, {"title": "Lost", "due_at": "2026-11-21T10:01"})
    board = StatusBoard()

    def count() -> None:
        board.failed_deliveries += 1

    clock.advance(minutes=1)
    eng = engine(pool, clock, Outbox(fail_first=99), send_attempts=2, on_failure=count)
    assert await eng.tick() == 0
    assert "failed deliveries: 1" in await Commands(core).status(board)
