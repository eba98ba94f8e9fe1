"""A slow answer shown in Matrix while it is written: one draft message, edited in place (m.replace) as more of the
answer streams in, which the final answer then replaces (reply.py). Every edit is one more event in the room, so the
draft comes only once an answer has been streaming for MATRIX_DRAFT_AFTER_S (a quick answer gets none, as today) and
is edited at most every MATRIX_DRAFT_EVERY_S, at most MATRIX_DRAFT_EDITS times. It shows the answer's first part so
far, rendered like the answer, with a "…" at its end; it pings nobody (m.mentions {}, in every edit too). A client
without edits shows the draft and then each edit as a message of its own starting with "* " (the spec's fallback).
A draft is only a preview: a send that fails or is slow is logged and the answer goes on without it."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from mautrix.errors import MatrixError

from adapters.matrix.limits import (
    MATRIX_DRAFT_AFTER_S,
    MATRIX_DRAFT_EDITS,
    MATRIX_DRAFT_EVERY_S,
    MATRIX_DRAFT_TIMEOUT_S,
)
from adapters.matrix.render import answer_parts, html_content
from adapters.matrix.send import editing, replying

log = logging.getLogger(__name__)

MORE = "<p>…</p>"  # ends a draft: more is coming
Put = Callable[[dict[str, Any], str], Awaitable[str]]  # a content and its transaction id → its event id


class Draft:
    """The draft of one answer. Its first send has the transaction id `txn`, made of the message it answers: a process
    that runs the turn again after a crash and streams a draft too gets the same event back and edits it in place.
    Its edits' ids carry a nonce of this process instead, so a rerun's edit is never taken for the old one's."""

    def __init__(
        self, put: Put, txn: str, *, reply_to: str | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Send through `put`, the first send a reply to `reply_to` (a group room); time by `clock` (seconds)."""
        self.put, self.txn, self.reply_to, self.clock = put, txn, reply_to, clock
        self.text = ""
        self.began: float | None = None  # when the answer's first text came
        self.last: float | None = None  # when the draft was last sent or edited (or tried)
        self.event_id: str | None = None  # the draft message, once the homeserver took it
        self.tries = 0  # sends tried: the first, then the edits
        self.shown = ""  # the HTML the draft reads now
        self.nonce = secrets.token_hex(4)

    async def add(self, delta: str) -> None:
        """Append streamed text; show it when it is due."""
        self.text += delta
        if not self.text.strip():
            return
        now = self.clock()
        self.began = now if self.began is None else self.began
        if self._due(now):
            self.last = now
            await self._show()

    def _due(self, now: float) -> bool:
        """Whether the draft is sent (or edited) now: a slow answer, not too soon after the last, not too often."""
        if self.began is None or now - self.began < MATRIX_DRAFT_AFTER_S:
            return False
        if self.last is not None and now - self.last < MATRIX_DRAFT_EVERY_S:
            return False
        return self.tries < 1 + MATRIX_DRAFT_EDITS

    def _content(self) -> dict[str, Any]:
        """The draft as it reads now: the first part of the text so far, a "…" after it."""
        first = answer_parts(self.text)[0]
        return dict(html_content(f"{first}\n{MORE}").serialize())

    async def _show(self) -> None:
        """Send the draft, or edit it when the text it shows changed (best effort)."""
        new = self._content()
        if new["formatted_body"] == self.shown:
            return
        self.tries += 1
        try:
            async with asyncio.timeout(MATRIX_DRAFT_TIMEOUT_S):
                if self.event_id is None:
                    self.event_id = await self.put(replying(dict(new), self.reply_to), self.txn)
                else:
                    await self.put(editing(new, self.event_id), f"{self.txn}.{self.nonce}.{self.tries}")
            self.shown = new["formatted_body"]
        except (MatrixError, aiohttp.ClientError, TimeoutError) as e:  # a preview: never let it disturb the answer
            log.info("a draft's send failed: %s", e)

    async def sent(self) -> str | None:
        """The draft's event id for the answer to replace (None: no draft). A first send that was tried but not
        confirmed is tried once more with its transaction id: the same event if it landed (else a new draft, replaced
        at once), so no draft is left reading "…"."""
        if self.event_id is None and self.tries:
            try:
                async with asyncio.timeout(MATRIX_DRAFT_TIMEOUT_S):
                    self.event_id = await self.put(replying(self._content(), self.reply_to), self.txn)
            except (MatrixError, aiohttp.ClientError, TimeoutError) as e:
                log.info("a draft could not be found again: %s", e)
        return self.event_id
