"""The gateway connection: the discord.py client (or the shards this process runs), READY at start, a fresh client
when a connection ends for good, and the connection's state for /status and /readyz."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import aiohttp
import discord
import yarl
from discord import app_commands
from discord.gateway import DiscordWebSocket
from discord.shard import Shard

from adapters.discord.endpoints import (
    EndpointHTTP,
    Endpoints,
    GatewayUnreachable,
    reason_of,
    scope_webhooks,
    use_endpoints,
)
from adapters.discord.limits import (
    DISCORD_IDENTIFY_SPACING_S,
    DISCORD_READY_TIMEOUT_S,
    DISCORD_RETRY_FIRST_S,
    DISCORD_RETRY_MAX_S,
)
from adapters.discord.send import NO_MENTIONS
from core import EXIT_UNREACHABLE, Core, Settings, StartupError

log = logging.getLogger(__name__)
Sleep = Callable[[float], Awaitable[None]]


class Owner(Protocol):
    """What the clients hand their events to: the adapter."""

    core: Core

    async def setup(self, client: Client) -> None:
        """Once per login, before connecting: persistent buttons and slash commands."""

    async def on_message(self, message: discord.Message) -> None:
        """A message the bot can see."""

    async def guard(self, interaction: discord.Interaction, work: Coroutine[Any, Any, None]) -> None:
        """Run an interaction's work as tracked work, through the error funnel."""

    async def fail(self, interaction: discord.Interaction, error: BaseException) -> None:
        """Log an interaction's failure and tell its user briefly."""


class Client(discord.Client):
    """A discord.py client that hands its events to the adapter and its connection state to the gateway."""

    tree: app_commands.CommandTree[Client]  # made by the slash commands' setup (commands.py)

    def __init__(self, gateway: Gateway, intents: discord.Intents, **shards: Any) -> None:
        """A client with no default mentions and our endpoints (`shards`: shard_count, shard_ids)."""
        super().__init__(
            intents=intents,
            allowed_mentions=NO_MENTIONS,
            guild_ready_timeout=gateway.guild_ready_timeout,
            chunk_guilds_at_startup=False,
            **shards,
        )
        use_endpoints(self, gateway.endpoints)  # before the command tree keeps a reference to client.http
        self.gateway, self.owner = gateway, gateway.owner

    async def setup_hook(self) -> None:
        """Once per login: the adapter's buttons and slash commands."""
        await self.owner.setup(self)

    async def on_ready(self) -> None:
        """Connected (or reconnected without resuming)."""
        self.gateway.ready(self)

    async def on_resumed(self) -> None:
        """Reconnected and resumed the session."""
        self.gateway.ready(self)

    async def on_disconnect(self) -> None:
        """The gateway connection dropped; discord.py reconnects on its own."""
        self.gateway.disconnected("reconnecting")

    async def on_message(self, message: discord.Message) -> None:
        """Every message the bot can see."""
        await self.owner.on_message(message)


class ShardedClient(Client, discord.AutoShardedClient):
    """The same client running the gateway shards DISCORD_SHARD_COUNT / DISCORD_SHARD_IDS name: Discord sends
    each shard the events of its own servers ((guild id >> 22) % count) and shard 0 the direct messages;
    on_ready comes once every shard of this process is ready."""

    async def on_shard_ready(self, shard_id: int) -> None:
        """A shard identified again after start (on_ready comes only once all shards are ready together)."""
        if self.gateway.started:
            self.gateway.ready(self)

    async def launch_shard(self, gateway: yarl.URL, shard_id: int, *, initial: bool = False) -> None:
        """discord.py retries a shard that cannot connect every 5 s forever, logging each try as an error; while
        starting, the failure ends connect() instead (start() reports it in one line)."""
        if not (isinstance(self.http, EndpointHTTP) and self.http.fail_fast):
            await super().launch_shard(gateway, shard_id, initial=initial)
            return
        connecting = DiscordWebSocket.from_client(self, initial=initial, gateway=gateway, shard_id=shard_id)
        ws = await asyncio.wait_for(connecting, timeout=self.shard_connect_timeout)
        # what discord.py's launch_shard does after connecting (its shard table and event queue are private)
        shards: dict[int, Shard] = getattr(self, "_AutoShardedClient__shards")  # noqa: B009
        queue: asyncio.PriorityQueue[Any] = getattr(self, "_AutoShardedClient__queue")  # noqa: B009
        shards[shard_id] = shard = Shard(ws, self, queue.put_nowait)
        shard.launch()


