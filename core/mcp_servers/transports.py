"""The transports of core/mcp_servers/connection.py's sessions, over the `mcp` SDK and httpx2: imported only when a
session is opened (starting the bot imports no SDK), marking on the current call whether its request may have reached
the server."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from types import TracebackType

import anyio
import httpx2
from anyio.abc import ByteReceiveStream, ByteSendStream, Process
from anyio.streams.memory import MemoryObjectSendStream
from mcp import types
from mcp.client._transport import TransportStreams  # the SDK's type of a transport's streams: only exported there
from mcp.client.streamable_http import streamable_http_client
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from core.constants import (
    MCP_LINE_CHARS,
    MCP_SESSION_BODY_BYTES,
    MCP_SSE_READ_TIMEOUT_S,
    MCP_STDIO_EXIT_S,
    MCP_STDIO_LINE_BYTES,
)
from core.mcp_servers.attempt import mark
from core.mcp_servers.results import clean
from core.quoting import truncate

# What the transports say is logged as the connection's own (the name operators and tests filter on)
log = logging.getLogger("core.mcp_servers.connection")

# A 400 whose body says this names a lost session (the TypeScript SDK's servers: "No valid session ID provided", "Server
# not initialized"); the Python SDK's say 404.
_SESSION_LOST = re.compile(r"\bsession\b|not initiali[sz]ed", re.IGNORECASE)  # not a parameter "session_id"


# Streamable HTTP: the SDK's transport over an httpx2 client whose transport marks each call's request.


class _Watched(httpx2.AsyncBaseTransport):
    """The HTTP transport, noting on the current call whether its request may have reached the server."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        """Wrap `inner`."""
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send `request`; a connection never made means the call was not delivered, a session the server does not
        know (a 404, or a 400 that names it) refused."""
        try:
            response = await self._inner.handle_async_request(request)
        except (httpx2.ConnectError, httpx2.ConnectTimeout):
            raise
        except BaseException:
            mark()
            raise
        lost = False
        if "mcp-session-id" in request.headers and response.status_code in (400, 404):
            if response.status_code == 400:
                response, body = await _read_small(response, request)
                lost = bool(_SESSION_LOST.search(body))
            else:
                lost = True
        if lost:
            mark(delivered=False, refused=True)  # the server restarted: it does not know the session
        else:
            mark()
        return response

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._inner.aclose()


async def _read_small(response: httpx2.Response, request: httpx2.Request) -> tuple[httpx2.Response, str]:
    """An error response read whole (its body, decoded, kept for the SDK to read again) and its text to look at; a body
    over MCP_SESSION_BODY_BYTES is no session's error: passed on unread, with no text."""
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > MCP_SESSION_BODY_BYTES:
        return response, ""
    try:
        body = await response.aread()
    finally:
        await response.aclose()
    drop = ("content-encoding", "content-length", "transfer-encoding")  # the body is decoded now
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in drop]
    again = httpx2.Response(
        response.status_code, headers=headers, content=body, request=request, extensions=response.extensions
    )
    return again, body[:MCP_SESSION_BODY_BYTES].decode(errors="replace")


@asynccontextmanager
async def http(
    url: str, headers: Mapping[str, str], connect_timeout: float, auth: httpx2.Auth | None = None
) -> AsyncIterator[TransportStreams]:
    """The Streamable HTTP transport to `url` sending `headers` (and `auth`'s, e.g. an OAuth bearer token)."""
    timeout = httpx2.Timeout(connect_timeout, read=MCP_SSE_READ_TIMEOUT_S)
    transport = _Watched(httpx2.AsyncHTTPTransport())
    http = httpx2.AsyncClient(headers=dict(headers), timeout=timeout, transport=transport, auth=auth)
    async with http, streamable_http_client(url, http_client=http) as streams:
        yield streams


# stdio: our own transport (the SDK's adds variables of the bot's environment to the child's), writing each request
# in the caller's task so that a write into a dead child's stdin tells the call it was not delivered.


