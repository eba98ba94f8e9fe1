"""What self-written capabilities cost, run through the core's tool registry as the agent loop runs them (no model is
called), on a real PostgreSQL: writing one (syntax, import, function and schema checks, a stored version, loading),
calling one (its own thread and event loop per call) beside a built-in tool, one that runs a query through
`ctx.query`, and loading every enabled capability at start. The figures in docs/architecture.md: a call costs about
1 ms, like a built-in tool, and 50 capabilities load at start in a few tenths of a second. Goal: a capability call
within 2 ms of a built-in tool's, and start-up loading under a second for 50. PostgreSQL: DATABASE_URL (a scratch
database on it) or an embedded server in a temp dir.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import bench_core, bench_database, parse, parser, quiet_logging, spread
from core.capabilities.manager import WriteCapabilityParams
from core.front_door import Core
from core.storage import conversations
from core.tools.framework import ToolContext
from core.types import Incoming

TRIVIAL = "async def echo(params):\n    return params.get('text', '')\n"
QUERY = (
    "async def my_open(params, ctx):\n"
    '    return await ctx.query("SELECT count(*) AS n FROM tasks WHERE user_id = capability_user_id()")\n'
)
OBJECT: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}}}


async def timed(n: int, call: Callable[[], Awaitable[object]]) -> str:
    """Await `call` n times: the spread of their milliseconds."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000)
    return spread(sorted(out))


async def run(core: Core, ctx: ToolContext, name: str, args: dict[str, str]) -> None:
    """One tool call through the registry (its arguments validated), which must succeed."""
    envelope = await core.registry.run(name, json.dumps(args), ctx, 30.0)
    assert envelope["ok"], envelope


async def bench(args: argparse.Namespace) -> None:
    """Measure and print."""
    async with bench_database() as db, bench_core(db.dsn, "http://127.0.0.1:9/v1") as core:
        inc = Incoming("console", f"{db.tag}admin", f"{db.tag}admin", "", user_name="Bench")
        user, chat = await conversations.identify(core.pool, inc, "UTC")
        ctx = ToolContext(core.pool, user, chat, True, core.clock, own_words=True)  # an admin in their own chat
        versions = iter(range(1_000_000))

        def write(name: str, code: str, schema: dict[str, Any] = OBJECT) -> Awaitable[object]:
            p = WriteCapabilityParams(name=name, description=name, code=code, parameters_schema=schema)
            return core.capabilities.write(p, ctx)

        print("== write_capability: check syntax/import/function/schema, store a version, load ==")
        print(f"  per write: {await timed(20, lambda: write('echo', TRIVIAL + f'# v{next(versions)}'))}")
        await write("my_open", QUERY, {"type": "object"})
        print(f"== one call through the registry (arguments validated), {args.calls} calls each ==")
        calls: tuple[tuple[str, str, dict[str, str]], ...] = (
            ("built-in set_timezone", "set_timezone", {"timezone": "UTC"}),
            ("capability echo", "echo", {"text": "hi"}),
            ("capability my_open (one query)", "my_open", {}),
        )
        for label, name, params in calls:
            print(f"  {label:<30} {await timed(args.calls, lambda: run(core, ctx, name, params))}")  # noqa: B023
        for i in range(args.loaded):
            await write(f"cap_{i:03d}", TRIVIAL.replace("echo", f"cap_{i:03d}"))
        async with bench_core(db.dsn, "http://127.0.0.1:9/v1") as fresh:  # a new process: empty directory
            t0 = time.perf_counter()
            report = await fresh.capabilities.load_all()
            took = time.perf_counter() - t0
        print("== start-up: materialise and import every enabled capability into an empty directory ==")
        print(f"  {len(report.loaded)} loaded, {len(report.failed)} failed, in {took * 1000:.0f} ms")


def main(argv: list[str] | None = None) -> None:
    """Parse the options and run."""
    p = parser("capability_overhead", __doc__)
    p.add_argument("--calls", type=int, default=300, help="calls per tool (300)")
    p.add_argument("--loaded", type=int, default=50, help="capabilities loaded at start-up (50)")
    args = parse(p, argv, {"calls": 50, "loaded": 10})
    quiet_logging()
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
