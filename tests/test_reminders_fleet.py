"""Reminders across three real OS processes on one database: every occurrence delivered exactly once.

Each process (tests/reminders_fleet_worker.py) runs the production ReminderEngine + ReminderScheduler on the
real clock and records what it delivers in its own file, independent of the reminders' tables. The due times
lie a few real seconds ahead, so the test polls those files (with a timeout) and never sleeps a fixed time.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from core.reminders.engine import ReminderEngine
from core.reminders.messages import ReminderMessage
from core.reminders.scheduler import ReminderScheduler
from core.storage.db import Pool
from tests.conftest import FakeClock

REPO_ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 3
ONE_SHOTS = 300
RECURRING = 5  # every minute, the first occurrence 56-58 s overdue: each series moves on to its next minute
LEASE_S = 2.0  # short, so that the claims of a killed process are taken over within seconds
SWEEP_S = 1.0  # the other processes notice the expired claims at their next sweep
HANG_AFTER = 10  # the process killed in the second test delivers this many, then its sends hang
TIMEOUT_S = 20.0  # polling gives up after this (all is delivered ~4 s after the reminders are created)


@dataclass
class Worker:
    """One reminder process and the file it records its deliveries in."""

    proc: asyncio.subprocess.Process
    out: Path

    def records(self) -> list[tuple[int, datetime]]:
        """The (task id, scheduled time) of every reminder this process delivered so far."""
        if not self.out.exists():
            return []
        lines = self.out.read_text(encoding="utf-8").splitlines()
        return [(int(t), datetime.fromisoformat(s)) for t, s in (line.split() for line in lines if line)]


async def start(dsn: str, tmp: Path, index: int, hang_after: int = 0) -> Worker:
    """Launch one process (cwd the repo root) and wait for its `ready` line."""
    out = tmp / f"deliveries-{index}.txt"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.reminders_fleet_worker",
        dsn,
        str(out),
        f"fleet-{index}",
        str(LEASE_S),
        str(SWEEP_S),
        str(hang_after),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), TIMEOUT_S)
    assert line == b"ready\n", line
    return Worker(proc, out)


async def start_all(dsn: str, tmp: Path, hang_first: int = 0) -> list[Worker]:
    """Launch the three processes at once (the first hanging after `hang_first` sends); none left on failure."""
    started = await asyncio.gather(
        *(start(dsn, tmp, i, hang_first if i == 0 else 0) for i in range(PROCESSES)), return_exceptions=True
    )
    workers = [w for w in started if isinstance(w, Worker)]
    if len(workers) < PROCESSES:
        for w in workers:
            w.proc.kill()
            await w.proc.wait()
        raise next(e for e in started if isinstance(e, BaseException))
    return workers


async def stop(worker: Worker) -> str:
    """SIGTERM one process, wait for it to exit 0, and return what it logged."""
    if worker.proc.returncode is None:
        worker.proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(worker.proc.communicate(), TIMEOUT_S)
    assert worker.proc.returncode == 0, err.decode()
    return err.decode()


async def seed(dsn: str) -> set[tuple[int, datetime]]:
    """300 one-shots due 1.5-4 s from now and 5 every-minute series; the occurrences that must be delivered."""
    conn = await asyncpg.connect(dsn)
    try:
        user_id = await conn.fetchval(
            "INSERT INTO users (platform, platform_user_id, display_name)"
            " VALUES ('telegram', '100', 'Ann') RETURNING id"
        )
        chat_id = await conn.fetchval(
            "INSERT INTO chats (platform, platform_chat_id) VALUES ('telegram', '100') RETURNING id"
        )
        now = datetime.now(UTC)
        ones = [now + timedelta(seconds=1.5 + 2.5 * i / ONE_SHOTS) for i in range(ONE_SHOTS)]
        series = [now - timedelta(seconds=58 - i * 2 / RECURRING) for i in range(RECURRING)]
        rows = await conn.fetch(
            "INSERT INTO tasks (user_id, chat_id, title, due_at, recurrence, timezone)"
            ' SELECT $1, $2, \'fleet \' || ord, due, CASE WHEN ord > $4 THEN \'{"kind": "interval",'
            " \"every_minutes\": 1}'::jsonb END, 'UTC' FROM unnest($3::timestamptz[]) WITH ORDINALITY AS d(due, ord)"
            " RETURNING id, due_at, recurrence IS NOT NULL AS recurring",
            user_id,
            chat_id,
            ones + series,
            ONE_SHOTS,
        )
    finally:
        await conn.close()
    expected = {(r["id"], r["due_at"]) for r in rows}
    expected |= {(r["id"], r["due_at"] + timedelta(minutes=1)) for r in rows if r["recurring"]}  # the next one
    assert len(expected) == ONE_SHOTS + 2 * RECURRING
    return expected


async def wait_for(done: Callable[[], bool], what: str) -> None:
    """Poll until `done()` holds, failing after TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def delivered(workers: list[Worker]) -> Counter[tuple[int, datetime]]:
    """How often each occurrence was delivered, over all processes' records."""
    return Counter(r for w in workers for r in w.records())


