"""Per-person accounts at MCP servers (`credentials: per_person`): each person connects their own account by OAuth,
through the `mcp` SDK's OAuthClientProvider, with its tokens and client registration kept in PostgreSQL per (server,
account) (sql/033). `/mcp connect <server>` starts the SDK's flow and answers with its authorization link; the
server sends the person's browser back to the bot's own HTTP server (CALLBACK_PATH), whose code finishes the flow. The
SDK is imported only where a flow or the tokens use it (a connection's provider: core/mcp_servers/person_auth.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from pydantic import AnyUrl

from core.constants import MCP_LINE_CHARS, MCP_OAUTH_LINK_S
from core.mcp_servers.config import ServerConfig
from core.mcp_servers.results import clean
from core.quoting import truncate
from core.storage.db import Pool
from core.timeutil import Clock

if TYPE_CHECKING:
    from mcp.client.auth import OAuthClientProvider
    from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

log = logging.getLogger(__name__)

CALLBACK_PATH = "/mcp/oauth/callback"  # on the bot's HTTP server (bot/web.py)
CLIENT_NAME = "assistant bot"
PROBE_VERSION = "2025-06-18"  # the MCP-Protocol-Version of the request that asks the server for an authorization
LINK_GONE = "This link has expired or was used already: send /mcp connect <server> again in a private chat with me."
LINK_LOST = "This link was made before the bot restarted: send /mcp connect {server} again in a private chat with me."
CONNECTED = "Connected {server}. You can close this tab."


class NeedsAuthorization(Exception):
    """The server wants a new authorization of the person (their tokens are gone or refused)."""


class _RefusalNoise(logging.Filter):
    """The SDK logs its flow failing as an error with a traceback; a person's connection that needs /mcp connect again
    (our refusal to authorize mid-turn) is no error of the bot's: the person is told."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Drop records about our own refusal."""
        return not (record.exc_info and isinstance(record.exc_info[1], NeedsAuthorization))


logging.getLogger("mcp.client.auth.oauth2").addFilter(_RefusalNoise())


class ConnectFailed(Exception):
    """/mcp connect could not make a link; str(e) is one line for the person."""


class TokenStore:
    """The SDK's TokenStorage for one person at one server, in mcp_credentials. `fresh` (a new /mcp connect): what is
    stored is not read, and the new registration is written only with the tokens it brings."""

    def __init__(self, pool: Pool, server: str, account_id: int, clock: Clock, *, fresh: bool = False) -> None:
        """The store of `account_id`'s credentials at `server`."""
        self.pool, self.server, self.account_id, self.clock, self.fresh = pool, server, account_id, clock, fresh
        self._client: OAuthClientInformationFull | None = None  # a fresh flow's registration, until its tokens come
        self.seconds_left: float | None = None  # of the access token read last (None: the server gave no expiry)

    async def _get(self, column: str) -> Any:
        """One column of the row (None when there is none)."""
        sql = f"SELECT {column} FROM mcp_credentials WHERE server = $1 AND account_id = $2"  # column: ours, fixed
        return await self.pool.fetchval(sql, self.server, self.account_id)

    async def get_tokens(self) -> OAuthToken | None:
        """The person's tokens (and how long the access token has left, in seconds_left)."""
        from mcp.shared.auth import OAuthToken

        if self.fresh:
            return None
        sql = "SELECT tokens, tokens_at FROM mcp_credentials WHERE server = $1 AND account_id = $2"
        row = await self.pool.fetchrow(sql, self.server, self.account_id)
        if row is None or not row["tokens"]:
            return None
        tokens = OAuthToken.model_validate(row["tokens"])
        if tokens.expires_in is not None and row["tokens_at"] is not None:
            self.seconds_left = tokens.expires_in - (self.clock() - row["tokens_at"]).total_seconds()
        return tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        """Keep new tokens (with a fresh flow's registration, and the time of the connection)."""
        client = self._client.model_dump(mode="json", exclude_none=True) if self._client else None
        await self.pool.execute(
            """INSERT INTO mcp_credentials
                   (server, account_id, tokens, client_info, connected_at, updated_at, tokens_at)
               VALUES ($1, $2, $3, $4, CASE WHEN $5 THEN $6::timestamptz END, $6, $6)
               ON CONFLICT (server, account_id) DO UPDATE SET tokens = excluded.tokens, tokens_at = excluded.tokens_at,
                   client_info = coalesce(excluded.client_info, mcp_credentials.client_info),
                   connected_at = coalesce(excluded.connected_at, mcp_credentials.connected_at),
                   updated_at = excluded.updated_at""",
            self.server,
            self.account_id,
            tokens.model_dump(mode="json", exclude_none=True),
            client,
            self.fresh,
            self.clock(),
        )

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        """The person's client registration at the server."""
        from mcp.shared.auth import OAuthClientInformationFull

        if self.fresh:
            return self._client
        raw = await self._get("client_info")
        return OAuthClientInformationFull.model_validate(raw) if raw else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        """Keep a registration (a fresh flow's until its tokens come)."""
        if self.fresh:
            self._client = client_info
            return
        await self.pool.execute(
            "UPDATE mcp_credentials SET client_info = $3, updated_at = $4 WHERE server = $1 AND account_id = $2",
            self.server,
            self.account_id,
            client_info.model_dump(mode="json", exclude_none=True),
            self.clock(),
        )


