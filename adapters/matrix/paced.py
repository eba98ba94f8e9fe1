"""The homeserver's rate limit obeyed: a request it answers 429 (M_LIMIT_EXCEEDED) waits as long as it says
(retry_after_ms, else MATRIX_RATE_LIMIT_WAIT_S; never longer than MATRIX_RATE_LIMIT_MAX_WAIT_S) and is sent again, at
most MATRIX_RATE_LIMIT_TRIES more times; mautrix itself gives up at once. A send carries its transaction id, so a
retry is the same event."""

from __future__ import annotations

import asyncio
import inspect
import logging
from json import JSONDecodeError
from typing import Any

from aiohttp import ClientResponse, ContentTypeError
from mautrix.api import HTTPAPI, Method
from mautrix.errors import make_request_error
from mautrix.types import JSON
from mautrix.util.async_body import AsyncBody
from yarl import URL

from adapters.matrix.limits import MATRIX_RATE_LIMIT_MAX_WAIT_S, MATRIX_RATE_LIMIT_TRIES, MATRIX_RATE_LIMIT_WAIT_S

log = logging.getLogger(__name__)


async def _error_body(response: ClientResponse) -> dict[str, Any]:
    """A failed response's JSON object ({} when it is none)."""
    try:
        body = await response.json()
    except (JSONDecodeError, ContentTypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def wait_of(body: dict[str, Any]) -> float:
    """How long a 429 answer asks to wait, in seconds (capped; the default when it does not say)."""
    given = body.get("retry_after_ms")
    if not isinstance(given, int | float) or isinstance(given, bool) or given < 0:
        return MATRIX_RATE_LIMIT_WAIT_S
    return min(given / 1000, MATRIX_RATE_LIMIT_MAX_WAIT_S)


class PacedAPI(HTTPAPI):
    """mautrix's HTTP API that waits out the homeserver's rate limit instead of failing. It overrides `_send`, not the
    public `request`: the error mautrix raises for a 429 (MLimitExceeded) keeps neither the body nor its
    retry_after_ms."""

    async def _send(
        self,
        method: Method,
        url: URL,
        content: bytes | bytearray | str | AsyncBody,
        query_params: dict[str, str],
        headers: dict[str, str],
    ) -> tuple[JSON, ClientResponse]:
        """One request, sent again after the wait a 429 asks for (a streamed body cannot be: it fails at once)."""
        tries = 0 if inspect.isasyncgen(content) else MATRIX_RATE_LIMIT_TRIES
        for attempt in range(tries + 1):
            async with self.session.request(
                str(method), url, data=content, params=query_params, headers=headers
            ) as response:
                if 200 <= response.status < 300:
                    return await response.json(), response
                body = await _error_body(response)
                if response.status != 429 or attempt == tries:
                    raise make_request_error(
                        http_status=response.status,
                        text=await response.text(),
                        errcode=body.get("errcode"),
                        message=body.get("error"),
                        unstable_errcode=body.get("org.matrix.msc3848.unstable.errcode"),
                    )
            wait = wait_of(body)
            log.warning("the Matrix homeserver is rate-limiting the bot; %s again in %g s", url.path, wait)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # the last attempt returns or raises