class Stdio:
    """A stdio server as an MCP transport: the child in its own process group, one JSON-RPC message per line."""

    def __init__(
        self, argv: list[str], env: dict[str, str], cwd: str | None, name: str, on_lost: Callable[[], None]
    ) -> None:
        """The transport for `argv` (not started)."""
        self._argv, self._env, self._cwd, self._name, self._on_lost = argv, env, cwd, name, on_lost
        self._stack: AsyncExitStack | None = None

    async def __aenter__(self) -> TransportStreams:
        """Start the child."""
        stack = AsyncExitStack()
        streams = await stack.enter_async_context(self._run())
        self._stack = stack
        return streams

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the child."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def _run(self) -> AsyncIterator[TransportStreams]:
        """The child running with its pipes read, then stopped (within bounds, even when cancelled)."""
        with anyio.CancelScope(shield=True):  # a spawn cancelled half-way leaves the child and its pipes behind
            process = await anyio.open_process(self._argv, env=self._env, cwd=self._cwd, start_new_session=True)
        assert process.stdin and process.stdout and process.stderr
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        writer = _PipeWriter(process.stdin, self._on_lost)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._read, process.stdout, send)
            tg.start_soon(self._stderr, process.stderr)
            try:
                yield receive, writer
            finally:
                with anyio.CancelScope(shield=True):
                    receive.close()
                    await writer.aclose()
                    await _stop(process, self._name)
                tg.cancel_scope.cancel()

    async def _read(self, stdout: ByteReceiveStream, send: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        """Parse the child's stdout line by line into the session; its end (EOF) breaks the session."""
        pending = bytearray()
        try:
            async with send:
                async for chunk in stdout:
                    start = 0
                    while (end := chunk.find(b"\n", start)) >= 0:
                        pending += chunk[start:end]
                        start = end + 1
                        if pending.strip():
                            await send.send(_parsed(bytes(pending)))
                        pending.clear()
                    pending += chunk[start:]
                    if len(pending) > MCP_STDIO_LINE_BYTES:
                        log.warning("MCP server %r: a message over %d bytes; closing", self._name, MCP_STDIO_LINE_BYTES)
                        break
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass  # our own shutdown closed a stream under the read
        finally:
            self._on_lost()

    async def _stderr(self, stderr: ByteReceiveStream) -> None:
        """Log what the child writes to stderr, a line at a time."""
        pending = b""
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for chunk in stderr:
                *lines, rest = (pending + chunk).split(b"\n")
                pending = rest[-MCP_LINE_CHARS * 4 :]
                for line in lines:
                    if text := line.decode(errors="replace").strip():
                        log.info("MCP server %r: %s", self._name, truncate(clean(text), MCP_LINE_CHARS, one_line=True))


class _PipeWriter:
    """The session's write stream: each message written to the child's stdin in the sender's task."""

    def __init__(self, stdin: ByteSendStream, on_lost: Callable[[], None]) -> None:
        """Write to `stdin`."""
        self._stdin = stdin
        self._on_lost = on_lost
        self._lock = anyio.Lock()

    async def send(self, item: SessionMessage, /) -> None:
        """Write one message; a dead child's pipe is BrokenResourceError (and the call was not delivered)."""
        data = (item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()
        try:
            async with self._lock:
                await self._stdin.send(data)
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as e:
            self._on_lost()
            raise anyio.BrokenResourceError from e
        except BaseException:
            mark()  # cancelled mid-write: part of it may be in the pipe
            raise
        if _pipe_closing(self._stdin):  # asyncio reports a write into a dead child's pipe only on the next one
            self._on_lost()
            raise anyio.BrokenResourceError
        mark()

    async def aclose(self) -> None:
        """Close the child's stdin (its signal to exit)."""
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._stdin.aclose()

    async def __aenter__(self) -> _PipeWriter:
        """Itself."""
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the child's stdin."""
        await self.aclose()


def _pipe_closing(stdin: ByteSendStream) -> bool:
    """Whether the pipe under anyio's stream has failed (attributes walked: nothing public says so; a stream without
    them is taken as open, and the call as delivered)."""
    transport = getattr(getattr(stdin, "_stream", None), "transport", None)
    closing = getattr(transport, "is_closing", None)
    return bool(callable(closing) and closing())


def _parsed(line: bytes) -> SessionMessage | Exception:
    """One line of the child's stdout as a message, or the error for the session to report."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as e:
        return e


async def _stop(process: Process, name: str) -> None:
    """Let the child exit after its stdin closed; kill its process group when it does not in MCP_STDIO_EXIT_S."""
    if not await _exited(process, MCP_STDIO_EXIT_S):
        await terminate_posix_process_tree(process, MCP_STDIO_EXIT_S)
        if not await _exited(process, MCP_STDIO_EXIT_S):
            log.warning("MCP server %r: process %d survived being killed", name, process.pid)
            return
    with anyio.move_on_after(MCP_STDIO_EXIT_S):
        await process.aclose()
    # asyncio's subprocess transport can stay open after that (and warn when collected): closed as the SDK does
    close = getattr(getattr(getattr(process, "_process", None), "_transport", None), "close", None)
    if callable(close):
        with suppress(PermissionError):
            close()


async def _exited(process: Process, timeout: float) -> bool:
    """Whether the child exits within `timeout` (its return code polled: wait() also waits for its pipes)."""
    with anyio.move_on_after(timeout):
        while process.returncode is None:  # noqa: ASYNC110 (nothing to wait on: the event loop reaps the child)
            await anyio.sleep(0.01)
    return process.returncode is not None
