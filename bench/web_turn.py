"""What a web search and a page fetch add to a turn: sequential private turns through `Core.handle` on a real
PostgreSQL, the fake model (tests.fake_openai, in this process) answering at once, in three kinds: a plain answer;
one `web_search` (a fake SearXNG on 127.0.0.1 answering at once) then the answer; one `web_fetch` of an article page
on 127.0.0.1 (WEB_ALLOW_PRIVATE) then the answer. Medians side by side, and what each tool call adds over the plain
turn's two model calls (a tool turn asks the model twice). PostgreSQL: DATABASE_URL or an embedded server.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import time
from collections.abc import Callable

from aiohttp import web

from bench.common import bench_core, bench_database, parse, parser, percentile, quiet_logging, spread
from core.front_door import Core
from core.types import Assistant, Incoming
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_web_fetch import Site, article, html

Script = Callable[[int], list[Reply]]  # turn n → the replies the model gives in it


def incoming(tag: str, n: int) -> Incoming:
    """Turn n: one of 8 private chats, round robin."""
    user = n % 8
    return Incoming("telegram", f"{tag}u{user}", f"{tag}u{user}", f"question {n}", message_id=f"{tag}m{n}")


async def timed(core: Core, fake: FakeOpenAI, tag: str, turns: int, script: Script) -> list[float]:
    """Each turn's ms (fails loudly when one is not answered)."""
    times = []
    for n in range(turns):
        fake.script(*script(n))
        t0 = time.perf_counter()
        last = None
        async for event in core.handle(incoming(tag, n)):
            last = event
        times.append((time.perf_counter() - t0) * 1000)
        if not isinstance(last, Assistant):
            raise SystemExit(f"turn {n} of {tag} was not answered: {last}")
    return times


async def searx(request: web.Request) -> web.StreamResponse:
    """A SearXNG JSON answer with 5 results, at once."""
    found = [
        {"title": f"Result {i}", "url": f"https://r{i}.example.org/", "content": "snippet " * 20} for i in range(5)
    ]
    return web.json_response({"results": found})


async def run(args: argparse.Namespace) -> int:
    """The three kinds, one after another, on one core."""
    async with bench_database() as db, Site({"/search": searx, "/page": html(article(12))}) as site:
        base = f"http://127.0.0.1:{site.port}"
        allow = f"127.0.0.1:{site.port}"
        settings = {"SEARXNG_URL": base, "WEB_ALLOW_PRIVATE": allow, "USER_DAILY_WEB_CALLS": str(10**8)}
        fake_llm = FakeOpenAI(default=Reply(text="ok"))
        async with fake_llm as fake, bench_core(db.dsn, fake.base_url, settings=settings) as core:
            kinds: dict[str, Script] = {
                "plain answer": lambda n: [Reply(text="ok")],
                "web_search + answer": lambda n: [
                    Reply(tool_calls=[("web_search", {"query": f"tides {n}", "count": 5})]),
                    Reply(text="ok"),
                ],
                "web_fetch + answer": lambda n: [
                    Reply(tool_calls=[("web_fetch", {"url": f"{base}/page?n={n}"})]),
                    Reply(text="ok"),
                ],
                "manage_tasks list + answer": lambda n: [
                    Reply(tool_calls=[("manage_tasks", {"action": "list"})]),
                    Reply(text="ok"),
                ],
            }
            results: dict[str, list[float]] = {}
            try:
                for i, (name, script) in enumerate(kinds.items()):
                    await timed(core, fake, f"{db.tag}w{i}", args.warmup, script)
                    results[name] = sorted(await timed(core, fake, f"{db.tag}x{i}", args.turns, script))
            finally:
                await core.close()  # the search provider's HTTP session
    print(f"== What a web call adds to a turn: {args.turns} sequential turns each, after {args.warmup} warm-up ==")
    base_tool = percentile(results["manage_tasks list + answer"], 50)
    for name, ms in results.items():
        extra = "" if name == "plain answer" else f"   ({percentile(ms, 50) - base_tool:+.2f} ms over a tool turn)"
        print(f"  {name:<28} p50 {percentile(ms, 50):7.2f} ms   ({spread(ms)}){extra}")
    print(
        "  a tool turn asks the model twice: compare a web turn with the manage_tasks turn for the web call's own cost"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run."""
    p = parser("web_turn", __doc__)
    p.add_argument("--turns", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    args = parse(p, argv, {"turns": 20, "warmup": 3})
    quiet_logging()
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
