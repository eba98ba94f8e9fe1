"""One reminder process for tests/test_reminders_fleet.py: the production engine and scheduler on a database.

`python -m tests.reminders_fleet_worker DSN OUT INSTANCE LEASE_S SWEEP_S HANG_AFTER` runs a ReminderEngine +
ReminderScheduler on the real clock with an outbox that appends `task_id scheduled_at` to OUT (one line per
delivery, flushed at once), prints `ready` once its scheduler has started, and stops cleanly on SIGTERM.
HANG_AFTER > 0: after that many deliveries every further send hangs (a platform that stopped answering), so
the process keeps claims it never finishes, as a process killed mid-send does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from datetime import timedelta
from typing import TextIO

from core.reminders.engine import ReminderEngine
from core.reminders.messages import ReminderMessage
from core.reminders.scheduler import ReminderScheduler
from core.storage.db import create_pool
from core.timeutil import system_clock


class FileOutbox:
    """A platform that records each delivered reminder in this process's own file."""

    def __init__(self, out: TextIO, hang_after: int) -> None:
        """Record into `out`; hang every send after `hang_after` deliveries (0: never)."""
        self.out = out
        self.hang_after = hang_after
        self.sent = 0

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Append one line and flush it (a SIGKILL later cannot take it back), or hang."""
        if self.hang_after and self.sent >= self.hang_after:
            await asyncio.Event().wait()
        self.sent += 1
        self.out.write(f"{msg.task_id} {msg.scheduled_at.isoformat()}\n")
        self.out.flush()
        return str(self.sent)


async def main(out: TextIO, dsn: str, instance: str, lease_s: float, sweep_s: float, hang_after: int) -> None:
    """Run until SIGTERM, then stop the scheduler and close the pool."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    pool = await create_pool(dsn, min_size=1, max_size=4)
    engine = ReminderEngine(
        pool,
        {"telegram": FileOutbox(out, hang_after)},
        system_clock,
        lease=timedelta(seconds=lease_s),
        instance=instance,
    )
    sched = ReminderScheduler(engine, sweep_s=sweep_s)
    await sched.start()
    print("ready", flush=True)
    await stop.wait()
    await sched.stop()
    await pool.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    dsn, out_path, instance, lease_s, sweep_s, hang_after = sys.argv[1:7]
    with open(out_path, "a", encoding="utf-8") as out:
        asyncio.run(main(out, dsn, instance, float(lease_s), float(sweep_s), int(hang_after)))