class Gateway:
    """This process's gateway connection for the adapter's lifetime. discord.py reconnects and resumes on its own;
    when a connection ends for good (a fatal close code, an error it does not handle), a new client replaces it
    after a growing pause (DISCORD_RETRY_FIRST_S doubling to DISCORD_RETRY_MAX_S), and /status says since when it
    is down (/readyz: not ready)."""

    def __init__(
        self, owner: Owner, core: Core, settings: Settings, *, guild_ready_timeout: float, sleep: Sleep
    ) -> None:
        """Prepare the client (not connected yet); `sleep` waits between reconnection attempts."""
        assert settings.DISCORD_BOT_TOKEN is not None
        self.owner, self.core = owner, core
        self.token = settings.DISCORD_BOT_TOKEN.get_secret_value()
        self.endpoints = Endpoints(settings.DISCORD_API_BASE_URL, settings.DISCORD_GATEWAY_URL)
        self.shards = settings.discord_shards  # (count, this process's ids), None: one unsharded connection
        self.guild_ready_timeout = guild_ready_timeout
        self._sleep = sleep
        self._message_content = True
        self.client = self._make_client()
        self.runner: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._closing = False  # close() began: no new client, no "disconnected" state
        self._down_since: str | None = None
        self._retry_s = DISCORD_RETRY_FIRST_S
        self._pausing = False  # the runner waits before connecting a new client

    def _make_client(self) -> Client:
        """A fresh client (a closed client cannot connect again)."""
        intents = discord.Intents.default()
        intents.message_content = self._message_content
        if self.shards is None:
            return Client(self, intents)
        count, ids = self.shards
        return ShardedClient(self, intents, shard_count=count, shard_ids=list(ids))

    @property
    def ready_timeout(self) -> float:
        """How long start() waits for READY: the shards of a process identify one after another, 5 s apart."""
        more = 0 if self.shards is None else len(self.shards[1]) - 1
        return DISCORD_READY_TIMEOUT_S + DISCORD_IDENTIFY_SPACING_S * more

    @property
    def started(self) -> bool:
        """Whether the first READY came (start() is done waiting)."""
        return self._ready.is_set()

    async def connected_once(self) -> None:
        """Return once the first READY came (at once after that, also while reconnecting: answers go over REST)."""
        await self._ready.wait()

    async def start(self) -> None:
        """Log in, connect as a background task and wait for READY; a failure is a StartupError (one line,
        naming DISCORD_BOT_TOKEN or the host, never the token) after closing what was started."""
        self._closing = False
        self._ready.clear()
        try:
            await self._start()
        except BaseException as e:
            await self.close()
            startup = startup_error(e, self.endpoints)
            if startup is None:
                raise
            raise startup from None

    async def _start(self) -> None:
        """Login, then the gateway until READY (an unreachable gateway fails at once instead of retrying)."""
        _fail_fast(self.client, True)
        await self.client.login(self.token)
        self.runner = runner = asyncio.create_task(self._run(), name="discord-gateway")
        waiter = asyncio.create_task(self._ready.wait())
        limit = self.ready_timeout
        try:
            done, _ = await asyncio.wait({runner, waiter}, timeout=limit, return_when="FIRST_COMPLETED")
        finally:
            waiter.cancel()
        if self._ready.is_set():
            return
        host = self.endpoints.gateway_host
        if runner in done:
            runner.result()  # raises why the connection failed
            raise StartupError(
                f"Discord: the gateway connection at {host} ended before READY", exit_code=EXIT_UNREACHABLE
            )
        raise StartupError(
            f"Discord: the gateway at {host} did not say READY within {limit:.0f} s", exit_code=EXIT_UNREACHABLE
        )

    async def _run(self) -> None:
        """Keep a gateway connection until close(): a client whose connection ended for good is replaced."""
        scope_webhooks(self.endpoints)  # interaction answers of the clients' event tasks (spawned from here)
        fresh = False
        while True:
            why = await self._connection(fresh)
            if self._closing:
                return
            with contextlib.suppress(Exception):
                await self.client.close()
            delay, self._retry_s = self._retry_s, min(self._retry_s * 2, DISCORD_RETRY_MAX_S)
            self.disconnected(why)
            log.error("Discord connection lost (%s); connecting a new client in %.0f s", why, delay)
            self._pausing = True
            try:
                await self._sleep(delay)
            finally:
                self._pausing = False
            if self._closing:
                return
            fresh = True

    async def _connection(self, fresh: bool) -> str:
        """One client's connection until it ends for good (`fresh`: make and log in a new client first); returns
        why it ended. Still starting, the failure is raised (start() reports it)."""
        try:
            if fresh:
                self.client = self._make_client()
                await self.client.login(self.token)
            await self._connect()
        except Exception as e:
            if not self._ready.is_set():
                raise
            if not isinstance(e, (discord.DiscordException, OSError, aiohttp.ClientError, TimeoutError)):
                log.error("Discord gateway task failed", exc_info=e)
            return _describe(e)
        return "the gateway connection ended"

    async def _connect(self) -> None:
        """Run the current client's gateway; without the Message Content intent, fall back to mentions and DMs."""
        try:
            await self.client.connect(reconnect=True)
        except discord.PrivilegedIntentsRequired:
            log.warning(
                "Discord refused the Message Content intent: enable it in the Developer Portal (Bot → Privileged "
                "Gateway Intents). Running without it: only DMs and messages that @mention the bot are read."
            )
            await self.client.close()  # discord.py raises this without closing its HTTP session
            self._message_content = False
            self.client = self._make_client()
            _fail_fast(self.client, not self._ready.is_set())
            await self.client.login(self.token)
            await self.client.connect(reconnect=True)

    async def close(self) -> None:
        """Close the client and end the gateway task (whatever state they are in)."""
        self._closing = True
        with contextlib.suppress(Exception):
            await self.client.close()
        runner, self.runner = self.runner, None
        if runner is None:
            return
        if not self._pausing:  # a closed client ends connect(); give it a moment to return on its own
            await asyncio.wait({runner}, timeout=5.0)
        if not runner.done():
            runner.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await runner

    def ready(self, client: Client) -> None:
        """Record the connection for /status and /readyz, and wake start()."""
        _fail_fast(client, False)
        self.core.report_state("discord", f"{client.user} in {len(client.guilds)} server(s){self._shards_text()}")
        self._down_since, self._retry_s = None, DISCORD_RETRY_FIRST_S
        self._ready.set()

    def disconnected(self, why: str) -> None:
        """Show in /status since when the gateway is down and why; /readyz says not ready meanwhile."""
        if self._closing or not self._ready.is_set():
            return
        if self._down_since is None:
            self._down_since = self.core.now().strftime("%Y-%m-%d %H:%M UTC")
        state = f"disconnected since {self._down_since}: {why}{self._shards_text()}"
        self.core.report_state("discord", state, connected=False)

    def _shards_text(self) -> str:
        """What /status adds when sharded, e.g. ", shards 0,1 of 4" (empty when not)."""
        if self.shards is None:
            return ""
        count, ids = self.shards
        return f", shards {','.join(map(str, ids))} of {count}"