async def test_three_processes_deliver_each_occurrence_once(db_dsn: str, tmp_path: Path) -> None:
    workers = await start_all(db_dsn, tmp_path)
    try:
        expected = await seed(db_dsn)
        await wait_for(lambda: set(delivered(workers)) >= expected, "every occurrence to be delivered")
    finally:
        logs = [await stop(w) for w in workers]
    counts = delivered(workers)
    assert set(counts) == expected  # none lost, no other occurrence (a third minute of a series) sent
    assert [k for k, n in counts.items() if n > 1] == []  # none duplicated
    per_process = [len(w.records()) for w in workers]
    assert sum(per_process) == len(expected)
    assert all(n > 0 for n in per_process), per_process  # spread over all three, else this proves little
    assert all("Traceback" not in log and "ERROR" not in log for log in logs), logs


async def test_a_process_killed_mid_send_loses_and_repeats_nothing(db_dsn: str, tmp_path: Path) -> None:
    workers = await start_all(db_dsn, tmp_path, hang_first=HANG_AFTER)
    victim, others = workers[0], workers[1:]
    conn = await asyncpg.connect(db_dsn)
    try:
        expected = await seed(db_dsn)
        held: list[int] = []

        async def victim_stuck() -> bool:
            """The victim delivered its share and now holds claims it is still sending."""
            if len(victim.records()) < HANG_AFTER:
                return False
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE status = 'claimed') AS held,"
                " count(*) FILTER (WHERE status = 'delivered') AS recorded"
                " FROM occurrences WHERE claimed_by = 'fleet-0'"
            )
            assert row is not None
            held.append(int(row["held"]))
            # every send in its file is recorded as delivered: a kill between a send and its record would
            # make another process send that one again (at least once is all a crash there allows)
            return bool(row["recorded"] == HANG_AFTER and row["held"] > 0)

        deadline = time.monotonic() + TIMEOUT_S
        while not await victim_stuck():
            assert time.monotonic() < deadline, "the victim never got stuck holding claims"
            await asyncio.sleep(0.05)
        victim.proc.kill()  # SIGKILL: no clean-up, its leases just run out
        await victim.proc.wait()
        await wait_for(lambda: set(delivered(workers)) >= expected, "every occurrence to be delivered")
        taken_over = await conn.fetchval("SELECT count(*) FROM occurrences WHERE attempts > 1 AND status = 'delivered'")
    finally:
        await conn.close()
        if victim.proc.returncode is None:
            victim.proc.kill()
            await victim.proc.wait()
        logs = [await stop(w) for w in others]
    counts = delivered(workers)
    assert set(counts) == expected
    assert [k for k, n in counts.items() if n > 1] == []
    assert len(victim.records()) == HANG_AFTER
    assert taken_over >= held[-1] > 0  # what the victim held was delivered by the others after its lease
    assert all(len(w.records()) > 0 for w in others), [len(w.records()) for w in others]
    assert all("Traceback" not in log and "ERROR" not in log for log in logs), logs


class HeldOutbox:
    """A platform whose sends wait until the test releases them."""

    def __init__(self) -> None:
        """Nothing sent yet."""
        self.sending = asyncio.Event()
        self.release = asyncio.Event()
        self.sent = 0

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Wait for the release, then count the send."""
        self.sending.set()
        await self.release.wait()
        self.sent += 1
        return str(self.sent)


async def _sending_one(pool: Pool, clock: FakeClock) -> tuple[ReminderScheduler, HeldOutbox]:
    """A running scheduler whose sweep found one due reminder and is held in its send."""
    out = HeldOutbox()
    sched = ReminderScheduler(ReminderEngine(pool, {"telegram": out}, clock), sweep_s=0.05)
    await sched.start()
    await pool.execute(
        "WITH u AS (INSERT INTO users (platform, platform_user_id) VALUES ('telegram', '100') RETURNING id),"
        " c AS (INSERT INTO chats (platform, platform_chat_id) VALUES ('telegram', '100') RETURNING id)"
        " INSERT INTO tasks (user_id, chat_id, title, due_at) SELECT u.id, c.id, 'Deploy', $1 FROM u, c",
        clock.now,
    )
    await asyncio.wait_for(out.sending.wait(), TIMEOUT_S)
    return sched, out


async def test_stop_lets_a_running_delivery_finish(pool: Pool, clock: FakeClock) -> None:
    """SIGTERM in the middle of a send: stop() waits for it and records it (APScheduler's shutdown cancelled it,
    logging an ERROR, and the reminder went out again from another process after the lease)."""
    sched, out = await _sending_one(pool, clock)
    stopping = asyncio.create_task(sched.stop())
    await asyncio.sleep(0)  # stop() has begun
    out.release.set()
    await asyncio.wait_for(stopping, TIMEOUT_S)
    assert out.sent == 1
    assert await pool.fetchval("SELECT status FROM occurrences") == "delivered"


async def test_stop_cuts_a_send_that_outlasts_the_grace(pool: Pool, clock: FakeClock) -> None:
    """A send hanging at SIGTERM holds shutdown for at most the grace; its claim stays for a retry."""
    sched, out = await _sending_one(pool, clock)
    await asyncio.wait_for(sched.stop(grace=0.05), TIMEOUT_S)  # the send never finishes on its own
    assert out.sent == 0
    assert await pool.fetchval("SELECT status FROM occurrences") == "claimed"
