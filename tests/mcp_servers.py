"""Real MCP servers for the tests, written with the SDK's MCPServer: in memory, a stdio child
(`python -m tests.mcp_servers stdio`) and Streamable HTTP served by uvicorn on 127.0.0.1 inside the test's loop."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import anyio
import uvicorn
from mcp import types
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    OAuthAuthorizationServerProvider,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from mcp.types import ToolAnnotations
from PIL import Image as PILImage
from pydantic import AnyHttpUrl
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Two stdio servers in plain Python (no SDK to import: they start in milliseconds), each noting its start in the file
# named by its first argument: one exits before answering anything, one answers the handshake and the tool list and
# then exits (a server that crashes right after connecting).
DIES_AT_ONCE = "import sys; open(sys.argv[1], 'a').write('.')"
DIES_AFTER_LISTING = """
import json, sys
open(sys.argv[1], 'a').write('.')
for line in sys.stdin:
    m = json.loads(line)
    if 'id' not in m:
        continue
    if m['method'] == 'initialize':
        version, info = m['params']['protocolVersion'], {'name': 'brief', 'version': '1'}
        r = {'result': {'protocolVersion': version, 'capabilities': {'tools': {}}, 'serverInfo': info}}
    elif m['method'] == 'tools/list':
        r = {'result': {'tools': []}}
    else:
        r = {'error': {'code': -32601, 'message': 'Method not found'}}
    print(json.dumps({'jsonrpc': '2.0', 'id': m['id'], **r}), flush=True)
    if m['method'] == 'tools/list':
        break
"""
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")  # the start of a PNG: enough here


def png_with_a_bad_profile() -> bytes:
    """A 4×4 PNG whose colour profile chunk (iCCP) has a wrong checksum, as server-everything's sample image has."""
    out = io.BytesIO()
    PILImage.new("RGB", (4, 4), "red").save(out, "PNG", icc_profile=b"a profile of no use")
    data = bytearray(out.getvalue())
    at = data.index(b"iCCP")
    data[at + 4 + int.from_bytes(data[at - 4 : at], "big")] ^= 0xFF  # the first byte of its checksum
    return bytes(data)


BAD_PROFILE_PNG = png_with_a_bad_profile()
TAGGED = "sum\U000e0049\U000e0047\U000e004e\U000e004f\U000e0052\U000e0045 is 3\u200b\u202e"  # "IGNORE" in tag chars


class _Server(MCPServer):
    """MCPServer whose `research` tool says it can only be called as a task (as server-everything's
    simulate-research-query does; MCPServer's own tools cannot say it)."""

    async def list_tools(self) -> list[types.Tool]:
        """The tools, `research` marked taskSupport required (seen by 2025-11-25 clients only)."""
        tools = await super().list_tools()
        task = types.ToolExecution(task_support="required")
        return [t.model_copy(update={"execution": task}) if t.name == "research" else t for t in tools]


