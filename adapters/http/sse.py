"""An answer's live feed as Server-Sent Events: `message.created` (the person's message, then the answer, running),
`message.part.delta`, `tool.call`, `tool.result`, `error`, `message.completed` (the answer as GET …/messages has it);
each with an `id:` (`<message id>:<n>`, n counting every event of the stream from 0, so each id is unique and later
ones are larger) so a client resumes with Last-Event-ID, and a keep-alive comment while the model thinks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from adapters.http.limits import KEEPALIVE_S
from adapters.http.models import MessageOut, part_out
from core import REPLY, ApiMessage, Feed, TextPart, progress

KEEPALIVE = b": keep-alive\n\n"
EVENT_STREAM = "text/event-stream"
OPENING = 2  # the events before the feed's own: the person's message and the answer, created (ids 0 and 1)
Final = Callable[[Feed], Awaitable[MessageOut]]


def frame(event: str, data: dict[str, Any], event_id: str | None) -> bytes:
    """One SSE event on the wire (its data is one line of JSON)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False, default=str)}\n\n".encode()


def parse_event_id(value: str | None) -> tuple[str, int] | None:
    """(message id, event number) of a Last-Event-ID, or None when it is not one of ours."""
    mid, sep, number = (value or "").strip().rpartition(":")
    if not sep or not mid or not number.isdecimal() or len(number) > 9:
        return None
    return mid, int(number)


def opening(feed: Feed) -> list[MessageOut]:
    """The two messages an answer's stream starts with: the person's, and the answer (running, no parts yet)."""
    said = ApiMessage(feed.message_id, "user", feed.started_at, (TextPart(feed.text),))
    reply = ApiMessage(feed.message_id + REPLY, "assistant", feed.started_at, (), "running")
    return [MessageOut.of(said, feed.session_id), MessageOut.of(reply, feed.session_id)]


async def events(feed: Feed, after: int, final: Final, idle_s: float = KEEPALIVE_S) -> AsyncIterator[bytes]:
    """The stream of `feed` after the event numbered `after` (-1: from the start); a keep-alive comment after `idle_s`
    without an event. The opening messages are numbered 0 and 1, the feed's event n is n + 1, the end follows."""
    mid, reply = feed.message_id, feed.message_id + REPLY
    for n, message in enumerate(opening(feed)):
        if n > after:
            yield frame("message.created", {"message": message.model_dump(mode="json")}, f"{mid}:{n}")
    seen = max(after - OPENING + 1, 0)  # of the feed's events
    if feed.done and seen > len(feed.events):
        return  # the client has the whole answer
    async for step in progress(feed, seen, idle_s):
        if step is None:
            yield KEEPALIVE
            continue
        eid, head = f"{mid}:{step.number + OPENING - 1}", {"message_id": reply, "part": step.part}
        if step.kind == "delta":
            yield frame("message.part.delta", {**head, "type": "text", "delta": step.delta}, eid)
        elif step.kind == "error" and step.new is not None:
            body = part_out(step.new).model_dump(mode="json")
            yield frame("error", {**head, "error": {"type": body["code"], "message": body["message"]}}, eid)
        elif step.new is not None:
            yield frame(step.kind.replace("_", "."), {**head, **part_out(step.new).model_dump(mode="json")}, eid)
    done = await final(feed)
    yield frame("message.completed", {"message": done.model_dump(mode="json")}, f"{mid}:{len(feed.events) + OPENING}")
