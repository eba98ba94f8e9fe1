"""The Home tab: opened, it shows the person's open tasks and reminders (the catalogue's /tasks, without the model),
or the line saying why the bot is not theirs to use."""

from __future__ import annotations

from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.incoming import command_incoming
from adapters.slack.limits import SLACK_HOME_BLOCKS, SLACK_TEXT_LIMIT
from adapters.slack.render import render_parts
from adapters.slack.send import patiently, section
from core import Core, Error

HOME_TITLE = "*Your tasks and reminders*"


async def publish_home(core: Core, web: AsyncWebClient, team: str, event: dict[str, Any]) -> None:
    """Publish the person's Home tab (app_home_opened on the Home tab)."""
    user = str(event["user"])
    payload = {"user_id": user, "user_name": "", "channel_id": str(event.get("channel") or f"D{user[1:]}")}
    inc = command_incoming(team, payload)
    answer = await core.command(inc, "tasks", "", must_answer=True)
    if isinstance(answer, Error) or answer is None:
        text = answer.message if isinstance(answer, Error) else core.refusal_text(inc)
    else:
        text = answer if isinstance(answer, str) else answer.text
    blocks = [section(HOME_TITLE), *(section(p) for p in render_parts(text, SLACK_TEXT_LIMIT))][:SLACK_HOME_BLOCKS]
    await patiently(lambda: web.views_publish(user_id=user, view={"type": "home", "blocks": blocks}))