def build_server(name: str = "test", calls: list[str] | None = None) -> MCPServer:
    """A server with the tools the tests call (`calls`: where `forget` notes each call it gets)."""
    mcp = _Server(name, log_level="WARNING")

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
    def echo(text: str) -> str:
        """Say `text` back."""
        return text

    @mcp.tool(annotations=ToolAnnotations(destructive_hint=True))
    def forget(what: str) -> str:
        """Pretend to delete something."""
        if calls is not None:
            calls.append(what)
        return f"forgot {what}"

    @mcp.tool()
    async def slow(seconds: float, mark: str = "") -> str:
        """Answer after `seconds`; first create the file `mark` (if given) to show the call arrived."""
        if mark:
            Path(mark).touch()
        await anyio.sleep(seconds)
        return "late"

    @mcp.tool()
    def pid() -> str:
        """The server's process id."""
        return str(os.getpid())

    @mcp.tool()
    def header(name: str, ctx: Context) -> str:
        """A header of the HTTP request that carried the call ("" when none)."""
        return (ctx.headers or {}).get(name, "")

    @mcp.tool()
    def env_keys() -> str:
        """The names of the server's environment variables, one per line."""
        return "\n".join(sorted(os.environ))

    @mcp.tool()
    def tagged() -> str:
        """Text with invisible tag characters in it."""
        return TAGGED

    @mcp.tool()
    def weather(city: str) -> dict[str, Any]:
        """Structured content (and its JSON text copy)."""
        return {"city": city, "temp_c": 21, "sky": "clear"}

    @mcp.tool()
    def big(chars: int) -> str:
        """A long text: a head, filler and a tail."""
        return "HEAD" + "x" * chars + "TAIL"

    @mcp.tool()
    def broken() -> str:
        """Always an error result."""
        raise ToolError("the disk is on fire")

    @mcp.tool(structured_output=False)
    def picture() -> list[Any]:
        """A caption and an image."""
        return ["a dot", Image(data=PNG, format="png")]

    @mcp.tool()
    def research(topic: str) -> str:
        """Only as a task (see _Server)."""
        return f"researched {topic}"

    @mcp.tool(structured_output=False)
    def profiled() -> list[Any]:
        """An image whose colour profile's checksum is wrong."""
        return [Image(data=BAD_PROFILE_PNG, format="png")]

    @mcp.tool(structured_output=False)
    def embedded() -> list[Any]:
        """A text resource and a binary one, embedded."""
        note = types.TextResourceContents(uri="mem://note.md", mime_type="text/markdown", text="# Note\nbody")
        blob = types.BlobResourceContents(uri="mem://a.bin", mime_type="application/octet-stream", blob="AAEC")
        return [types.EmbeddedResource(type="resource", resource=r) for r in (note, blob)]

    @mcp.tool()
    def nul() -> dict[str, Any]:
        """Structured content with U+0000 in a key and a value."""
        return {"na\x00me": "a\x00b"}

    @mcp.tool()
    async def grow(tool: str, ctx: Context) -> str:
        """Add a tool named `tool` and say the list changed (both eras' ways)."""

        def added() -> str:
            return "new"

        mcp.add_tool(added, name=tool, description="added at run time")
        await ctx.notify_tools_changed()  # 2026-era clients: their subscriptions/listen stream
        try:
            await ctx.session.send_tool_list_changed()  # handshake-era clients: a notification
        except Exception:
            pass
        return "grown"

    return mcp


class _SaysBadRequest:
    """ASGI middleware: the app's 404 to a request that names a session becomes the TypeScript SDK examples' 400."""

    BODY = b'{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}'

    def __init__(self, app: ASGIApp) -> None:
        """Wrap `app`."""
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request, turning a lost session's 404 into a 400."""
        if scope["type"] != "http" or b"mcp-session-id" not in dict(scope["headers"]):
            await self.app(scope, receive, send)
            return
        replaced = False

        async def answer(message: Message) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and message["status"] == 404:
                replaced = True
                headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(self.BODY))]
                await send({"type": "http.response.start", "status": 400, "headers": headers})
                await send({"type": "http.response.body", "body": self.BODY})
            elif not replaced:
                await send(message)

        await self.app(scope, receive, answer)


