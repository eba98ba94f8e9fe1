"""The MCP servers of MCP_CONFIG at run time: a connection each (started in the background: start-up never waits),
their tools in the agent's registry once pinned (sql/032: a server's first tool list is accepted; a new or changed
tool stays off until an admin accepts it with /mcp accept), what a turn offers of them, and their state for /status
and /mcp."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from core.constants import MCP_OAUTH_LINK_S, MCP_PERSON_IDLE_S, MCP_PERSON_SWEEP_S
from core.mcp_servers import confirm, oauth
from core.mcp_servers.config import McpConfig, ServerConfig
from core.mcp_servers.connection import CallFailed, Connection, RemoteTool
from core.mcp_servers.results import Outcome
from core.mcp_servers.tools import (
    PREFIX,
    SEARCH,
    KeepImages,
    PickConnection,
    agent_tool,
    may_use,
    schema_hash,
    schema_tokens,
    search_tool,
    tool_name,
)
from core.storage.db import Pool, retry_dropped
from core.timeutil import Clock
from core.tools.framework import Tool, ToolContext, ToolError, ToolRegistry
from core.types import ChatRef, UserRef

if TYPE_CHECKING:
    from core.mcp_servers.person_auth import PersonAuth

log = logging.getLogger(__name__)

MakeConnection = Callable[..., Connection]
MCP_ADMINS_ONLY = "Only an admin can see and manage the tool servers."
MCP_USAGE = "Use /mcp, /mcp reconnect <server> or /mcp accept <server> (or /mcp connect|disconnect <server>)."
NOT_CONNECTED = "You have not connected your {server} account: send /mcp connect {server} in a private chat with me."
CONNECT_AGAIN = "Your {server} account needs connecting again: send /mcp connect {server} in a private chat with me."
CONNECT_PRIVATELY = "Send /mcp connect {server} in a private chat with me: the link is yours alone."
NO_PUBLIC_URL = "Accounts cannot be connected yet: the bot's operator must set PUBLIC_BASE_URL."
Key = tuple[str, int]  # a per-person connection's (server, account)


class PersonConnection(Connection):
    """One person's connection to a per_person server: a call the server refused because it wants a new
    authorization (never run: refused unread) tells the person to connect again."""

    def __init__(self, config: ServerConfig, auth: PersonAuth, on_refused: Callable[[], None], **kw: Any) -> None:
        """A connection with the person's OAuth (`on_refused`: when the server wants a new authorization)."""
        super().__init__(config, auth=auth, **kw)
        self.person_auth, self._on_refused = auth, on_refused

    async def call(self, tool: str, arguments: dict[str, Any]) -> Outcome:
        """Connection.call; ToolError (one line: connect again) when the server refused the person's tokens."""
        try:
            return await super().call(tool, arguments)
        except CallFailed:
            if not self.person_auth.refused:
                raise
            self._on_refused()
            raise ToolError(CONNECT_AGAIN.format(server=self.config.name), code="not_connected") from None


_KNOWN_SQL = "SELECT EXISTS (SELECT 1 FROM mcp_tool_pins WHERE server = $1)"
_PIN_SQL = """
INSERT INTO mcp_tool_pins (server, tool, pinned, seen, first_seen)
SELECT $1, t.tool, CASE WHEN $4 THEN t.hash END, t.hash, $5 FROM unnest($2::text[], $3::text[]) AS t(tool, hash)
ON CONFLICT (server, tool) DO UPDATE SET seen = excluded.seen, changed_at =
    CASE WHEN mcp_tool_pins.seen <> excluded.seen THEN excluded.first_seen ELSE mcp_tool_pins.changed_at END
RETURNING tool, pinned IS NOT DISTINCT FROM seen AS accepted
"""


