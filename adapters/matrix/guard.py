"""One bad event never stops the bot: an event no handling of the adapter can read (a field of the wrong type that
slipped past incoming.py's checks) is kept as a dead letter (docs/operations.md#dead-letters) and the sync goes on
past it; a database or homeserver that is away is no fault of the event, and the sync is tried again."""

from __future__ import annotations

import logging
from typing import Any

from mautrix.errors import MatrixRequestError

from adapters.matrix.incoming import string, update_id
from core import Core

log = logging.getLogger(__name__)

# what a malformed event makes the adapter's own code raise (a database or connection failure is none of these)
MALFORMED = (TypeError, AttributeError, KeyError, IndexError, ValueError, RecursionError)


def malformed(e: BaseException) -> bool:
    """Whether handling an event failed because of the event itself: its shape, or a request about it that the
    homeserver refuses for good (4xx other than a rate limit)."""
    if isinstance(e, MatrixRequestError):
        return 400 <= e.http_status < 500 and e.http_status != 429
    return isinstance(e, MALFORMED)


def one_line(e: BaseException) -> str:
    """An exception as a short line for a dead letter's reason (the homeserver's errcode for its refusal)."""
    if isinstance(e, MatrixRequestError):
        return f"{e.errcode}: {e.message}"
    return f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__


async def quarantine(core: Core, source: str, room_id: str, event: object, e: BaseException) -> None:
    """Keep an event that could not be handled as a dead letter (raises while the database is away: the sync is
    then tried again, and the event with it)."""
    event_id = string(event.get("event_id")) if isinstance(event, dict) else ""
    payload: dict[str, Any] = {"room_id": room_id, "event": event}
    await core.quarantine(
        source, update_id(event_id) if event_id else None, f"not a Matrix event ({one_line(e)})", payload
    )
