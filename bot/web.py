"""The HTTP server on PORT: /healthz, /readyz and /metrics (webhook routes join the same aiohttp app later)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core import Core, StartupError
from core.limits import READY_DB_TIMEOUT_S

log = logging.getLogger(__name__)

ALL_INTERFACES = "0.0.0.0"


def _json(http_status: int, **body: str) -> web.Response:
    """A one-line JSON answer."""
    return web.Response(status=http_status, text=json.dumps(body), content_type="application/json")


async def not_ready(core: Core, adapters: Sequence[str]) -> str | None:
    """Why this process should get no traffic (shutting down, database, a configured adapter), or None when ready.

    The reason names only the part, never a host, a state text or a secret."""
    if core.draining:
        return "shutting down"
    try:
        await asyncio.wait_for(core.pool.fetchval("SELECT 1"), READY_DB_TIMEOUT_S)
    except TimeoutError:
        return f"database: no answer within {READY_DB_TIMEOUT_S:g} s"
    except Exception as e:
        return f"database unreachable ({type(e).__name__})"
    for name in adapters:
        state = core.status_board.adapters.get(name)
        if state is None:
            return f"{name}: not connected"
        if state.startswith("disconnected"):  # the Discord adapter's state while its gateway is down
            return f"{name}: disconnected"
    return None


class WebServer:
    """The process's aiohttp server; add webhook routes to `app` before `start()`."""

    def __init__(self, core: Core, adapters: Sequence[str], port: int, host: str = ALL_INTERFACES) -> None:
        """`adapters`: the configured adapters that must be connected for /readyz; `port` 0 picks a free one."""
        self.core, self.adapters, self.host, self.requested_port = core, tuple(adapters), host, port
        self.app = web.Application()
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/readyz", self.readyz)
        self.app.router.add_get("/metrics", self.metrics)
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        """The port listened on (the chosen one when 0 was asked for)."""
        assert self._runner is not None, "not started"
        return int(self._runner.addresses[0][1])

    async def start(self) -> None:
        """Listen on host:port; a port that cannot be bound is a one-line start-up error naming PORT."""
        runner = web.AppRunner(self.app, access_log=None)  # scrapes every few seconds would flood the log
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.requested_port).start()
        except OSError as e:
            await runner.cleanup()
            why = os.strerror(e.errno) if e.errno else str(e)  # asyncio's strerror repeats the address
            raise StartupError(f"PORT: cannot listen on {self.host}:{self.requested_port} ({why})") from None
        self._runner = runner
        log.info("health and metrics on http://%s:%d (/healthz, /readyz, /metrics)", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close open connections."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def healthz(self, request: web.Request) -> web.Response:
        """The process is alive (its event loop answers)."""
        return _json(200, status="alive")

    async def readyz(self, request: web.Request) -> web.Response:
        """200 when the database answers and every configured adapter is connected, else 503 with the reason."""
        reason = await not_ready(self.core, self.adapters)
        if reason is None:
            return _json(200, status="ready")
        return _json(503, status="not ready", reason=reason)

    async def metrics(self, request: web.Request) -> web.Response:
        """The process's metrics in the Prometheus text format."""
        body = generate_latest(self.core.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