def _fail_fast(client: discord.Client, on: bool) -> None:
    """While starting, an unreachable gateway ends connect() at once (discord.py would retry it forever)."""
    if isinstance(client.http, EndpointHTTP):
        client.http.fail_fast = on


def _describe(error: BaseException) -> str:
    """Why a gateway connection ended, in a few words (never the token)."""
    if isinstance(error, discord.ConnectionClosed):
        return f"the gateway closed the connection with code {error.code}"
    if isinstance(error, discord.LoginFailure):
        return "DISCORD_BOT_TOKEN was rejected"
    if isinstance(error, discord.HTTPException):
        return f"the Discord API answered {error.status}"
    return f"{type(error).__name__}: {reason_of(error)}"


def startup_error(error: BaseException, endpoints: Endpoints) -> StartupError | None:
    """A start-up failure as one line for the operator (None: not a connection problem, raise it as it is).
    A rejected token or close code is a setting to fix (exit 2); an unreachable or failing Discord may pass (3)."""
    api, gateway, down = endpoints.api_host, endpoints.gateway_host, EXIT_UNREACHABLE
    rejected = f"DISCORD_BOT_TOKEN: rejected by Discord at {api} (copy it again from the Developer Portal, Bot → Token)"
    if isinstance(error, discord.LoginFailure):
        return StartupError(rejected)
    if isinstance(error, discord.ConnectionClosed):
        if error.code == 4004:
            return StartupError(rejected)
        return StartupError(f"Discord: the gateway at {gateway} closed the connection at start (code {error.code})")
    if isinstance(error, GatewayUnreachable):
        hint = " and DISCORD_GATEWAY_URL" if endpoints.gateway is not None else ""
        why = f"Discord: cannot reach the gateway at {error.host} ({error.reason}; check the network{hint})"
        return StartupError(why, exit_code=down)
    if isinstance(error, discord.HTTPException):
        return StartupError(f"Discord: the API at {api} failed at start (HTTP {error.status})", exit_code=down)
    if isinstance(error, (OSError, aiohttp.ClientError)):
        hint = " and DISCORD_API_BASE_URL" if endpoints.api_base is not None else ""
        why = f"Discord: cannot reach the API at {api} ({reason_of(error)}; check the network{hint})"
        return StartupError(why, exit_code=down)
    if isinstance(error, TimeoutError):
        return StartupError(f"Discord: the API at {api} did not answer in time (check the network)", exit_code=down)
    return error if isinstance(error, StartupError) else None
