"""A connection to one MCP server that heals: one long-lived task holds the SDK's session (entered and left in that
task, as anyio wants), reconnects with backoff when the stdio child dies, the HTTP server restarts or the network
fails, pauses a server that failed MCP_FAILURES_BEFORE_PAUSE times in a row, and re-lists the tools when the server
says they changed. Calls run in the caller's task on the current session, each within the server's timeout; a call is
sent again on a fresh connection only when it never reached the server. The `mcp` SDK is imported where a session is
opened or its answers read (its transports: core/mcp_servers/transports.py), not by starting the bot."""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, Literal

import anyio
from anyio.abc import TaskStatus

from core.constants import (
    MCP_CALL_GRACE_S,
    MCP_FAILURES_BEFORE_PAUSE,
    MCP_LINE_CHARS,
    MCP_PAGES_MAX,
)
from core.mcp_servers.attempt import ATTEMPT, Attempt
from core.mcp_servers.config import ServerConfig
from core.mcp_servers.errors import describe
from core.mcp_servers.results import Outcome, clean, outcome
from core.quoting import truncate

if TYPE_CHECKING:
    import httpx2
    from mcp import types
    from mcp.client import Client, IncomingMessage
    from mcp.client._transport import TransportStreams  # the SDK exports this type from its private module only

log = logging.getLogger(__name__)

State = Literal["connecting", "ready", "failing", "paused", "closed"]
OnTools = Callable[[str, "tuple[RemoteTool, ...]"], None]
# All a stdio server gets of the bot's own environment (those set): where programs are, and how this machine reaches
# the network (its certificate authorities and proxies: uvx and npx fetch packages through them)
INHERITED_ENV = (
    *("PATH", "HOME", "LANG"),
    *("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"),
    *("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"),
)


class _TeardownNoise(logging.Filter):
    """The SDK's HTTP transport logs an SSE event that arrives as its session closes ("Error parsing SSE message" with
    BrokenResourceError: teardown, by its own account) as an error; a connection left on purpose is none."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Drop records about a stream closed under the transport."""
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, anyio.BrokenResourceError | anyio.ClosedResourceError)


logging.getLogger("mcp.client.streamable_http").addFilter(_TeardownNoise())


@dataclass(frozen=True)
class RemoteTool:
    """A tool as the server lists it (its description stripped of invisible characters)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool | None = None  # annotations.readOnlyHint
    destructive: bool | None = None  # annotations.destructiveHint


class CallFailed(Exception):
    """A call that brought no result; str(e) is one line for the model."""

    def __init__(self, message: str, *, reached: bool) -> None:
        """`reached` False: the request never reached the server (safe to retry); True: the outcome is unknown."""
        super().__init__(message)
        self.reached = reached


def child_env(config: ServerConfig, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A stdio server's whole environment: INHERITED_ENV of ours, then the file's `env`, then `extra`."""
    env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
    env.update(config.env)
    env.update(extra or {})
    return env


