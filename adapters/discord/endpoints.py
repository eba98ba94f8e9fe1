"""Per-client Discord endpoints (REST base, gateway URL) for discord.py without changing its class attributes.

discord.py has no public per-client setting for either: every REST route is built from the class attribute
`discord.http.Route.BASE`, and a plain `Client` dials the class attribute `DiscordWebSocket.DEFAULT_GATEWAY`.
Overwriting those would repoint every client in the process (and stay changed after ours is closed). What
*is* per client is its `HTTPClient`: every REST request and every gateway websocket of a client goes through
its `request()` and `ws_connect()`. Interaction answers go through discord.py's webhook adapter, which it looks
up in a context variable (`discord.webhook.async_.async_context`); setting it in the gateway task's context
scopes it to the tasks that client spawns for its events. Both rewrite only URLs that start with the official
default, so anything else (a resume_gateway_url from READY, the CDN) is left alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import discord
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import HTTPClient, Route
from discord.webhook.async_ import AsyncWebhookAdapter, async_context


class GatewayUnreachable(Exception):
    """The gateway could not be dialled while starting (discord.py would retry forever; start() reports it)."""

    def __init__(self, host: str, reason: str) -> None:
        """Name the host and why."""
        super().__init__(f"cannot reach the Discord gateway at {host}: {reason}")
        self.host, self.reason = host, reason


def host_of(url: str | yarl.URL) -> str:
    """host[:port] of a URL, for messages (never a path or query that might carry a secret)."""
    u = yarl.URL(url)
    return f"{u.host}:{u.explicit_port}" if u.explicit_port else str(u.host)


def reason_of(error: BaseException) -> str:
    """A short reason for a connection failure (no traceback)."""
    if isinstance(error, aiohttp.ClientConnectorError):
        return error.os_error.strerror or type(error.os_error).__name__
    if isinstance(error, TimeoutError):
        return "timed out"
    return str(error) or type(error).__name__


class Endpoints:
    """Where one client's REST calls and gateway connections go (None: Discord's own)."""

    def __init__(self, api_base: str | None, gateway: str | None) -> None:
        """Keep the bases (a trailing slash on the REST base is dropped)."""
        self.api_base = api_base.rstrip("/") if api_base else None
        self.gateway = yarl.URL(gateway) if gateway else None

    def rest(self, url: str) -> str:
        """A REST URL built on Route.BASE, moved onto our base."""
        base = Route.BASE
        if self.api_base is None or not url.startswith(base):
            return url
        return self.api_base + url[len(base) :]

    def ws(self, url: str) -> str:
        """A gateway URL on the default gateway, moved onto ours (its query kept)."""
        u = yarl.URL(url)
        if self.gateway is None or u.with_query(None) != DiscordWebSocket.DEFAULT_GATEWAY.with_query(None):
            return url
        return str(self.gateway.with_query(u.query))

    @property
    def api_host(self) -> str:
        """The REST host, for messages."""
        return host_of(self.api_base or Route.BASE)

    @property
    def gateway_host(self) -> str:
        """The gateway host, for messages."""
        return host_of(self.gateway or DiscordWebSocket.DEFAULT_GATEWAY)


class EndpointHTTP(HTTPClient):
    """discord.py's HTTP client, sending this client's requests and gateway connections to its endpoints."""

    def __init__(self, loop: asyncio.AbstractEventLoop, endpoints: Endpoints) -> None:
        """Like discord.Client's own HTTPClient (no connector, proxy or trace options)."""
        super().__init__(loop)
        self.endpoints = endpoints
        self.fail_fast = False  # while starting: an unreachable gateway raises GatewayUnreachable

    async def request(self, route: Route, **kwargs: Any) -> Any:
        """One REST request, on our base."""
        route.url = self.endpoints.rest(route.url)
        return await super().request(route, **kwargs)

    async def ws_connect(self, url: str, *, compress: int = 0) -> aiohttp.ClientWebSocketResponse:
        """A gateway websocket, on our gateway."""
        try:
            return await super().ws_connect(self.endpoints.ws(url), compress=compress)
        except (OSError, aiohttp.ClientError, TimeoutError) as e:
            if self.fail_fast:  # not a type discord.py's connect() catches: it ends connect() at once, unlogged
                raise GatewayUnreachable(host_of(self.endpoints.ws(url)), reason_of(e)) from e
            raise


class EndpointWebhooks(AsyncWebhookAdapter):
    """discord.py's webhook adapter (interaction callbacks and follow-ups), on our REST base."""

    def __init__(self, endpoints: Endpoints) -> None:
        """Rewrite with these endpoints."""
        super().__init__()  # type: ignore[no-untyped-call]  # discord.py leaves it unannotated
        self.endpoints = endpoints

    async def request(self, route: Route, session: aiohttp.ClientSession, **kwargs: Any) -> Any:
        """One webhook/interaction request, on our base."""
        route.url = self.endpoints.rest(route.url)
        return await super().request(route, session, **kwargs)


def use_endpoints(client: discord.Client, endpoints: Endpoints) -> None:
    """Point a fresh (not yet logged in) client at the endpoints; call before anything keeps `client.http`."""
    http = EndpointHTTP(client.loop, endpoints)
    client.http = http
    client._connection.http = http  # the connection state holds the same HTTPClient (discord.py sets both in __init__)


def scope_webhooks(endpoints: Endpoints) -> None:
    """Interaction answers in this task and the tasks it spawns (a client's events) use the endpoints."""
    if endpoints.api_base is not None:
        async_context.set(EndpointWebhooks(endpoints))
