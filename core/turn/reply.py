"""The reply port: how a front end receives one message's answer. The front end hands the core an `Incoming` with
a `Reply`; the core runs the turn, sends each event through the port and records what the platform accepted itself
(the port yields as each part is accepted: it never calls the core).
Data flows one way: platform → adapter → core → port → platform; the core never calls the adapter otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

from core.storage.db import Pool
from core.turn.journal import mark_sent
from core.types import Assistant, AssistantDelta, Error, Event, Spoken, ToolCall, ToolResult


class Reply(Protocol):
    """One message's answer going out: a platform chat, the terminal, an API session's live feed."""

    streams: bool  # whether the answer is shown while it is written (drafts); else only the final answer

    def working(self) -> AbstractAsyncContextManager[None]:
        """Held while the turn runs: "typing…" or whatever says the bot is at it."""

    async def draft(self, text: str) -> None:
        """More of the answer as it is written (only when `streams`)."""

    async def step(self, event: ToolCall | ToolResult) -> None:
        """A tool call starting or its result, while the turn runs (a chat shows them under the answer instead)."""

    def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """Send the answer's parts from `answer.sent_parts` on (the ones sent before its process died are not sent
        again) with its steps and its buttons, yielding after each how many parts the platform has accepted."""

    async def error(self, error: Error) -> None:
        """Send a one-line error answer (or a refusal, a rate note)."""

    async def voice(self, spoken: Spoken) -> None:
        """Send the answer read aloud (OGG/Opus), best effort."""


class QuietReply:
    """A port's defaults, for a front end to override what it shows: nothing while the turn runs, no drafts, steps
    only under the answer, no voice."""

    streams = False

    @asynccontextmanager
    async def working(self) -> AsyncIterator[None]:
        """Nothing to show while the turn runs."""
        yield

    async def draft(self, text: str) -> None:
        """Drafts are not shown."""

    async def step(self, event: ToolCall | ToolResult) -> None:
        """Steps show under the answer, not one by one."""

    async def voice(self, spoken: Spoken) -> None:
        """The answer is sent in text only."""


async def send_through(pool: Pool, events: AsyncIterator[Event], reply: Reply, *, record: bool) -> bool:
    """Send a turn's events through `reply`; with `record` (the turn answers a stored update), each part the
    platform accepted is stored at once, so a process that takes the update again sends only the rest. True when a
    stored answer (or error answer) went out and every part of it is recorded as sent."""
    journaled = False
    async for event in events:
        if isinstance(event, AssistantDelta):
            if reply.streams:
                await reply.draft(event.text)
        elif isinstance(event, ToolCall | ToolResult):
            await reply.step(event)
        elif isinstance(event, Assistant):
            # an answer sent again: the parts recorded before are sent; the rest are recorded as they go
            journaled = record and event.turn_id is not None and event.sent_parts > 0
            async for parts in reply.answer(event):
                if record and event.turn_id is not None:
                    journaled = await mark_sent(pool, event.turn_id, parts)
        elif isinstance(event, Error):
            await reply.error(event)
            if record and event.turn_id is not None:  # an error answer is recorded as sent like any answer
                journaled = await mark_sent(pool, event.turn_id, 1)
        elif isinstance(event, Spoken):
            await reply.voice(event)
    return journaled
