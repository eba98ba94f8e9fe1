"""The kit's driver for Discord: the real adapter (discord.py) against the fake REST API and gateway."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from adapters.discord.adapter import DiscordAdapter
from core import SHOW_STEPS
from core.front_door import Core
from core.storage.db import Pool
from tests.adapter_kit.driver import TIMEOUT_S, Args, Driver, Said, Who
from tests.fake_discord import EPHEMERAL, FakeDiscord, FakeInteraction
from tests.fake_openai import FakeOpenAI

# snowflakes of Discord's length: the fake then finds their <@id> mentions in a message, as Discord does
USERS: dict[Who, int] = {
    "owner": 200_000_000_000_000_001,
    "friend": 200_000_000_000_000_002,
    "stranger": 300_000_000_000_000_003,
}
ESCAPED = re.compile(r"\\([^\sA-Za-z0-9])")  # Markdown escapes Discord shows as the character alone
MASKED_LINK = re.compile(r"\[([^\]]+)\]\(<?(https?://[^\s)>]+)>?\)")  # [text](url): Discord shows a link
DM = 1  # a channel's type: a direct message


class DiscordDriver(Driver):
    """Discord as the kit drives it: a DM per person, a server channel where the bot answers an @mention or a reply to
    its message, commands as slash interactions (personal answers ephemeral), buttons as components."""

    platform = "discord"
    names: Mapping[Who, str] = {"owner": "Alice", "friend": "Bob", "stranger": "Stranger"}

    def __init__(self, dc: FakeDiscord, llm: FakeOpenAI, core: Core, pool: Pool) -> None:
        """The adapter (not started yet) for `core` on the fake `dc`."""
        super().__init__(llm, core, pool, DiscordAdapter(core, core.settings, guild_ready_timeout=0.05))
        self.dc = dc
        self.users = {who: dc.user(uid, self.names[who]) for who, uid in USERS.items()}
        self._last: dict[str, Any] | None = None  # the last message a person posted

    @staticmethod
    def settings(dc: FakeDiscord) -> dict[str, str]:
        """The core's settings that put it on the fake."""
        return {
            "DISCORD_BOT_TOKEN": dc.token,
            "DISCORD_API_BASE_URL": dc.api_base,
            "DISCORD_GATEWAY_URL": dc.gateway_url,
        }

    def user_id(self, who: Who) -> str:
        """The person's Discord id."""
        return str(USERS[who])

    async def post_private(self, text: str, who: Who = "owner") -> None:
        """A message in the person's DM with the bot."""
        self._last = await self.dc.post_message(self.users[who], text, dm=True)

    async def post_in_group(
        self, text: str, *, who: Who = "owner", mention: bool = False, reply_to: Said | None = None
    ) -> None:
        """A message in the server's channel: an @mention of the bot, or a reply to its message."""
        replied = reply_to.raw if reply_to is not None else None
        self._last = await self.dc.post_message(self.users[who], text, mention_bot=mention, reply_to=replied)

    async def post_file(self, name: str, data: bytes, mime: str, caption: str, who: Who = "owner") -> None:
        """An attachment in the person's DM, with the caption as the message's text."""
        attachment = {"filename": name, "data": data, "content_type": mime}
        self._last = await self.dc.post_message(self.users[who], caption, dm=True, attachments=[attachment])

    async def redeliver_last(self) -> None:
        """The same MESSAGE_CREATE again (a second session of the bot receiving it too)."""
        assert self._last is not None
        await self.dc.dispatch("MESSAGE_CREATE", self._last)

    async def run_command(
        self, name: str, args: Args | None = None, who: Who = "owner", *, in_group: bool = False
    ) -> Said:
        """A slash command in the person's DM or in the server's channel: the interaction's answer."""
        it = await self.dc.slash(name, dict(args) if args else None, self.users[who], dm=not in_group)
        return self._answer(await it.wait_done(TIMEOUT_S))

    async def press(self, said: Said, label: str, who: Who = "owner") -> Said:
        """A component interaction: a refusal is ephemeral; otherwise the message is updated in place."""
        [custom_id] = [c["custom_id"] for c in _buttons(said.raw) if c.get("label") == label]
        pressed = await (await self.dc.click(said.raw, custom_id, self.users[who])).wait_done(TIMEOUT_S)
        if pressed.ephemeral:
            return self._answer(pressed)
        return self._said(self.dc.message(said.raw["id"]))

    async def steps_of(self, said: Said, who: Who = "owner") -> str:
        """What Show steps opens (in place in a DM, only to the presser in a server)."""
        return (await self.press(said, SHOW_STEPS, who)).text

    def sent(self) -> list[Said]:
        """Messages posted into channels (not interaction answers), as they read now."""
        return [self._said(self.dc.message(m["id"])) for m in self.dc.sent]

    async def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        """The fake's wait (woken by each REST call and gateway event)."""
        await self.dc.wait_for(predicate, TIMEOUT_S, what=what)

    def fits(self, said: Said) -> bool:
        """Discord counts characters of the content."""
        return len(said.raw["content"]) <= self.adapter.limits.message_chars

    def shows_as_code(self, said: Said, line: str) -> bool:
        """The line comes after an odd number of fence lines in its message."""
        lines: list[str] = said.raw["content"].split("\n")
        at = next((i for i, text in enumerate(lines) if line in text), None)
        return at is not None and sum(1 for text in lines[:at] if text.startswith("```")) % 2 == 1

    def _answer(self, it: FakeInteraction) -> Said:
        """An interaction's answer: its texts, the buttons and files of its last message."""
        messages = [m for m in (it.message, *it.followups) if m is not None]
        last = messages[-1] if messages else {}
        said = self._said(last) if last else Said("")
        said.text = ESCAPED.sub(r"\1", "\n".join(it.texts()))
        said.private = said.private or it.ephemeral
        return said

    def _said(self, message: dict[str, Any]) -> Said:
        """A stored message as its reader sees it."""
        attachments = message.get("attachments") or []
        file = None
        if attachments:
            file = (attachments[0]["filename"], self.dc.attachment_data(attachments[0])[1])
        private = self.dc.channel(message["channel_id"]).get("type") == DM or bool(
            int(message.get("flags") or 0) & EPHEMERAL
        )
        pings = tuple(str(u["id"]) for u in message.get("mentions") or [])
        pings += ("everyone",) if message.get("mention_everyone") else ()
        labels = [str(c.get("label")) for c in _buttons(message)]
        text = ESCAPED.sub(r"\1", str(message.get("content") or ""))
        links = MASKED_LINK.findall(text)
        return Said(text, labels, private, file, pings, bool(message.get("message_reference")), message, links)


def _buttons(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The components of a message's action rows."""
    return [c for row in message.get("components") or [] for c in row.get("components") or []]