class Hub:
    """The configured MCP servers, their connections and their tools."""

    def __init__(
        self,
        config: McpConfig | None,
        pool: Pool,
        registry: ToolRegistry,
        clock: Clock,
        *,
        budget_tokens: int,
        connect: MakeConnection = Connection,
        keep_images: KeepImages | None = None,
    ) -> None:
        """Serve `config`'s enabled servers' tools into `registry` (nothing happens before start()); `keep_images`
        stores the images results bring (in the media store)."""
        self.config = {s.name: s for s in (config.servers if config else ()) if s.enabled}
        for warning in config.warnings if config else ():
            log.warning("%s", warning)  # e.g. a literal secret in the file
        self.pool, self.registry, self.clock, self.budget = pool, registry, clock, budget_tokens
        self._connect = connect
        self.keep_images = keep_images
        self.connections: dict[str, Connection] = {}
        self._tools: dict[str, tuple[ServerConfig, Tool]] = {}  # agent tool name → its server and tool
        self._tokens: dict[str, int] = {}  # agent tool name → what its schema costs in the prompt (measured once)
        self.held: dict[str, list[str]] = {}  # server → its tools held back (new or changed since pinned)
        self._locks: dict[str, asyncio.Lock] = {}
        self._pinning: set[asyncio.Task[None]] = set()
        # per_person servers: a connection per (server, account), opened on first use, closed when idle
        self.people: dict[Key, PersonConnection] = {}
        self._used: dict[Key, float] = {}  # loop time of the last call
        self._lister: dict[str, Key] = {}  # whose connection lists a per_person server's tools
        self._background: set[asyncio.Task[None]] = set()
        self.callback_url = "http://localhost" + oauth.CALLBACK_PATH  # the bot's own, once /mcp connect gave it
        self.flows = oauth.Authorizations(pool, clock, self._connected)
        self.search = search_tool(self.usable)
        if self.config:  # called like any tool (offered only when the MCP schemas are over the budget)
            registry.add(self.search)

    def start(self) -> None:
        """Connect to every server in the background."""
        for cfg in self.config.values():
            if cfg.credentials == "per_person":  # its tools are listed by the connection of whoever used it last
                self._spawn(self._first_person(cfg))
                continue
            conn = self._connect(cfg, on_tools=self._listed)
            self.connections[cfg.name] = conn
            conn.start()
        if any(cfg.credentials == "per_person" for cfg in self.config.values()):
            self._spawn(self._sweep_loop())

    def _listed(self, server: str, tools: tuple[RemoteTool, ...]) -> None:
        """A server listed its tools (connected, or told they changed): pin them, then offer the accepted ones."""
        task = asyncio.get_running_loop().create_task(self._pin(server, tools))
        self._pinning.add(task)
        task.add_done_callback(self._pinning.discard)

    async def settled(self) -> None:
        """Wait until the tool lists received so far are pinned and registered."""
        while self._pinning:
            await asyncio.gather(*self._pinning, return_exceptions=True)

    async def _pin(self, server: str, tools: Sequence[RemoteTool]) -> None:
        """Record the tools' hashes (the first list of a server is accepted as it is) and register what is accepted."""
        cfg = self.config[server]
        conn = self._handle(cfg)
        async with self._locks.setdefault(server, asyncio.Lock()):

            async def pin() -> list[Any]:
                async with self.pool.acquire() as conn_db, conn_db.transaction():
                    first = not await conn_db.fetchval(_KNOWN_SQL, server)
                    return await conn_db.fetch(
                        _PIN_SQL, server, [t.name for t in tools], [schema_hash(t) for t in tools], first, self.clock()
                    )

            try:
                rows = await retry_dropped(pin, "pinning MCP tools", pool=self.pool)  # an upsert: safe to repeat
            except Exception as e:  # the database is down: nothing is offered until the next listing
                log.warning("MCP server %s: its tools could not be pinned (%s)", server, type(e).__name__)
                return
            accepted = {r["tool"] for r in rows if r["accepted"]}
            held = sorted(t.name for t in tools if t.name not in accepted)
            if held and held != self.held.get(server):
                log.warning(
                    "MCP server %s: new or changed tools held back until an admin accepts them: %s",
                    server,
                    ", ".join(held),
                )
            self.held[server] = held
            self._register(cfg, conn, [t for t in tools if t.name in accepted])

    def _register(self, cfg: ServerConfig, conn: Connection | PickConnection, tools: Sequence[RemoteTool]) -> None:
        """Put the server's accepted tools in the registry (sorted: a stable order), its others out."""
        for name in [n for n, (c, _) in self._tools.items() if c.name == cfg.name]:
            del self._tools[name]
            self._tokens.pop(name, None)
            self.registry.remove(name)
        for remote in sorted(tools, key=lambda t: t.name):
            tool = agent_tool(cfg, remote, conn, keep=self.keep_images)
            if tool is None:
                continue
            if self.registry.get(tool.name) is not None:  # never overwritten: another server's, or a capability
                log.warning("MCP server %s: tool %s left out: the name %s is taken", cfg.name, remote.name, tool.name)
                continue
            self._tools[tool.name] = (cfg, tool)
            self._tokens[tool.name] = schema_tokens([tool])
            self.registry.add(tool)

    def usable_names(self) -> list[str]:
        """Every MCP tool offered to someone, by name."""
        return sorted(self._tools)

    def usable(self, ctx: ToolContext) -> list[Tool]:
        """The MCP tools the speaker may use in this turn, by name."""
        return [tool for name, (cfg, tool) in sorted(self._tools.items()) if may_use(cfg, ctx)]

    def offer(self, tools: list[Tool], ctx: ToolContext) -> list[Tool]:
        """A turn's tools with the MCP ones the speaker may use: all of them while their schemas fit the budget, else
        mcp_search and what it found."""
        if not self._tools:
            return tools
        own = [t for t in tools if not t.name.startswith(PREFIX) and t.name != SEARCH]
        usable = self.usable(ctx)
        if sum(self._tokens[t.name] for t in usable) <= self.budget:
            return own + usable
        return [*own, self.search, *(t for t in usable if t.name in ctx.found)]

    def lines(self) -> list[str]:
        """One line per server: its state, its tools, what is held back."""
        out = []
        for name in sorted(self.config):
            conn = self.connections.get(name)
            count = sum(1 for c, _ in self._tools.values() if c.name == name)
            tools = f"{count} tool{'s' if count != 1 else ''}"
            if conn is None:  # per_person
                live = sum(1 for server, _ in self.people if server == name)
                line = f"{name}: per person, {live} connected now, {tools}"
            else:
                line = f"{name}: {conn.state}, {tools}"
            if self.held.get(name):
                line += f", {len(self.held[name])} held back (/mcp accept {name})"
            if conn is not None and conn.state != "ready" and conn.last_error:
                line += f" — {conn.last_error}"
            out.append(line)
        return out

    async def command(self, action: str, server: str) -> str:
        """/mcp for an admin: the servers (show), or reconnect or accept one."""
        action = action.lower() or "show"
        if action == "show":
            return (
                "\n".join(["**MCP tool servers**", *(f"- {line}" for line in self.lines())])
                if self.config
                else ("No MCP tool servers are configured (MCP_CONFIG).")
            )
        if action not in ("reconnect", "accept") or not server:
            return MCP_USAGE
        return await (self.reconnect(server) if action == "reconnect" else self.accept(server))

    async def accept(self, server: str) -> str:
        """An admin accepts the server's tools as they are now."""
        if server not in self.config:
            return f"There is no MCP server named {server!r}."
        await self.pool.execute("UPDATE mcp_tool_pins SET pinned = seen WHERE server = $1", server)
        conn = self.connections.get(server) or self.people.get(self._lister.get(server, ("", 0)))
        self._listed(server, conn.tools if conn is not None else ())
        await self.settled()
        return f"Accepted the tools of {server} as they are now."

    async def reconnect(self, server: str) -> str:
        """An admin reconnects a server."""
        if server not in self.config:
            return f"There is no MCP server named {server!r}."
        conns = [self.connections[server]] if server in self.connections else []
        conns += [c for (name, _), c in self.people.items() if name == server]
        for conn in conns:
            await conn.reconnect()
        return f"Reconnecting {server}."

    async def allow(self, user: UserRef, chat: ChatRef, is_admin: bool, ask_id: int) -> tuple[bool, str]:
        """The person allows a call parked for their OK (its button, or /mcp allow <id>): only the person who was asked,
        once, before it expires; (whether it ran, the line or the result to show them)."""
        parked = await confirm.claim(self.pool, ask_id, user.id, self.clock())
        if isinstance(parked, str):
            return False, parked
        entry = self._tools.get(tool_name(parked.server, parked.tool))
        if entry is None:  # the server or the tool is gone (or held back since)
            await confirm.settle(self.pool, parked, "refused")
            return False, confirm.GONE.format(what=parked.what)
        ctx = ToolContext(self.pool, user, chat, is_admin, self.clock, personal=chat.kind != "group")
        try:
            with confirm.allowing():
                result = str(await entry[1].handler(parked.arguments, ctx))
        except ToolError as e:
            if e.code in ("forbidden", "unavailable"):  # not made: refused for good, or try again later
                await confirm.settle(self.pool, parked, "refused" if e.code == "forbidden" else "pending")
                line = confirm.GONE if e.code == "forbidden" else confirm.UNREACHED
                return False, line.format(what=parked.what, error=str(e))
            return True, await confirm.ran(self.pool, parked, str(e), ok=False)
        return True, await confirm.ran(self.pool, parked, result, ok=True)

    async def close(self) -> None:
        """Close every connection."""
        for task in [*self._background, *self._pinning]:
            task.cancel()
        await self.flows.close()
        conns = [*self.connections.values(), *self.people.values()]
        self.people.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    # Per-person connections (`credentials: per_person`).

    def _spawn(self, work: object) -> None:
        """Run a coroutine of the hub in the background (cancelled by close())."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _handle(self, cfg: ServerConfig) -> Connection | PickConnection:
        """What a server's agent tools call: its connection, or for a per_person server the speaker's own."""
        return partial(self.person, cfg) if cfg.credentials == "per_person" else self.connections[cfg.name]

    async def _first_person(self, cfg: ServerConfig) -> None:
        """At start: the connection of whoever used a per_person server last lists its tools (then idles out)."""
        try:
            account = await oauth.latest_account(self.pool, cfg.name)
        except Exception as e:  # the database is down: the first person to connect lists them
            log.warning("MCP server %s: no one's connection lists its tools yet (%s)", cfg.name, type(e).__name__)
            return
        if account is not None and (cfg.name, account) not in self.people:
            self._open(cfg, account)

    def _open(self, cfg: ServerConfig, account: int) -> PersonConnection:
        """Open the person's connection to the server (it lists the tools when no one else's does)."""
        from core.mcp_servers.person_auth import PersonAuth  # the SDK's OAuth: imported once a person connects

        key = (cfg.name, account)
        auth = PersonAuth(self.pool, cfg, account, self.clock, self.callback_url)
        lister = self._lister.get(cfg.name) not in self.people
        conn = PersonConnection(
            cfg, auth, lambda: self._spawn(self._drop(key)), on_tools=self._listed if lister else None
        )
        if lister:
            self._lister[cfg.name] = key
        self.people[key] = conn
        self._used[key] = asyncio.get_running_loop().time()
        conn.start()
        return conn

    async def person(self, cfg: ServerConfig, ctx: ToolContext) -> Connection:
        """The speaker's own connection to a per_person server, opened on first use; ToolError (one line) when they
        have not connected their account, or the server wants them to connect it again."""
        key = (cfg.name, ctx.user.account_id)
        conn = self.people.get(key)
        if conn is None or conn.state == "closed":
            if not await oauth.connected(self.pool, cfg.name, ctx.user.account_id):
                raise ToolError(NOT_CONNECTED.format(server=cfg.name), code="not_connected")
            conn = self.people.get(key)  # another call of theirs may have opened it meanwhile
            if conn is None or conn.state == "closed":
                conn = self._open(cfg, ctx.user.account_id)
        self._used[key] = asyncio.get_running_loop().time()
        if not await conn.ready(cfg.connect_timeout) and conn.person_auth.refused:
            await self._drop(key)
            raise ToolError(CONNECT_AGAIN.format(server=cfg.name), code="not_connected")
        return conn

    async def _drop(self, key: Key) -> None:
        """Close a person's connection."""
        conn = self.people.pop(key, None)
        self._used.pop(key, None)
        if conn is not None:
            await conn.close()

    async def sweep(self, idle_s: float = MCP_PERSON_IDLE_S) -> int:
        """Close the per-person connections unused for `idle_s`; how many."""
        now = asyncio.get_running_loop().time()
        idle = [key for key, used in self._used.items() if now - used >= idle_s]
        for key in idle:
            await self._drop(key)
        return len(idle)

    async def _sweep_loop(self) -> None:
        """Close idle per-person connections now and then."""
        while True:
            await asyncio.sleep(MCP_PERSON_SWEEP_S)
            await self.sweep()

    async def _connected(self, server: str, account: int) -> None:
        """A person connected their account: their next call uses the new tokens (and lists the tools when no one's
        connection does)."""
        await self._drop((server, account))
        self._open(self.config[server], account)

    def _may_connect(self, cfg: ServerConfig, identity: str, is_admin: bool) -> bool:
        """Whether a person may connect their account to a per_person server (its `access`)."""
        if cfg.credentials != "per_person" or not cfg.enabled:
            return False
        if isinstance(cfg.access, frozenset):
            return identity in cfg.access
        return cfg.access == "everyone" or is_admin

    async def personal(
        self,
        action: str,
        server: str,
        *,
        account_id: int,
        identity: str,
        is_admin: bool,
        private: bool,
        base_url: str | None,
    ) -> str:
        """/mcp connect <server> (the authorization link, in a private chat) and /mcp disconnect <server> (forget the
        person's tokens), for anyone a per_person server's `access` lets in."""
        mine = sorted(name for name, cfg in self.config.items() if self._may_connect(cfg, identity, is_admin))
        cfg = self.config.get(server)
        if cfg is None or server not in mine:
            offer = f" Servers you can connect: {', '.join(mine)}." if mine else ""
            return (
                f"There is no server {server!r} that you can connect an account to.{offer}"
                if server
                else (f"Use /mcp {action} <server>.{offer}")
            )
        if action == "disconnect":
            gone = await oauth.forget(self.pool, server, account_id)
            await self._drop((server, account_id))
            return f"Forgot your {server} account." if gone else f"You had not connected a {server} account."
        if not private:
            return CONNECT_PRIVATELY.format(server=server)
        if base_url is None:
            return NO_PUBLIC_URL
        if not cfg.url:
            return f"{server} is a program on the bot's machine: it has no accounts to connect."
        self.callback_url = base_url.rstrip("/") + oauth.CALLBACK_PATH
        try:
            link = await self.flows.begin(cfg, account_id, base_url)
        except oauth.ConnectFailed as e:
            return str(e)
        minutes = int(MCP_OAUTH_LINK_S // 60)
        return f"Open this link to connect your {server} account (it works for {minutes} minutes, once):\n{link}"

    async def finish_oauth(self, state: str, code: str, error: str = "", iss: str | None = None) -> tuple[bool, str]:
        """The bot's OAuth callback (/mcp/oauth/callback): finish a /mcp connect; whether it worked, and one line
        for the page."""
        return await self.flows.finish(state, code, error, iss)