async def connected(pool: Pool, server: str, account_id: int) -> bool:
    """Whether the person has tokens for the server."""
    sql = "SELECT tokens IS NOT NULL FROM mcp_credentials WHERE server = $1 AND account_id = $2"
    return bool(await pool.fetchval(sql, server, account_id))


async def forget(pool: Pool, server: str, account_id: int) -> bool:
    """Delete the person's credentials at the server (and their links under way); whether there were any."""
    await pool.execute("DELETE FROM mcp_oauth_pending WHERE server = $1 AND account_id = $2", server, account_id)
    status = await pool.execute("DELETE FROM mcp_credentials WHERE server = $1 AND account_id = $2", server, account_id)
    return status != "DELETE 0"


async def latest_account(pool: Pool, server: str) -> int | None:
    """The account that used the server last (its connection lists the server's tools after a restart)."""
    sql = "SELECT account_id FROM mcp_credentials WHERE server = $1 AND tokens IS NOT NULL ORDER BY updated_at DESC"
    value = await pool.fetchval(sql + " LIMIT 1", server)
    return int(value) if value is not None else None


def metadata(callback_url: str) -> OAuthClientMetadata:
    """What the bot registers as at a server: a public client (PKCE) that comes back to `callback_url`."""
    from mcp.shared.auth import OAuthClientMetadata

    return OAuthClientMetadata(
        client_name=CLIENT_NAME,
        redirect_uris=[AnyUrl(callback_url)],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
        application_type="web",
    )


@dataclass
class _Flow:
    """One /mcp connect under way: the SDK's flow waiting for its code."""

    server: str
    account_id: int
    code: asyncio.Future[AuthorizationCodeResult]
    task: asyncio.Task[None]
    timeout: float


