"""Sending to Slack: every Web API call waits out a 429's Retry-After as often as it takes within a budget (an
answer's: AGENT_TOTAL_TIMEOUT, so it arrives late rather than never; a reminder's send past it fails and the reminder
engine tries again later, without the parts Slack already has); messages
with blocks (text, the activity line, buttons); answers to slash commands and presses through their response_url."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from adapters.slack.incoming import split_id
from adapters.slack.limits import SLACK_RATE_BUDGET_S, SLACK_RETRY_AFTER_DEFAULT_S, SLACK_TEXT_LIMIT
from adapters.slack.render import plain, render_parts
from core import DeliveryRefused, ReminderMessage

log = logging.getLogger(__name__)

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
Blocks = list[dict[str, Any]]
REFUSALS = frozenset(  # errors that will not pass on a retry: the chat is closed to the bot for good
    {"channel_not_found", "is_archived", "not_in_channel", "user_disabled", "cannot_dm_bot", "account_inactive"}
)


async def patiently(
    call: Callable[[], Awaitable[T]], *, budget: float = SLACK_RATE_BUDGET_S, sleep: Sleep = asyncio.sleep
) -> T:
    """Run a Web API call, waiting out 429s (Retry-After) while the waits fit in `budget`; then the 429 is raised."""
    waited = 0.0
    while True:
        try:
            return await call()
        except SlackApiError as e:
            if e.response.status_code != 429:
                raise
            wait = retry_after(e)
            if waited + wait > budget:
                raise
            log.info("Slack rate limit: waiting %gs (Retry-After)", wait)
            waited += wait
            await sleep(wait)


def retry_after(error: SlackApiError) -> float:
    """The seconds a 429 asks to wait."""
    value = (error.response.headers or {}).get("Retry-After") or (error.response.headers or {}).get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else SLACK_RETRY_AFTER_DEFAULT_S
    except ValueError:
        return SLACK_RETRY_AFTER_DEFAULT_S


def section(text: str) -> dict[str, Any]:
    """A block of mrkdwn text."""
    return {"type": "section", "text": {"type": "mrkdwn", "text": text or " ", "verbatim": True}}


def sections(text: str, most: int = SLACK_TEXT_LIMIT) -> list[str]:
    """The text in pieces a section block takes, cut between lines where it can."""
    pieces: list[str] = []
    while len(text) > most:
        cut = text.rfind("\n", 0, most)
        cut = cut if cut > 0 else most
        pieces.append(text[:cut])
        text = text[cut:].removeprefix("\n")
    return [*pieces, text]


def context(text: str) -> dict[str, Any]:
    """A small grey line (the activity's summary)."""
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text, "verbatim": True}]}


def actions(buttons: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A row of buttons."""
    return {"type": "actions", "elements": list(buttons)}


def message_blocks(text: str, *, line: str = "", buttons: Sequence[dict[str, Any]] = ()) -> Blocks:
    """A message's blocks: its text (in sections of at most SLACK_TEXT_LIMIT), maybe the activity line, maybe its
    buttons."""
    blocks = [section(chunk) for chunk in sections(text)]
    if line:
        blocks.append(context(line))
    if buttons:
        blocks.append(actions(buttons))
    return blocks


async def post(
    web: AsyncWebClient,
    channel: str,
    text: str,
    blocks: Blocks,
    *,
    thread_ts: str | None = None,
    budget: float = SLACK_RATE_BUDGET_S,
) -> dict[str, Any]:
    """chat.postMessage (429s waited out within `budget` seconds); the message Slack kept."""
    extra: dict[str, Any] = {"thread_ts": thread_ts} if thread_ts else {}
    response = await patiently(
        lambda: web.chat_postMessage(channel=channel, text=text, blocks=blocks, unfurl_links=False, **extra),
        budget=budget,
    )
    return dict(response.data) if isinstance(response.data, dict) else {}


async def post_parts(
    web: AsyncWebClient,
    channel: str,
    parts: Sequence[str],
    *,
    thread_ts: str | None = None,
    budget: float = SLACK_RATE_BUDGET_S,
) -> None:
    """Plain parts, one message each."""
    for part in parts:
        await post(web, channel, part, [section(part)], thread_ts=thread_ts, budget=budget)


async def respond(url: str, text: str, blocks: Blocks | None = None, *, ephemeral: bool, replace: bool = False) -> None:
    """An answer through a response_url: only its person sees it (ephemeral) or the channel does; `replace`: it takes
    the pressed message's place."""
    hook = AsyncWebhookClient(url)
    body: dict[str, Any] = {"text": text, "blocks": blocks if blocks is not None else [section(text)]}
    if replace:
        body["replace_original"] = True
    else:
        body |= {"response_type": "ephemeral" if ephemeral else "in_channel", "replace_original": False}
    response = await hook.send_dict(body)
    if response.status_code >= 400:
        log.warning("Slack response_url answered %s: %s", response.status_code, response.body)


async def note(url: str, text: str) -> None:
    """A short note only the presser sees (a refusal, a failure)."""
    await respond(url, text, ephemeral=True)


async def deliver_reminder(web: AsyncWebClient, msg: ReminderMessage, buttons: Sequence[dict[str, Any]]) -> str | None:
    """Push a reminder into its DM or channel (naming only its owner in a channel) with the buttons on its last
    part, each part recorded as it is accepted; a closed chat raises DeliveryRefused. The last message's ts."""
    _, channel = split_id(msg.chat_id)
    body = msg.text
    if msg.chat_kind == "group":
        _, owner = split_id(msg.owner_id)
        body = f"<@{owner}> " + body
    parts = render_parts(body)
    if msg.chat_kind == "group":  # the owner's mention survives the escaping the renderer does
        parts = [p.replace(plain(f"<@{split_id(msg.owner_id)[1]}>"), f"<@{split_id(msg.owner_id)[1]}>") for p in parts]
    ts: str | None = None
    thread = msg.thread_id or None
    try:
        for i in range(msg.sent_parts, len(parts)):
            last = i == len(parts) - 1
            blocks = message_blocks(parts[i], buttons=buttons if last else ())
            sent = await post(web, channel, parts[i], blocks, thread_ts=thread)
            ts = str(sent.get("ts")) if sent.get("ts") else None
            await msg.mark_sent(i + 1)
    except SlackApiError as e:
        error = str(e.response.get("error", "")) if e.response is not None else ""
        if error in REFUSALS:
            raise DeliveryRefused(f"Slack: {error}") from e
        raise
    return ts
