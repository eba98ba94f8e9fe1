"""What the bot adds to one MCP tool call: the same `echo` tool of the same server (the SDK's MCPServer of
tests/mcp_servers.py) called directly with the SDK's `Client`, and through the bot as the agent loop calls it
(`registry.run`: the arguments checked against the tool's schema, the speaker's access checked, the call through the
server's long-lived Connection, the result made safe for the prompt). Over stdio (a child process each) and over
Streamable HTTP (the server in this process). Goal: the bot adds at most 2 ms p50. PostgreSQL (for the tool pins): an
embedded server in a temp dir, or DATABASE_URL.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from bench.common import bench_core, bench_database, goal_line, parse, parser, percentile, quiet_logging, spread
from core.front_door import Core
from core.storage import conversations
from core.tools.framework import ToolContext
from core.types import Incoming
from tests.mcp_servers import HttpServer

GOAL_ADDED_MS = 2.0
ROOT = Path(__file__).resolve().parent.parent
STDIO_ARGS = ["-m", "tests.mcp_servers", "stdio"]


async def timed(n: int, call: Callable[[], Awaitable[object]]) -> list[float]:
    """Await `call` n times (after 20 unmeasured): their milliseconds, sorted."""
    for _ in range(20):
        await call()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000)
    return sorted(out)


async def through_bot(core: Core, ctx: ToolContext, name: str, n: int) -> list[float]:
    """`echo` through the registry, as the agent loop runs a tool call."""
    server = name.split("__")[1]
    conn = core.mcp.connections[server]
    if not await conn.ready(15):
        raise RuntimeError(f"{server} did not connect: {conn.last_error}")
    await core.mcp.settled()

    async def one() -> None:
        envelope = await core.registry.run(name, json.dumps({"text": "hi"}), ctx, 30.0)
        assert envelope == {"ok": True, "result": "hi"}, envelope

    return await timed(n, one)


async def direct(server: StdioServerParameters | str, n: int) -> list[float]:
    """`echo` with the SDK's Client, nothing of the bot."""
    async with Client(server) as client:

        async def one() -> None:
            result = await client.call_tool("echo", {"text": "hi"})
            assert not result.is_error

        return await timed(n, one)


def report(label: str, sdk: list[float], bot: list[float]) -> None:
    """Print both spreads and what the bot adds."""
    added = percentile(bot, 50) - percentile(sdk, 50)
    print(f"== {label}: {len(bot)} calls each ==")
    print(f"    {'SDK Client directly':<36} {spread(sdk)}")
    print(f"    {'through the bot (registry.run)':<36} {spread(bot)}")
    print(f"    {goal_line('added by the bot, p50', added, GOAL_ADDED_MS)}")


async def bench(args: argparse.Namespace) -> None:
    """Measure and print."""
    stdio = {"command": sys.executable, "args": STDIO_ARGS, "cwd": str(ROOT)}
    async with bench_database() as db, HttpServer() as http:
        with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
            config = Path(tmp) / "mcp.json"
            servers = {"io": {**stdio, "trust": "trusted"}, "web": {"url": http.url, "trust": "trusted"}}
            config.write_text(json.dumps({"mcpServers": servers}))
            overrides = {"MCP_CONFIG": config, "ADMINS": f"console:{db.tag}admin"}
            async with bench_core(db.dsn, "http://127.0.0.1:9/v1", settings=overrides) as core:
                core.mcp.start()
                try:
                    inc = Incoming("console", f"{db.tag}admin", f"{db.tag}admin", "", user_name="Bench")
                    user, chat = await conversations.identify(core.pool, inc, "UTC")
                    ctx = ToolContext(core.pool, user, chat, True, core.clock, own_words=True)
                    params = StdioServerParameters(command=sys.executable, args=STDIO_ARGS, cwd=str(ROOT))
                    report("stdio (a child process)", await direct(params, args.calls),
                           await through_bot(core, ctx, "mcp__io__echo", args.calls))  # fmt: skip
                    report("Streamable HTTP (127.0.0.1, server in this process)", await direct(http.url, args.calls),
                           await through_bot(core, ctx, "mcp__web__echo", args.calls))  # fmt: skip
                finally:
                    await core.close()


def main(argv: list[str] | None = None) -> None:
    """Parse the options and run."""
    p = parser("mcp_overhead", __doc__)
    p.add_argument("--calls", type=int, default=500, help="calls each way (500)")
    args = parse(p, argv, {"calls": 100})
    quiet_logging()
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
