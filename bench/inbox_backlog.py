"""The inbox under a backlog: what one more claim costs while thousands of updates wait (as after an outage, when
Telegram hands over what piled up). Stores `--waiting` updates of 1,000 chats (3 each by default) in the inbox table at
once, leases 64 of them (one process busy), then times `--pairs` rounds of what that process does as each answer goes
out: finish one update, claim the next; measured with the statistics the table has right after the burst (none, as on a
fresh table or one full of handled updates), and after ANALYZE. Goal: a claim <= 2 ms p50 with 3,000 waiting, whatever
the statistics (one round trip and a short walk of an index). PostgreSQL: DATABASE_URL (a scratch database on it) or an
embedded server in a temp dir.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncio
import time

from bench.common import bench_database, goal_line, parse, parser, percentile, quiet_logging
from core.constants import INBOX_CONCURRENCY, INBOX_LEASE_S
from core.storage import inbox_table as store
from core.storage.db import Pool, create_pool

CHATS = 1000
GOAL_CLAIM_P50_MS = 2.0
PAYLOAD = {"message": {"text": "x" * 200, "chat": {"id": 1}, "from": {"id": 1}}}  # about a Telegram update's size


async def fill(pool: Pool, first_id: int, waiting: int) -> None:
    """Store `waiting` updates round-robin over CHATS chats, in update_id order."""
    await pool.executemany(
        "INSERT INTO inbox (platform, update_id, chat_key, payload) VALUES ('telegram', $1, $2, $3)",
        [(first_id + k, f"telegram:{k % CHATS}", PAYLOAD) for k in range(waiting)],
    )


async def rounds(pool: Pool, pairs: int) -> tuple[list[float], list[float]]:
    """Lease INBOX_CONCURRENCY updates, then `pairs` times finish the oldest held one and claim one more: the ms of
    each claim and of each finish + claim."""
    held = await store.claim(pool, "bench", ["telegram"], INBOX_LEASE_S, INBOX_CONCURRENCY)
    claims, both = [], []
    for _ in range(pairs):
        t0 = time.perf_counter()
        await store.finish(pool, held.pop(0))
        t1 = time.perf_counter()
        held += await store.claim(pool, "bench", ["telegram"], INBOX_LEASE_S, 1)
        t2 = time.perf_counter()
        claims.append(1000 * (t2 - t1))
        both.append(1000 * (t2 - t0))
    await pool.execute("UPDATE inbox SET done_at = now(), owner = NULL, lease_until = NULL WHERE done_at IS NULL")
    return sorted(claims), sorted(both)


def show(label: str, claims: list[float], both: list[float]) -> None:
    """One line of figures."""
    print(
        f"  {label:<30} claim {goal_line('p50', percentile(claims, 50), GOAL_CLAIM_P50_MS)}, "
        f"p99 {percentile(claims, 99):.2f} ms; finish + claim p50 {percentile(both, 50):.2f} ms"
    )


async def bench(waiting: int, pairs: int) -> None:
    """Both runs on one database."""
    async with bench_database() as db:
        print(f"{waiting} updates waiting in {CHATS} chats, {INBOX_CONCURRENCY} leased, {pairs} finish + claim rounds")
        pool = await create_pool(db.dsn, min_size=1, max_size=2)
        try:
            await fill(pool, 1, waiting)
            show("statistics as after the burst", *await rounds(pool, pairs))
            await fill(pool, 1 + waiting, waiting)
            await pool.execute("ANALYZE inbox")
            show("after ANALYZE", *await rounds(pool, pairs))
        finally:
            await pool.close()


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and run."""
    p = parser("inbox_backlog", __doc__)
    p.add_argument("--waiting", type=int, default=3000, help="updates stored at once (3000)")
    p.add_argument("--pairs", type=int, default=1500, help="finish + claim rounds (1500)")
    args = parse(p, argv, {"waiting": 600, "pairs": 200})
    quiet_logging()
    asyncio.run(bench(args.waiting, args.pairs))


if __name__ == "__main__":
    main()
