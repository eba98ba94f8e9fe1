"""The live feed of a running API answer: its events numbered as they happen, so a client that reconnects reads on
from where it was, and the steps the API streams from them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from core.api.parts import (
    Button,
    ErrorPart,
    Part,
    ToolCallPart,
    ToolResultPart,
    artifact_id,
    shown_result,
    tool_arguments,
)
from core.buttons import Button as Choice
from core.constants import API_FEED_KEEP_S, API_FEEDS_KEPT
from core.timeutil import Clock
from core.turn.reply import QuietReply
from core.types import Assistant, AssistantDelta, Error, Event, Spoken, ToolCall, ToolResult


@dataclass
class Feed:
    """The events of one API answer as they happen, numbered from 1; listeners read on from any number."""

    session_id: str
    message_id: str  # the user message's id (the turn's platform message id)
    text: str  # what the user said
    clock: Clock
    started_at: datetime
    events: list[Event] = field(default_factory=list)
    times: list[datetime] = field(default_factory=list)  # when each event came
    done: bool = False
    ended_at: float | None = None  # time.monotonic() when it finished
    buttons: tuple[Button, ...] = ()  # under the answer (a command's: Undo under /remind's)
    choices: tuple[Choice, ...] = ()  # under a command's confirmation or choice (until one is pressed)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def push(self, event: Event) -> None:
        """Add an event and wake the listeners."""
        self.times.append(self.clock())
        self.events.append(event)
        self._wake()

    def finish(self) -> None:
        """No more events."""
        self.done, self.ended_at = True, time.monotonic()
        self._wake()

    def _wake(self) -> None:
        """Wake everyone waiting for the next event."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self, after: int, idle_s: float) -> AsyncIterator[tuple[int, Event] | None]:
        """The events numbered after `after`, as they come, until the feed ends; None after `idle_s` without one."""
        n = max(0, after)
        while True:
            while n < len(self.events):
                n += 1
                yield n, self.events[n - 1]
            if self.done:
                return
            changed = self._changed
            try:
                async with asyncio.timeout(idle_s):  # not wait_for: that makes a task for every event
                    await changed.wait()
            except TimeoutError:
                yield None

    @property
    def answer(self) -> Assistant | Error | None:
        """The final event, once there is one."""
        last = self.events[-1] if self.events else None
        return last if isinstance(last, Assistant | Error) else None


class FeedReply(QuietReply):
    """The reply port of an API turn (core/turn/reply.py): every event goes into its feed as it comes."""

    streams = True

    def __init__(self, feed: Feed) -> None:
        """Fill `feed`."""
        self.feed = feed

    async def draft(self, text: str) -> None:
        """More of the answer as it is written."""
        self.feed.push(AssistantDelta(text))

    async def step(self, event: ToolCall | ToolResult) -> None:
        """A tool call starting or its result."""
        self.feed.push(event)

    async def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """The whole answer (the session's stored messages have it)."""
        self.feed.push(answer)
        yield 1

    async def error(self, error: Error) -> None:
        """An error answer."""
        self.feed.push(error)

    async def voice(self, spoken: Spoken) -> None:
        """The answer read aloud."""
        self.feed.push(spoken)


class Feeds:
    """This process's feeds: the running answers, and the finished ones for API_FEED_KEEP_S (to resume)."""

    def __init__(self) -> None:
        """No feeds yet."""
        self._by_message: dict[str, Feed] = {}  # in the order they began
        self._pruned = 0.0  # time.monotonic() of the last pruning

    def add(self, feed: Feed) -> None:
        """Keep a new feed (and let old finished ones go)."""
        self._prune()
        self._by_message[f"{feed.session_id}/{feed.message_id}"] = feed

    def get(self, session_id: str, message_id: str) -> Feed | None:
        """The feed of a turn, by its user message's id."""
        return self._by_message.get(f"{session_id}/{message_id}")

    def latest(self, session_id: str) -> Feed | None:
        """The session's newest feed in this process."""
        found = [f for f in self._by_message.values() if f.session_id == session_id]
        return found[-1] if found else None

    def _prune(self) -> None:
        """Forget feeds finished more than API_FEED_KEEP_S ago, and the oldest finished past API_FEEDS_KEPT (looked
        at once a second, or when past the cap: not on every answer)."""
        now = time.monotonic()
        if now - self._pruned < 1.0 and len(self._by_message) <= API_FEEDS_KEPT:
            return
        self._pruned = now
        for key, feed in list(self._by_message.items()):
            if feed.ended_at is not None and (
                now - feed.ended_at > API_FEED_KEEP_S or len(self._by_message) > API_FEEDS_KEPT
            ):
                del self._by_message[key]


ProgressKind = Literal["delta", "tool_call", "tool_result", "error", "done"]


@dataclass(frozen=True)
class Progress:
    """One step of a live answer as the API streams it: event `number` of the feed changed part `part` of the answer
    (a piece of text, a new tool call or result part, the error part), or ended it ("done")."""

    number: int
    part: int
    kind: ProgressKind
    delta: str = ""
    new: Part | None = None


async def progress(feed: Feed, after: int, idle_s: float) -> AsyncIterator[Progress | None]:
    """The answer's steps after event number `after` (parts numbered as GET …/messages numbers them), as they come;
    None after `idle_s` without one."""
    index, text_part, results, streamed = -1, -1, 0, ""
    async for item in feed.follow(0, idle_s):
        if item is None:
            yield None
            continue
        n, event = item
        at = feed.times[n - 1]
        step: Progress | None = None
        if isinstance(event, AssistantDelta):
            if text_part < 0:
                index = text_part = index + 1
            streamed += event.text
            step = Progress(n, text_part, "delta", delta=event.text)
        elif isinstance(event, ToolCall):
            index, text_part, streamed = index + 1, -1, ""
            step = Progress(
                n, index, "tool_call", new=ToolCallPart(event.call_id, event.name, tool_arguments(event.arguments), at)
            )
        elif isinstance(event, ToolResult):
            index, text_part, streamed = index + 1, -1, ""
            shown, cut = shown_result(json.dumps(event.envelope, ensure_ascii=False, default=str))
            art = artifact_id(feed.session_id, feed.message_id, results) if cut else None
            results += 1
            step = Progress(
                n,
                index,
                "tool_result",
                new=ToolResultPart(event.call_id, event.step.name, event.step.ok, shown, at, art),
            )
        elif isinstance(event, Error):
            index += 1
            step = Progress(n, index, "error", new=ErrorPart(event.code, event.message))
        elif isinstance(event, Assistant):  # what the model did not stream (a line added after it) comes as a delta
            rest = unstreamed(event.text, streamed)
            if rest and text_part < 0:
                index = text_part = index + 1
            step = Progress(n, text_part, "delta", delta=rest) if rest else Progress(n, index, "done")
        if step is not None and n > after:
            yield step


def unstreamed(final: str, streamed: str) -> str:
    """The end of an answer's final text its streamed text lacks ("" when there is none, or the final text does not
    go on from the streamed one)."""
    if final.startswith(streamed):
        return final[len(streamed) :]
    kept = streamed.rstrip()  # the final text is often the streamed one stripped, then more
    rest = final[len(kept) :] if final.startswith(kept) else ""
    return rest if rest.strip() else ""