class Authorizations:
    """The /mcp connect flows of this process, by their OAuth `state`."""

    def __init__(self, pool: Pool, clock: Clock, on_connected: Callable[[str, int], Awaitable[None]]) -> None:
        """Flows whose success calls `on_connected(server, account_id)`."""
        self.pool, self.clock, self.on_connected = pool, clock, on_connected
        self._flows: dict[str, _Flow] = {}

    async def begin(self, config: ServerConfig, account_id: int, base_url: str) -> str:
        """Start the SDK's flow for the person at the server; the authorization link (ConnectFailed: one line)."""
        from mcp.client.auth import OAuthClientProvider

        loop = asyncio.get_running_loop()
        link: asyncio.Future[str] = loop.create_future()
        code: asyncio.Future[AuthorizationCodeResult] = loop.create_future()
        flow_box: list[_Flow] = []

        async def redirect(url: str) -> None:
            state = parse_qs(urlsplit(url).query).get("state", [""])[0]
            expires = self.clock() + timedelta(seconds=MCP_OAUTH_LINK_S)
            await self.pool.execute(
                "INSERT INTO mcp_oauth_pending (state, server, account_id, expires_at) VALUES ($1, $2, $3, $4)",
                state,
                config.name,
                account_id,
                expires,
            )
            self._flows[state] = flow_box[0]
            link.set_result(url)

        async def callback() -> AuthorizationCodeResult:
            async with asyncio.timeout(MCP_OAUTH_LINK_S):
                return await code

        await self.pool.execute("DELETE FROM mcp_oauth_pending WHERE expires_at < $1", self.clock())
        store = TokenStore(self.pool, config.name, account_id, self.clock, fresh=True)
        callback_url = base_url.rstrip("/") + CALLBACK_PATH
        provider = OAuthClientProvider(
            config.url or "", metadata(callback_url), store, redirect_handler=redirect, callback_handler=callback
        )
        task = loop.create_task(self._probe(config, provider), name=f"mcp connect {config.name}")
        task.add_done_callback(self._ended)
        flow_box.append(_Flow(config.name, account_id, code, task, config.connect_timeout))
        waits: set[asyncio.Future[Any]] = {task, link}
        await asyncio.wait(waits, timeout=config.connect_timeout, return_when=asyncio.FIRST_COMPLETED)
        if link.done():
            return link.result()
        if not task.done():
            task.cancel()
            raise ConnectFailed(f"{config.name} did not answer in time; try again later.")
        error = None if task.cancelled() else task.exception()
        if error is None:
            raise ConnectFailed(f"{config.name} did not ask for an authorization: there is no account to connect.")
        raise ConnectFailed(f"{config.name} could not start an authorization: {describe(error)}")

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A flow ended (done, failed, or never finished by the person): forget it."""
        for state, flow in list(self._flows.items()):
            if flow.task is task:
                del self._flows[state]
        if not task.cancelled() and (error := task.exception()) is not None:
            log.info("MCP: an authorization ended without tokens (%s)", describe(error))

    async def _probe(self, config: ServerConfig, provider: OAuthClientProvider) -> None:
        """One request to the server through the provider: its 401 starts the authorization, and the request is sent
        again with the new token once the person approved."""
        import httpx2

        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": PROBE_VERSION}
        timeout = httpx2.Timeout(config.connect_timeout)
        async with httpx2.AsyncClient(auth=provider, headers=dict(config.headers), timeout=timeout) as http:
            response = await http.post(config.url or "", json=ping, headers=headers)
        if response.status_code in (401, 403):
            raise ConnectFailed(f"{config.name} refused the new authorization (HTTP {response.status_code})")

    async def finish(self, state: str, code: str, error: str = "", iss: str | None = None) -> tuple[bool, str]:
        """The callback of an authorization link: finish its flow; whether it worked and one line for the page."""
        from mcp.shared.auth import AuthorizationCodeResult

        row = await self.pool.fetchrow(
            "DELETE FROM mcp_oauth_pending WHERE state = $1 RETURNING server, account_id, expires_at", state
        )
        if row is None or row["expires_at"] < self.clock():
            return False, LINK_GONE
        server = row["server"]
        flow = self._flows.pop(state, None)
        if flow is None or flow.task.done():
            return False, LINK_LOST.format(server=server)
        if error or not code:
            flow.task.cancel()
            why = f" ({truncate(clean(error), MCP_LINE_CHARS, one_line=True)})" if error else ""
            return False, f"Connecting {server} did not happen{why}. Send /mcp connect {server} to try again."
        flow.code.set_result(AuthorizationCodeResult(code=code, state=state, iss=iss))
        try:
            async with asyncio.timeout(flow.timeout):
                await asyncio.shield(flow.task)
        except Exception as e:
            flow.task.cancel()
            log.info("MCP server %s: an authorization failed (%s)", server, describe(e))
            return False, f"Connecting {server} failed: {describe(e)}. Send /mcp connect {server} to try again."
        await self.on_connected(server, flow.account_id)
        return True, CONNECTED.format(server=server)

    async def close(self) -> None:
        """Stop the flows under way."""
        flows, self._flows = list(self._flows.values()), {}
        for flow in flows:
            flow.task.cancel()
        await asyncio.gather(*(f.task for f in flows), return_exceptions=True)


def describe(error: BaseException) -> str:
    """An error of a flow as one line (no token: the SDK's errors name endpoints and statuses)."""
    import httpx2

    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, TimeoutError):
        return "no answer in time"
    if isinstance(error, httpx2.ConnectError | httpx2.ConnectTimeout):
        return "cannot connect to the server"
    text = str(error).split(":", 1)[0] if isinstance(error, httpx2.HTTPError) else str(error)
    return truncate(clean(text or type(error).__name__), MCP_LINE_CHARS, one_line=True)
