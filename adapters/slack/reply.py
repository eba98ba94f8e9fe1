"""The reply port of Slack: a stored message's answer in its DM or its thread. Slack has no typing indicator a bot can
show in a chat (the RTM one is gone), so working() shows nothing; the answer comes whole, its last part with the
"🔧 n steps" line and Show steps."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.buttons import element, steps_button
from adapters.slack.render import render_parts, steps_line
from adapters.slack.send import message_blocks, post, post_parts
from core import Allow, Assistant, Error, QuietReply, summary_line

log = logging.getLogger(__name__)


class ThreadReply(QuietReply):
    """Answers a stored message in its channel's thread (or its DM), telling `posted` where the bot spoke."""

    def __init__(
        self,
        web: AsyncWebClient,
        channel: str,
        thread_ts: str | None,
        posted: Callable[[str, str], None],
        budget: float,
    ) -> None:
        """Answer in `channel`, in the thread `thread_ts` (None: a DM's top level), waiting out 429s for at most
        `budget` seconds a message."""
        self.web, self.channel, self.thread_ts, self.posted = web, channel, thread_ts, posted
        self.budget = budget

    async def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """The parts Slack does not have yet, yielding as each is accepted; the activity line, Show steps and an
        Allow button per call waiting on the person go under the last part."""
        parts = render_parts(answer.text)
        if answer.sent_parts >= len(parts):
            log.info("answer of turn %s was sent before its process died; not sent again", answer.turn_id)
            return
        line = steps_line(summary_line(answer.steps, answer.elapsed_s)) if answer.steps else ""
        buttons = [steps_button(answer.turn_id)] if answer.steps and answer.turn_id else []
        buttons += [element(ask.label, Allow(ask.id), "success") for ask in answer.asks]
        for i in range(answer.sent_parts, len(parts)):
            last = i == len(parts) - 1
            blocks = message_blocks(parts[i], line=line if last else "", buttons=buttons if last else ())
            fallback = f"{parts[i]}\n{line}" if last and line else parts[i]
            await post(self.web, self.channel, fallback, blocks, thread_ts=self.thread_ts, budget=self.budget)
            if self.thread_ts:
                self.posted(self.channel, self.thread_ts)
            yield i + 1

    async def error(self, error: Error) -> None:
        """One line (split when long)."""
        parts = render_parts(error.message)
        await post_parts(self.web, self.channel, parts, thread_ts=self.thread_ts, budget=self.budget)
