"""The HTTP front end's errors in one shape, `{"error": {"type", "message"}}`: `ApiError` raised by a route, files
refused, and FastAPI's and Starlette's own errors (validation, unknown routes and methods, too large bodies) rewritten
into it. Used by the routes, the OpenAI-compatible endpoint, the door (gate.py) and the web page."""

import json
from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapters.http.limits import HTTP_UPLOAD_MAX_BYTES, MAX_BODY_BYTES, UPLOAD_BODY_BYTES
from adapters.http.models import ErrorBody
from adapters.http.uploads import UploadRefused

TOO_LARGE = f"The request body is larger than {MAX_BODY_BYTES:,} bytes."
STARLETTE_TOO_LARGE = "Content Too Large"  # the detail of Starlette's body limit (the body.py limit has its own)
UPLOAD_TOO_LARGE = (
    f"The request body is larger than {UPLOAD_BODY_BYTES:,} bytes: a message's files may hold "
    f"{HTTP_UPLOAD_MAX_BYTES:,} bytes in all (base64 makes them a third larger)."
)
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 401, 403, 404, 413, 429)}


class ApiError(Exception):
    """An error answer: its HTTP status, type and one-line message."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        """Remember what to answer."""
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers


def error_response(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error shape."""
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


def too_large(scope: Scope) -> str:
    """Why a body was too large, by the limit of its route (the routes that take files allow more)."""
    return UPLOAD_TOO_LARGE if scope.get(MAX_BODY_SIZE_SCOPE_KEY) == UPLOAD_BODY_BYTES else TOO_LARGE


def refused(e: UploadRefused) -> ApiError:
    """Files refused, as the API's error."""
    return ApiError(e.status, _KINDS.get(e.status, "error"), e.message)


_KINDS = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}
_KINDS |= {413: "too_large", 429: "rate_limited"}


def install_errors(app: FastAPI) -> None:
    """Every error of the app in the one shape (also FastAPI's own: validation, unknown routes, too large bodies)."""

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.kind, exc.message, exc.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        message = exc.detail if isinstance(exc.detail, str) else "Request refused."
        if exc.status_code == 413 and message == STARLETTE_TOO_LARGE:  # the body limit's own: say which limit
            message = too_large(request.scope)
        kind = _KINDS.get(exc.status_code, "error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette names the methods of the first route of the path only
            headers["Allow"] = allowed_methods(request.app, request.scope)
        return error_response(exc.status_code, kind, message, headers or None)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return error_response(400, "invalid_request", f"{where}: {first.get('msg', 'invalid')}".strip(": "))

    app.add_middleware(TooLargeInShape)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)


class TooLargeInShape:
    """Starlette's body limit answers 413 in plain text from inside its middleware (it also counts chunked bodies,
    which a Content-Length check alone would miss): the answer is rewritten into the one error shape."""

    def __init__(self, app: ASGIApp) -> None:
        """Wrap `app`."""
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass everything through but a plain-text 413."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rewriting = False
        body = b""

        async def rewrite(message: Message) -> None:
            nonlocal rewriting, body
            if message["type"] == "http.response.start" and message["status"] == 413 and not _json(message):
                body = json.dumps({"error": {"type": "too_large", "message": too_large(scope)}}).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                rewriting = True
                await send({**message, "headers": headers})
            elif rewriting and message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": body})
            else:
                await send(message)

        await self.app(scope, receive, rewrite)


def allowed_methods(app: FastAPI, scope: Scope) -> str:
    """The methods of every route of the request's path, for a 405's Allow."""
    methods = {
        m for route in _plain(app.router.routes) if route.matches(scope)[0] is not Match.NONE for m in _methods(route)
    }
    return ", ".join(sorted(methods))


def _plain(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes, with those of an included router (FastAPI keeps it whole, under no prefix here) in its place."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _plain(inner.routes)
        else:
            yield route


def _methods(route: BaseRoute) -> set[str]:
    """The methods a route answers (none: a mount or a websocket)."""
    found = getattr(route, "methods", None)
    return set(found) if found else set()


def _json(start: Message) -> bool:
    """Whether a response is JSON already (an error in the one shape)."""
    return any(k.lower() == b"content-type" and v.startswith(b"application/json") for k, v in start["headers"])