def free_port() -> int:
    """A port nothing listens on (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpServer:
    """build_server() over Streamable HTTP on 127.0.0.1 (uvicorn in the test's loop); stop() and start() again on
    the same port is a restarted server: a new process as far as the client can tell (its sessions are gone)."""

    def __init__(
        self, port: int | None = None, build: Callable[[], MCPServer] | None = None, *, lost_session: int = 404
    ) -> None:
        """Not started; `port` 0/None: a free one; `build` makes the server (default: build_server("http"));
        `lost_session` 400: a session it does not know is answered as the TypeScript SDK's servers do
        (server-everything: 400 "Bad Request: No valid session ID provided"), not with the Python SDK's 404."""
        self.port = port or free_port()
        self.build = build or (lambda: build_server("http"))
        self.lost_session = lost_session
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The MCP endpoint."""
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        """Serve a fresh server on the port."""
        app: ASGIApp = self.build().streamable_http_app()
        if self.lost_session == 400:
            app = _SaysBadRequest(app)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_config=None, lifespan="on")  # logging: ours
        config.timeout_graceful_shutdown = 0
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                await self._task
                raise RuntimeError("the MCP HTTP server did not start")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Stop serving at once, as a crash would: open streams (a client's change stream) are cut, and uvicorn's
        complaints about cutting them are not the test's business."""
        server, task = self._server, self._task
        self._server = self._task = None
        if server is not None and task is not None:
            server.should_exit = True
            quiet = logging.getLogger("uvicorn.error")
            level = quiet.level
            quiet.setLevel(logging.CRITICAL)
            try:
                await task
            finally:
                quiet.setLevel(level)

    async def __aenter__(self) -> Self:
        """Start."""
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop."""
        await self.stop()


class AuthServer(OAuthAuthorizationServerProvider[AuthorizationCode, RefreshToken, AccessToken]):
    """An OAuth authorization server in memory (the SDK's OAuthAuthorizationServerProvider) whose "login page" is a
    request the test makes: approve(request, user) signs `user` in and sends the browser back with a code."""

    def __init__(self, issuer: str) -> None:
        """Nothing registered or issued yet."""
        self.issuer = issuer
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.asked: dict[str, AuthorizationParams] = {}  # login page's request id → the authorization asked for
        self.asking: dict[str, str] = {}  # login page's request id → client id
        self.codes: dict[str, AuthorizationCode] = {}
        self.tokens: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.authorized = 0  # codes issued: each is a person approving

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        """A registered client."""
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        """Dynamic registration."""
        assert client_info.client_id
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        """The login page for this request."""
        request = secrets.token_urlsafe(8)
        self.asked[request], self.asking[request] = params, client.client_id or ""
        return f"{self.issuer}/login?request={request}"

    def approve(self, request: str, user: str) -> str:
        """`user` approves: where their browser goes next (the client's redirect URI with a code)."""
        params = self.asked.pop(request)
        code = secrets.token_urlsafe(16)
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or [], expires_at=time.time() + 300, client_id=self.asking.pop(request),
            code_challenge=params.code_challenge, redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly, resource=params.resource,
            subject=user,
        )  # fmt: skip
        self.authorized += 1
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, code: str) -> AuthorizationCode | None:
        """A code issued by approve()."""
        return self.codes.get(code)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None, subject: str | None) -> OAuthToken:
        """New access and refresh tokens."""
        access, refresh = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
        expires = int(time.time()) + 3600
        self.tokens[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource, subject=subject
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource, subject=subject
        )
        return OAuthToken(access_token=access, expires_in=3600, refresh_token=refresh, scope=" ".join(scopes) or None)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, code: AuthorizationCode
    ) -> OAuthToken:
        """Tokens for a code (once)."""
        del self.codes[code.code]
        return self._issue(code.client_id, code.scopes, code.resource, code.subject)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        """A refresh token issued here."""
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        """New tokens for a refresh token (rotated)."""
        del self.refresh[refresh_token.token]
        return self._issue(refresh_token.client_id, scopes or refresh_token.scopes, refresh_token.resource,
                           refresh_token.subject)  # fmt: skip

    async def load_access_token(self, token: str) -> AccessToken | None:
        """The access token, if issued here and not revoked."""
        return self.tokens.get(token)

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        """Revoke a token."""
        self.tokens.pop(token.token, None)
        self.refresh.pop(token.token, None)


def build_oauth_server(port: int, auth: AuthServer) -> MCPServer:
    """A Streamable HTTP server on `port` that needs an OAuth token from `auth` (its own authorization server, as
    the SDK builds it), with a tool that says whom the token belongs to."""
    base = f"http://127.0.0.1:{port}"
    settings = AuthSettings(
        issuer_url=AnyHttpUrl(base),
        resource_server_url=AnyHttpUrl(f"{base}/mcp"),
        validate_token_resource=True,
        client_registration_options=ClientRegistrationOptions(enabled=True),
        revocation_options=RevocationOptions(enabled=True),
    )
    mcp = MCPServer("mail", log_level="WARNING", auth=settings, auth_server_provider=auth)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
    def whoami() -> str:
        """Whose account this is (the subject of the caller's token)."""
        token = get_access_token()
        return f"you are {token.subject}" if token else "nobody"

    @mcp.custom_route("/login", methods=["GET"])  # type: ignore[untyped-decorator]  # the SDK leaves it untyped
    async def login(request: Request) -> Response:
        """The login page: `?request=…&user=…` approves at once."""
        return RedirectResponse(auth.approve(request.query_params["request"], request.query_params["user"]), 302)

    return mcp


if __name__ == "__main__":
    if sys.argv[1:] != ["stdio"]:
        sys.exit("usage: python -m tests.mcp_servers stdio")
    build_server("stdio").run("stdio")
