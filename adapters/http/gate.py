"""The API's door, in front of everything the app does with a request: whom a request to an API route acts as is
settled from its headers (bearer token or sign-in cookie) before a byte of its body is read. A request without a
valid caller is answered at once (401, or 429 past API_STRANGER_REQUESTS_PER_MINUTE for its address) and, when its
body is over MAX_BODY_BYTES or of unknown length, its connection closed: a stranger's body is never parsed or held in
memory, and a large one not even read. A known caller's body is then read within its route's limit
(adapters/http/body.py parses a large one off the event loop). The caller found is kept in the request's state, so
the route does not look it up again."""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from adapters.http.errors import ApiError, error_response
from adapters.http.limits import MAX_BODY_BYTES
from adapters.http.routes import HttpApi


def large_body(scope: Scope) -> bool:
    """Whether a request says it has a body over MAX_BODY_BYTES, or one of unknown length (chunked)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return not value.strip().isdigit() or int(value) > MAX_BODY_BYTES
        if name == b"transfer-encoding":
            return True
    return False


class CallerFirst:
    """Pure ASGI middleware: the caller of an API route before its body (see the module's docstring)."""

    def __init__(self, app: ASGIApp, http: HttpApi) -> None:
        """Guard `app`'s API routes with `http`'s callers."""
        self.app, self.http = app, http

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a request of an API route without a valid caller before reading its body; pass the rest on."""
        if scope["type"] == "http" and (params := self.http.gated(scope)) is not None:
            try:
                await self.http.identify(Request(scope), params.get("session_id"))
            except ApiError as e:
                headers = dict(e.headers or {})
                if large_body(scope):  # read no further: uvicorn closes the connection after the answer (a small
                    headers["Connection"] = "close"  # body's rest is skipped, so that its client reads the answer)
                await error_response(e.status, e.kind, e.message, headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)
