"""Request bodies read without stalling the event loop: a JSON body larger than PARSE_OFF_LOOP_BYTES is parsed in a
worker thread. Every body is first measured (a large one there, in steps: the GIL passes back to the loop between
them), so that one of countless tiny values is refused before a long parse or validation could hold the loop:
json.loads and pydantic each run as one call that keeps the GIL for as long as it takes, in any thread."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from adapters.http.limits import JSON_CONTAINERS_MAX, JSON_VALUES_MAX, PARSE_OFF_LOOP_BYTES, SCAN_STEP_BYTES

TOO_MANY_VALUES = (
    f"The request body holds more than {JSON_CONTAINERS_MAX:,} objects and lists or {JSON_VALUES_MAX:,} values "
    "(brackets and commas counted): send fewer messages or parts."
)


def too_many_values(body: bytes) -> bool:
    """Whether `body` may hold more JSON values or containers than JSON_VALUES_MAX and JSON_CONTAINERS_MAX (every
    value but the first follows a comma or opens a container; a comma or bracket inside a string only counts one
    more), counted SCAN_STEP_BYTES at a time."""
    values = containers = 0
    for start in range(0, len(body), SCAN_STEP_BYTES):
        end = start + SCAN_STEP_BYTES
        opened = body.count(b"{", start, end) + body.count(b"[", start, end)
        containers += opened
        values += opened + body.count(b",", start, end)
        if values > JSON_VALUES_MAX or containers > JSON_CONTAINERS_MAX:
            return True
    return False


def parse(body: bytes) -> Any:
    """A body's JSON; 413 when it holds too many values to parse and validate quickly."""
    if too_many_values(body):
        raise HTTPException(413, TOO_MANY_VALUES)
    return json.loads(body)


class OffLoopRequest(Request):
    """A request whose large JSON body is parsed off the event loop."""

    async def json(self) -> Any:
        """The body's JSON (parsed once)."""
        if not hasattr(self, "_json"):
            body = await self.body()
            small = len(body) <= PARSE_OFF_LOOP_BYTES
            self._json = parse(body) if small else await asyncio.to_thread(parse, body)
        return self._json


class OffLoopRoute(APIRoute):
    """An API route whose handler reads its body through OffLoopRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, given an OffLoopRequest."""
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(OffLoopRequest(request.scope, request.receive))

        return handle