class Connection:
    """One MCP server: connected in the background, healed when it breaks, called from any task."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        backoff: Sequence[float] = (1, 2, 5, 10, 30),
        pause_s: float = 60.0,
        stable_s: float = 10.0,
        on_tools: OnTools | None = None,
        extra_env: Mapping[str, str] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        auth: httpx2.Auth | None = None,
    ) -> None:
        """A connection to `config`'s server, not started yet (`auth`: an HTTP server's OAuth, e.g. a person's;
        sessions the server ends within `stable_s` of being ready count as failures from the second in a row)."""
        self.config = config
        self.state: State = "connecting"
        self.tools: tuple[RemoteTool, ...] = ()
        self.last_error: str | None = None
        self.failures = 0
        self._backoff = tuple(backoff) or (0.0,)
        self._pause_s = pause_s
        self._stable_s = stable_s
        self._on_tools = on_tools
        self._extra_env = dict(extra_env or {})
        self._extra_headers = dict(extra_headers or {})
        self._auth = auth
        self._task: asyncio.Task[None] | None = None
        self._client: Client | None = None  # the session calls use (None while there is none)
        self._number = 0  # the session's number: a transport of an older one cannot break a newer one
        self._scope: anyio.CancelScope | None = None  # the session's connecting phase, cancelled by close()
        self._serving = False
        self._closing = False
        self._renew = False  # leave the session and connect again
        self._now = False  # reconnect() was asked: no backoff or pause before the next attempt
        self._brief = 0  # sessions in a row that ended on their own within stable_s of being ready
        self._relist = False
        self._wake = asyncio.Event()  # the task: something above changed
        self._changed = asyncio.Event()  # waiters on the state (replaced on every change)

    # The life of the connection, in its own task.

    def start(self) -> None:
        """Start the connection's task; returns at once (start-up never waits for a server)."""
        if self._task is None and not self._closing:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"mcp {self.config.name}")

    async def ready(self, timeout: float) -> bool:
        """Whether the server is ready, waiting at most `timeout` seconds for it."""
        try:
            async with asyncio.timeout(timeout):
                while self.state != "ready":
                    if self.state == "closed":
                        return False
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    async def reconnect(self) -> None:
        """Leave the current session (or pause) and connect again now."""
        if self._closing:
            return
        self.failures = self._brief = 0
        self._now = True
        self._lost(self._number, force=True)

    async def close(self) -> None:
        """Leave the session and stop the task (a stdio server is asked to exit, then killed)."""
        self._closing = True
        self._wake.set()
        if self._scope is not None and not self._serving:
            self._scope.cancel()  # connecting: nothing to leave cleanly
        task, self._task = self._task, None
        if task is not None:
            await task
        self._set("closed")

    async def _run(self) -> None:
        """Connect, serve until the session breaks, wait (backoff or pause), again; until closed."""
        try:
            while not self._closing:
                await self._session()
                if self._closing:
                    break
                if self.failures >= MCP_FAILURES_BEFORE_PAUSE:
                    self._set("paused")
                    await self._rest(self._pause_s)
                elif self.failures:
                    self._set("failing")
                    await self._rest(self._backoff[min(self.failures, len(self._backoff)) - 1])
        except Exception:
            log.exception("MCP server %r: the connection's task failed", self.config.name)
        finally:
            self._client = None
            self._set("closed")

    async def _rest(self, seconds: float) -> None:
        """Wait `seconds`, or less when reconnect() or close() is called (a session lost meanwhile does not count:
        a child that dies while connecting must not start the next attempt at once)."""
        with anyio.move_on_after(seconds):
            while not (self._now or self._closing):
                self._wake.clear()
                await self._wake.wait()

    async def _session(self) -> None:
        """One session: connect within connect_timeout, list the tools, serve until it breaks or is left."""
        from mcp.types.version import MODERN_PROTOCOL_VERSIONS

        self._number += 1
        number = self._number
        self._renew = self._relist = self._now = False
        self._set("connecting" if not self.failures else "failing")
        client = self._make_client(number)
        scope = self._scope = anyio.CancelScope(deadline=anyio.current_time() + self.config.connect_timeout)
        ready_at: float | None = None
        error: str | None = None
        try:
            with scope:
                async with client, anyio.create_task_group() as tg:
                    if client.protocol_version in MODERN_PROTOCOL_VERSIONS:  # subscribed before listing: no gap
                        await tg.start(self._listen, client, number)
                    tools = await self._list(client)
                    scope.deadline = math.inf
                    self._serving = True
                    ready_at = anyio.current_time()
                    self._client, self.tools, self.failures, self.last_error = client, tools, 0, None
                    self._set("ready")
                    level = logging.DEBUG if self._brief > 1 else logging.INFO  # a streak of brief sessions: logged
                    log.log(level, "MCP server %r: ready, %d tools", self.config.name, len(tools))
                    self._tell(tools)
                    await self._serve(client)
                    tg.cancel_scope.cancel()
            if scope.cancelled_caught and ready_at is None and not self._closing:
                raise TimeoutError(f"no answer within {self.config.connect_timeout:g} s")
        except Exception as e:
            error = self.describe(e)
        finally:
            self._client, self._scope, self._serving = None, None, False
        if not self._closing:
            self._ended(ready_at, error)

    def _ended(self, ready_at: float | None, error: str | None) -> None:
        """Count the session that ended in the failures (the backoff and pause go by them): one that never became
        ready, and one the server ended soon after it was ready when the one before ended so too (a server that
        dies right after its handshake); a streak of failures is logged once."""
        if ready_at is None:
            self.failures += 1
            error = error or "the connection closed while connecting"
        elif self._now or anyio.current_time() - ready_at >= self._stable_s:
            self._brief = 0  # left on purpose, or it served a while: connect again at once
        else:
            self._brief += 1
            self.failures = self._brief - 1
            if self.failures:
                lasted = anyio.current_time() - ready_at
                error = f"{error or 'the session ended'} {lasted:.1f} s after connecting, {self._brief} times in a row"
        if error is None:
            return
        self.last_error = error
        level = logging.WARNING if self.failures <= 1 else logging.DEBUG  # the rest of the streak: /status shows it
        log.log(level, "MCP server %r: %s", self.config.name, error)

    async def _serve(self, client: Client) -> None:
        """Hold the session: re-list the tools when they change, until it is to be left."""
        while not (self._closing or self._renew):
            if self._relist:
                self._relist = False
                await self._relisted(client)
                continue
            self._wake.clear()
            await self._wake.wait()

    async def _listen(
        self, client: Client, number: int, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Hold a 2026-era server's change stream open (started once the server acknowledged it: subscribed before
        the tools are listed, no change falls between); its loss breaks the session."""
        from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
        from mcp.shared.exceptions import MCPError

        started = False
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                task_status.started()
                started = True
                async for _event in subscription:
                    pass  # each event also reaches _on_message as a notification (the SDK tees them)
        except (ListenNotSupportedError, MCPError, TimeoutError) as e:
            log.info("MCP server %r: no change notifications (%s)", self.config.name, self.describe(e))
        except SubscriptionLost:
            self._lost(number)
        finally:
            if not started:
                task_status.started()

    async def _relisted(self, client: Client) -> None:
        """Read the tool list again after the server said it changed."""
        from mcp.shared.exceptions import MCPError

        try:
            with anyio.fail_after(self.config.connect_timeout):
                tools = await self._list(client)
        except (MCPError, TimeoutError) as e:
            log.warning("MCP server %r: its changed tool list was not read: %s", self.config.name, self.describe(e))
            return
        self.tools = tools
        self._set(self.state)
        log.info("MCP server %r: the tool list changed, %d tools", self.config.name, len(tools))
        self._tell(tools)

    async def _list(self, client: Client) -> tuple[RemoteTool, ...]:
        """The server's tools (all pages) that the file's include/exclude globs let through, without those that need
        what the bot lacks."""
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MCP_PAGES_MAX):
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        wanted = [tool for tool in listed if self.wanted(tool.name)]
        unfit = [tool.name for tool in wanted if _needs_tasks(tool)]
        if unfit:
            log.info(
                "MCP server %r: left out %s: task-augmented calls needed, which the bot does not make",
                self.config.name,
                truncate(clean(", ".join(unfit)), MCP_LINE_CHARS, one_line=True),
            )
        return tuple(_remote(tool) for tool in wanted if not _needs_tasks(tool))

    def wanted(self, tool: str) -> bool:
        """Whether the file's globs let `tool` through."""
        return any(fnmatchcase(tool, g) for g in self.config.include) and not any(
            fnmatchcase(tool, g) for g in self.config.exclude
        )

    def _tell(self, tools: tuple[RemoteTool, ...]) -> None:
        """Hand the listed tools to on_tools."""
        if self._on_tools is not None:
            try:
                self._on_tools(self.config.name, tools)
            except Exception:
                log.exception("MCP server %r: on_tools failed", self.config.name)

    def _lost(self, number: int, *, force: bool = False) -> None:
        """Session `number` is broken (or is to be left): leave it and connect again."""
        if self._closing or (number != self._number and not force):
            return
        self._renew = True
        self._client = None
        if self.state in ("ready", "paused"):
            self._set("connecting")
        self._wake.set()

    def _set(self, state: State) -> None:
        """Change the state and wake everything waiting for a change."""
        self.state = state
        self._changed.set()
        self._changed = asyncio.Event()

    async def _on_message(self, message: IncomingMessage) -> None:
        """A notification or transport error from the server: a changed tool list is read again."""
        from mcp import types

        if isinstance(message, types.ToolListChangedNotification):
            self._relist = True
            self._wake.set()
        elif isinstance(message, Exception):
            log.info("MCP server %r: %s", self.config.name, self.describe(message))

    # Sessions: the SDK's Client over our transports.

    def _make_client(self, number: int) -> Client:
        """A Client for session `number` (tests override this to connect one in memory)."""
        from mcp.client import Client

        return Client(
            self._transport(number),
            message_handler=self._on_message,
            read_timeout_seconds=self.config.connect_timeout,  # listing and the handshake; calls pass their own
            cache=None,  # a changed tool list must be read from the server
        )

    def _transport(self, number: int) -> AbstractAsyncContextManager[TransportStreams]:
        """The transport the file names: a stdio child or Streamable HTTP."""
        from core.mcp_servers.transports import Stdio, http

        if self.config.command:
            argv = [self.config.command, *self.config.args]
            env = child_env(self.config, self._extra_env)
            return Stdio(argv, env, self.config.cwd, self.config.name, lambda: self._lost(number))
        if self.config.url:
            headers = {**self.config.headers, **self._extra_headers}
            return http(self.config.url, headers, self.config.connect_timeout, self._auth)
        raise ValueError("the server has neither a command nor a url")

    # Calls, in the caller's task.

    async def call(self, tool: str, arguments: dict[str, Any]) -> Outcome:
        """Call `tool` within the server's timeout; CallFailed when no result came (say whether it reached it)."""
        from mcp import types
        from mcp.shared.exceptions import MCPError
        from mcp.types import REQUEST_TIMEOUT

        name = self.config.name
        if not self.wanted(tool):
            raise CallFailed(f"the tool {tool!r} of server {name!r} is excluded by its configuration", reached=False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout
        retried = False
        while True:
            client, number = await self._current(deadline)
            attempt = Attempt()
            failure: Exception
            token = ATTEMPT.set(attempt)
            try:
                remaining = max(deadline - loop.time(), 0.0)
                with anyio.fail_after(remaining + MCP_CALL_GRACE_S):
                    result = await client.call_tool(tool, arguments, read_timeout_seconds=remaining)
                return outcome(result)
            except MCPError as e:  # an error answer, the SDK's timeout, or the connection closed under the call
                failure, gone, late = e, e.code == types.CONNECTION_CLOSED or attempt.refused, e.code == REQUEST_TIMEOUT
            except TimeoutError as e:
                failure, gone, late = e, False, True
            except RuntimeError as e:  # the session was left under the call, or its answer broke a rule
                failure, gone, late = e, self._client is not client, False
            except Exception as e:
                failure, gone, late = e, False, False
            finally:
                ATTEMPT.reset(token)
            if late:
                raise self._timed_out(tool, reached=attempt.delivered or isinstance(failure, MCPError))
            if not gone:
                verb = "refused the call to" if isinstance(failure, MCPError) else "answered wrongly to"
                raise CallFailed(f"server {name!r} {verb} {tool}: {self.describe(failure)}", reached=True)
            self._lost(number)
            if attempt.delivered and not attempt.refused:
                raise CallFailed(
                    f"the connection to server {name!r} broke during the call to {tool}: the outcome is unknown",
                    reached=True,
                )
            if retried:
                raise CallFailed(f"server {name!r} could not be reached: {self.describe(failure)}", reached=False)
            retried = True

    async def _current(self, deadline: float) -> tuple[Client, int]:
        """The current session, waiting for one until `deadline`; CallFailed (not reached) when there is none."""
        name = self.config.name
        loop = asyncio.get_running_loop()
        while True:
            if self._client is not None and self.state == "ready":
                return self._client, self._number
            why = f": {self.last_error}" if self.last_error else ""
            if self.state == "paused":
                raise CallFailed(
                    f"server {name!r} is paused after {self.failures} failed connections{why}", reached=False
                )
            if self.state == "closed" or self._task is None:
                raise CallFailed(f"server {name!r} is not running", reached=False)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise CallFailed(f"server {name!r} is not connected{why}", reached=False)
            with suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed.wait()

    def _timed_out(self, tool: str, *, reached: bool) -> CallFailed:
        """The CallFailed of a call that ran out of time."""
        unknown = ": the outcome is unknown" if reached else ""
        return CallFailed(
            f"{tool} on server {self.config.name!r} gave no answer within {self.config.timeout:g} s{unknown}",
            reached=reached,
        )

    def describe(self, error: BaseException) -> str:
        """`error` as one line with no secret of this connection's in it (core/mcp_servers/errors.py)."""
        return describe(error, self.config, (*self._extra_env.values(), *self._extra_headers.values()))


def _remote(tool: types.Tool) -> RemoteTool:
    """A listed tool as a RemoteTool."""
    hints = tool.annotations
    return RemoteTool(
        name=tool.name,
        description=clean(tool.description or tool.title or ""),
        input_schema=dict(tool.input_schema),
        read_only=hints.read_only_hint if hints else None,
        destructive=hints.destructive_hint if hints else None,
    )


def _needs_tasks(tool: types.Tool) -> bool:
    """Whether a tool can only be called as a task (2025-11-25 `execution.taskSupport: required`), which the bot
    does not do: its plain call would fail."""
    return tool.execution is not None and tool.execution.task_support == "required"
