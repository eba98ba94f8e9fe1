"""The HTTP server on PORT: /healthz, /readyz, /metrics and the Telegram webhook route (one aiohttp app).

/metrics needs `Authorization: Bearer <METRICS_TOKEN>` when that is set; without it, webhook mode (the port is
public) does not serve /metrics at all, and polling mode serves it openly as before."""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Sequence

from aiohttp import web

from core import METRICS_CONTENT_TYPE, Core, StartupError

log = logging.getLogger(__name__)

ALL_INTERFACES = "0.0.0.0"
METRICS_REALM = 'Bearer realm="metrics"'  # the WWW-Authenticate challenge of a /metrics request without the token


def _json(http_status: int, **body: str) -> web.Response:
    """A one-line JSON answer."""
    return web.Response(status=http_status, text=json.dumps(body), content_type="application/json")


class WebServer:
    """The process's aiohttp server; add webhook routes to `app` before `start()`."""

    def __init__(self, core: Core, adapters: Sequence[str], port: int, host: str = ALL_INTERFACES) -> None:
        """`adapters`: the configured adapters that must be connected for /readyz; `port` 0 picks a free one."""
        self.core, self.adapters, self.host, self.requested_port = core, tuple(adapters), host, port
        self.app = web.Application()
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/readyz", self.readyz)
        settings = core.settings
        token = settings.METRICS_TOKEN
        self._metrics_token = None if token is None else token.get_secret_value().encode()
        # webhook mode publishes this port to the internet: /metrics only with a token there
        self.metrics_served = token is not None or settings.TELEGRAM_WEBHOOK_URL is None
        if self.metrics_served:
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
        if not self.metrics_served:
            log.info(
                "health on http://%s:%d (/healthz, /readyz); /metrics is off on this public port:"
                " set METRICS_TOKEN and scrape it with Authorization: Bearer <token>",
                self.host,
                self.port,
            )
        else:
            needs = " (bearer token)" if self._metrics_token is not None else ""
            log.info("health and metrics on http://%s:%d (/healthz, /readyz, /metrics%s)", self.host, self.port, needs)

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
        reason = await self.core.not_ready(self.adapters)
        if reason is None:
            return _json(200, status="ready")
        return _json(503, status="not ready", reason=reason)

    def _authorized(self, request: web.Request) -> bool:
        """Whether the request may read /metrics: no METRICS_TOKEN, or `Authorization: Bearer <it>` (constant time)."""
        if self._metrics_token is None:
            return True
        scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._metrics_token)

    async def metrics(self, request: web.Request) -> web.Response:
        """The process's metrics in the Prometheus text format (401 without the bearer token when one is set)."""
        if not self._authorized(request):
            resp = _json(401, error="unauthorized: send Authorization: Bearer <METRICS_TOKEN>")
            resp.headers["WWW-Authenticate"] = METRICS_REALM
            return resp
        return web.Response(body=self.core.metrics_text(), headers={"Content-Type": METRICS_CONTENT_TYPE})
