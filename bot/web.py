"""The HTTP server on PORT: /healthz, /readyz, /metrics and the Telegram webhook route, one FastAPI app served by
uvicorn inside the bot's event loop (no signal handlers of its own, no logging set-up of its own).

/metrics needs `Authorization: Bearer <METRICS_TOKEN>` when that is set; without it, a public port (webhook mode, or
`bot serve` on an address other than loopback) does not serve /metrics at all, and polling mode serves it openly as
before."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence

import uvicorn
from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig
from starlette.requests import Request
from starlette.responses import Response

from bot.hosts import ALL_INTERFACES
from core import (
    HTTP_CLOSE_GRACE_S,
    HTTP_KEEP_ALIVE_S,
    MCP_OAUTH_CALLBACK_PATH,
    METRICS_CONTENT_TYPE,
    Core,
    StartupError,
)

log = logging.getLogger(__name__)

NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
METRICS_REALM = 'Bearer realm="metrics"'  # the WWW-Authenticate challenge of a /metrics request without the token
HEADER_REFRESH_S = 1.0  # uvicorn's Date header is renewed this often (its own main loop would wake 10 times a second)

Handler = Callable[[Request], Awaitable[Response]]


def _json(http_status: int, **body: str) -> Response:
    """A one-line JSON answer."""
    return Response(json.dumps(body), http_status, media_type="application/json")


def _bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (0: a free port) here, so that a refusal is immediate (uvicorn listens)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = found[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's servers do
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


class WebServer:
    """The process's HTTP server; add webhook routes with `add_webhook` (or more routes to `app`) before `start()`."""

    def __init__(
        self, core: Core, adapters: Sequence[str], port: int, host: str = ALL_INTERFACES, *, public: bool = False
    ) -> None:
        """`adapters`: the configured adapters that must be connected for /readyz; `port` 0 picks a free one;
        `public`: people reach this port from elsewhere (as in webhook mode), so /metrics needs METRICS_TOKEN."""
        self.core, self.adapters, self.host, self.requested_port = core, tuple(adapters), host, port
        # no OpenTelemetry: FastAPI would ask the global providers on every request (~0.1 ms) for a feature the bot
        # does not use (its metrics are Prometheus', on /metrics)
        self.app = FastAPI(docs_url=None, redoc_url=None, telemetry=NO_TELEMETRY)
        # plain Starlette routes (GET answers HEAD too): no request models, and not in the API's schema
        self.app.add_route("/healthz", self.healthz, methods=["GET"], include_in_schema=False)
        self.app.add_route("/readyz", self.readyz, methods=["GET"], include_in_schema=False)
        # a person's browser back from a tool server's OAuth (/mcp connect): core/mcp_servers/oauth.py
        self.app.add_route(MCP_OAUTH_CALLBACK_PATH, self.mcp_oauth, methods=["GET"], include_in_schema=False)
        settings = core.settings
        token = settings.METRICS_TOKEN
        self._metrics_token = None if token is None else token.get_secret_value().encode()
        # a public port (webhook mode publishes it to the internet) serves /metrics only with a token
        public = public or settings.TELEGRAM_WEBHOOK_URL is not None
        self.metrics_served = token is not None or not public
        if self.metrics_served:
            self.app.add_route("/metrics", self.metrics, methods=["GET"], include_in_schema=False)
        self.close_grace_s = HTTP_CLOSE_GRACE_S  # what stop() gives the requests under way
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._ticker: asyncio.Task[None] | None = None

    def add_webhook(self, path: str, handler: Handler) -> None:
        """Serve POST `path` with `handler` (a platform's webhook: a plain route, the lightest path through the app)."""
        self.app.add_route(path, handler, methods=["POST"], include_in_schema=False)

    @property
    def port(self) -> int:
        """The port listened on (the chosen one when 0 was asked for)."""
        assert self._sock is not None, "not started"
        return int(self._sock.getsockname()[1])

    async def start(self) -> None:
        """Listen on host:port; one that cannot be bound is a one-line start-up error naming HOST or PORT."""
        try:
            sock = _bind(self.host, self.requested_port)
        except OSError as e:
            why = e.strerror or str(e)
            name = "HOST" if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL else "PORT"
            raise StartupError(f"{name}: cannot listen on {self.host}:{self.requested_port} ({why})") from None
        config = uvicorn.Config(
            self.app,
            self.host,
            self.requested_port,
            loop="none",
            http="httptools",  # C parser: with h11 (pure Python) the server took twice as long (bench/webhook_overhead)
            lifespan="off",
            ws="none",
            proxy_headers=False,  # as before: X-Forwarded-* are not trusted
            timeout_keep_alive=HTTP_KEEP_ALIVE_S,  # uvicorn's 5 s would race a proxy reusing its idle connections
            access_log=False,  # scrapes every few seconds would flood the log
            log_config=None,  # the bot's logging stays as it is (uvicorn's records go to the root logger)
        )
        config.load()
        server = uvicorn.Server(config)
        # Server.serve() would set up the lifespan (off), take over SIGINT/SIGTERM and poll its main loop: the bot
        # does its own signals, so the server is started and stopped here, step by step
        server.lifespan = config.lifespan_class(config)
        try:
            await server.startup(sockets=[sock])
        except BaseException:
            sock.close()
            raise
        self._sock, self._server = sock, server
        self._ticker = asyncio.create_task(self._refresh_headers(server))
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

    @staticmethod
    async def _refresh_headers(server: uvicorn.Server) -> None:
        """Keep uvicorn's default headers (Date, Server) current until cancelled."""
        while True:
            await server.on_tick(0)
            await asyncio.sleep(HEADER_REFRESH_S)

    async def stop(self) -> None:
        """Stop listening; requests under way get `close_grace_s` to finish, then every connection is closed (a
        response still streaming ends: its app sees the client gone), and what still runs after as long is
        cancelled."""
        server, sock, ticker = self._server, self._sock, self._ticker
        self._server = self._sock = self._ticker = None
        if server is None or sock is None:
            return
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        state = server.server_state
        for listener in server.servers:
            listener.close()
        for connection in list(state.connections):
            connection.shutdown()  # an idle keep-alive connection closes now, a busy one after its response
        if state.tasks:
            await asyncio.wait(set(state.tasks), timeout=self.close_grace_s)
        for connection in list(state.connections):
            connection.transport.close()
        if state.tasks:
            _, stuck = await asyncio.wait(set(state.tasks), timeout=self.close_grace_s)
            for task in stuck:
                task.cancel()
            if stuck:
                await asyncio.wait(stuck, timeout=self.close_grace_s)
        for listener in server.servers:
            await listener.wait_closed()
        sock.close()

    async def healthz(self, request: Request) -> Response:
        """The process is alive (its event loop answers)."""
        return _json(200, status="alive")

    async def readyz(self, request: Request) -> Response:
        """200 when the database answers and every configured adapter is connected, else 503 with the reason."""
        reason = await self.core.not_ready(self.adapters)
        if reason is None:
            return _json(200, status="ready")
        return _json(503, status="not ready", reason=reason)

    async def mcp_oauth(self, request: Request) -> Response:
        """The end of /mcp connect: the tool server sent the person here with a code; one line of text for them."""
        query = request.query_params
        ok, line = await self.core.finish_mcp_oauth(
            query.get("state", ""), query.get("code", ""), query.get("error", ""), query.get("iss")
        )
        headers = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
        return Response(line + "\n", 200 if ok else 400, headers, media_type="text/plain; charset=utf-8")

    def _authorized(self, request: Request) -> bool:
        """Whether the request may read /metrics: no METRICS_TOKEN, or `Authorization: Bearer <it>` (constant time)."""
        if self._metrics_token is None:
            return True
        scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._metrics_token)

    async def metrics(self, request: Request) -> Response:
        """The process's metrics in the Prometheus text format (401 without the bearer token when one is set)."""
        if not self._authorized(request):
            resp = _json(401, error="unauthorized: send Authorization: Bearer <METRICS_TOKEN>")
            resp.headers["WWW-Authenticate"] = METRICS_REALM
            return resp
        return Response(self.core.metrics_text(), media_type=METRICS_CONTENT_TYPE)
