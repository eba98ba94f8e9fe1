"""What self-written capabilities cost: writing one, calling one (thread + loop per call), a query, loading at start.

Run with `uv run python -m bench.capability_overhead`. PostgreSQL: DATABASE_URL (a scratch database there)
or an embedded server in a temp dir. No LLM is called: the tools run through the registry as the agent
loop runs them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from bench.common import bench_database, bench_settings, load_average, percentile
from core.agent.llm import LLM
from core.capabilities.manager import WriteCapabilityParams
from core.front_door import Core
from core.storage import conversations
from core.storage.db import create_pool
from core.tools.framework import ToolContext
from core.types import Incoming

TRIVIAL = "async def echo(params):\n    return params.get('text', '')\n"
QUERY = (
    "async def my_open(params, ctx):\n"
    '    return await ctx.query("SELECT count(*) AS n FROM tasks WHERE user_id = capability_user_id()")\n'
)
OBJECT = {"type": "object", "properties": {"text": {"type": "string"}}}


def line(label: str, samples: list[float]) -> str:
    """`label: p50 … p99 … max …` in milliseconds."""
    s = sorted(samples)
    return (
        f"  {label}: p50 {percentile(s, 50) * 1000:.2f} ms, p99 {percentile(s, 99) * 1000:.2f} ms, "
        f"max {s[-1] * 1000:.2f} ms (n={len(s)})"
    )


async def timed_runs(core: Core, ctx: ToolContext, name: str, args: str, n: int) -> list[float]:
    """Run one tool n times through the registry; the seconds each call took."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        envelope = await core.registry.run(name, args, ctx, 30.0)
        out.append(time.perf_counter() - t0)
        assert envelope["ok"], envelope
    return out


async def main(calls: int, loaded: int) -> None:
    """Measure and print."""
    async with bench_database() as db:
        pool = await create_pool(db.dsn)
        with tempfile.TemporaryDirectory(prefix="bench-caps-") as tmp:
            settings = bench_settings("http://127.0.0.1:9/v1", Path(tmp))
            llm = LLM.from_settings(settings)
            try:
                core = Core(settings, pool, llm, capabilities_dir=Path(tmp) / "caps")
                inc = Incoming("console", f"{db.tag}admin", f"{db.tag}admin", "", user_name="Bench")
                user, chat = await conversations.identify(pool, inc, "UTC")
                ctx = ToolContext(pool, user, chat, True, core.clock)
                print(f"{db.description}; Python threads per call; host: {load_average()}")

                writes = []
                for i in range(20):
                    t0 = time.perf_counter()
                    p = WriteCapabilityParams(name="echo", description="echo", code=TRIVIAL + f"# v{i}\n",
                                              parameters_schema=OBJECT)  # fmt: skip
                    await core.capabilities.write(p, ctx)
                    writes.append(time.perf_counter() - t0)
                print("== write_capability: check syntax/import/function/schema, store a version, load ==")
                print(line("per write", writes))

                p = WriteCapabilityParams(
                    name="my_open", description="count", code=QUERY, parameters_schema={"type": "object"}
                )
                await core.capabilities.write(p, ctx)
                print(f"== one call through the registry (arguments validated), {calls} calls each ==")
                tz_args = json.dumps({"timezone": "UTC"})
                print(line("built-in set_timezone (for comparison)",
                           await timed_runs(core, ctx, "set_timezone", tz_args, calls)))  # fmt: skip
                print(line("capability echo (own thread + event loop)",
                           await timed_runs(core, ctx, "echo", json.dumps({"text": "hi"}), calls)))  # fmt: skip
                print(line("capability my_open (one ctx.query, admin path)",
                           await timed_runs(core, ctx, "my_open", "{}", calls)))  # fmt: skip

                for i in range(loaded):
                    name = f"cap_{i:03d}"
                    code = TRIVIAL.replace("echo", name)
                    p = WriteCapabilityParams(name=name, description="x", code=code, parameters_schema=OBJECT)
                    await core.capabilities.write(p, ctx)
                fresh = Core(settings, pool, llm, capabilities_dir=Path(tmp) / "empty")
                t0 = time.perf_counter()
                report = await fresh.capabilities.load_all()
                took = time.perf_counter() - t0
                print("== start-up: materialise + import every enabled capability into an empty directory ==")
                print(f"  {len(report.loaded)} loaded, {len(report.failed)} failed, in {took * 1000:.0f} ms")
            finally:
                await llm.aclose()
                await pool.close()


def cli() -> None:
    """Parse the options and run."""
    parser = argparse.ArgumentParser(prog="python -m bench.capability_overhead", description=__doc__)
    parser.add_argument("--calls", type=int, default=300, help="calls per tool (300)")
    parser.add_argument("--loaded", type=int, default=50, help="capabilities loaded at start-up (50)")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.loaded))


if __name__ == "__main__":
    cli()
