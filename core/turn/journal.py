"""The turn journal: every conversation write of one turn, in order (its start, each step, its answer or error answer,
the parts the platform accepted, how it ended). The agent loop only turns model and tool calls into events.

A turn that came from the inbox writes nothing more once its update was taken over by another process (this one
stalled past its lease): the journal checks the delivery before each write and stops the turn instead."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from core.accounts.usage import TurnMeter, UsageRow
from core.inbox import Delivery
from core.storage import conversations
from core.storage.conversations import TurnStart
from core.storage.db import Pool, is_dropped
from core.types import Assistant, ChatRef, Error, Event, Incoming, ModelToolCalls, ToolResult

log = logging.getLogger(__name__)


async def begin(
    pool: Pool,
    inc: Incoming,
    delivery: Delivery | None,
    *,
    default_tz: str,
    history: int,
    due_before: datetime,
    due_limit: int,
    authors: bool,
    memory: bool,
    budget: Sequence[Any] | None = None,
) -> TurnStart:
    """Store the message and open its turn (one round trip); a redelivered update takes its turn back; with `budget`
    (core/accounts/usage.py), its first model call is checked and admitted in the same round trip. A message of a
    stored update (`delivery`) is committed without waiting for the disk: the inbox keeps the update itself."""
    return await conversations.begin_turn(
        pool,
        inc,
        default_tz,
        history,
        due_before,
        due_limit,
        authors=authors,
        memory=memory,
        redelivered=delivery is not None and delivery.redelivered,
        budget=budget,
        inboxed=delivery is not None,
    )


async def mark_sent(pool: Pool, turn_id: int, parts: int) -> bool:
    """Record that the platform accepted the first `parts` parts of a turn's answer, so a process that takes the
    update again sends only the rest (best effort: a failure only risks sending a part twice); False when it could
    not be recorded."""
    try:
        await conversations.mark_sent(pool, turn_id, parts)
    except Exception as e:
        log.warning("could not record a sent answer of turn %d (%s)", turn_id, type(e).__name__)
        return False
    return True


class TurnJournal:
    """The writes of one running turn."""

    def __init__(
        self, pool: Pool, chat: ChatRef, turn_id: int, delivery: Delivery | None, meter: TurnMeter | None = None
    ) -> None:
        """Write `turn_id` of `chat`; `delivery`: the stored update the turn answers (None: not from the inbox);
        `meter`: the turn's deferring meter, whose last model call's usage is written with the answer."""
        self.pool, self.chat, self.turn_id, self.delivery, self.meter = pool, chat, turn_id, delivery, meter
        self.ended = False  # the answer (or error answer) is stored: the turn is closed

    def _still_ours(self) -> None:
        """Stop the turn (cancel it) when its update now belongs to another process: that one writes it."""
        if self.delivery is not None and self.delivery.lost:
            raise asyncio.CancelledError

    async def record(self, event: Event) -> None:
        """Store what `event` adds to the conversation: model tool calls, a tool result, the answer or error answer."""
        if isinstance(event, ModelToolCalls):
            self._still_ours()
            if self.meter is not None:
                self.meter.flush()  # the usage of the call that asked for these tools, beside them
            await conversations.add_assistant(self.pool, self.chat, self.turn_id, event.content, list(event.calls))
        elif isinstance(event, ToolResult):
            self._still_ours()
            await conversations.add_tool_result(
                self.pool,
                self.chat,
                self.turn_id,
                event.call_id,
                event.step.name,
                event.envelope,
                int(event.step.duration_s * 1000),
                foreign=event.foreign,
            )
        elif isinstance(event, Assistant):
            self._still_ours()
            status = "done" if event.cut_short is None else "cut_short"
            await self._finish(event.text, status, len(event.steps))
            self.ended = True
        elif isinstance(event, Error):
            await self.fail(event)

    async def _finish(self, text: str, status: str, steps: int) -> None:
        """Store the answer with the usage of the turn's last model call in one statement; one that failed (and so
        rolled back) is sent again without the usage, which is then written on its own: a usage write never costs an
        answer."""
        usage = self.meter.take() if self.meter is not None else None
        args = (self.pool, self.chat, self.turn_id, text, status, steps)
        try:
            await conversations.finish_turn_with_answer(*args, usage)
            return
        except Exception as e:
            # dropped (retry_dropped gave up): the usage is written apart, counted twice if that statement did commit
            if usage is None or is_dropped(e):
                self._usage_apart(usage)
                raise
        except BaseException:
            self._usage_apart(usage)
            raise
        self._usage_apart(usage)
        await conversations.finish_turn_with_answer(*args)

    def _usage_apart(self, usage: UsageRow | None) -> None:
        """Write a usage the answer's statement did not store, in the background."""
        if usage is not None and self.meter is not None:
            self.meter.write_later(usage)

    async def fail(self, error: Error | None) -> None:
        """Close the turn as failed; `error`: the answer the user gets (stored, sent again on a redelivery)."""
        self._still_ours()
        await conversations.finish_turn(self.pool, self.turn_id, "failed", 0, error=error)
        self.ended = True

    async def close_unfinished(self, status: str) -> None:
        """Record a turn that ended without an answer (best effort: the database may be what failed); not when its
        update was taken over by another process, which runs this turn now."""
        if self.ended:
            return
        if self.delivery is not None and self.delivery.lost:
            log.info("turn %d left to the process that took its update over", self.turn_id)
            return
        try:
            await asyncio.shield(conversations.finish_turn(self.pool, self.turn_id, status, 0))
        except (Exception, asyncio.CancelledError) as e:
            log.warning("could not close turn %d as %s: %s", self.turn_id, status, type(e).__name__)
