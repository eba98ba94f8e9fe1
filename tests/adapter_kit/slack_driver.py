"""The kit's driver for Slack: the real adapter (slack_sdk) against the fake Web API and Socket Mode."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping
from typing import Any

from adapters.slack.adapter import SlackAdapter
from adapters.slack.constants import COMMAND
from adapters.slack.render import ZWSP
from core import SHOW_STEPS
from core.commands import COMMANDS
from core.front_door import Core
from core.storage.db import Pool
from tests.adapter_kit.driver import TIMEOUT_S, Args, Driver, Said, Who
from tests.fake_openai import FakeOpenAI
from tests.fake_slack import GROUP, TEAM, FakeSlack, Interaction

USERS: dict[Who, str] = {"owner": "U0OWNER1", "friend": "U0FRIEND", "stranger": "U0STRANG"}
USERS_IN_TEAM: dict[Who, str] = {who: f"{TEAM}:{uid}" for who, uid in USERS.items()}  # as ADMINS names them
PING = re.compile(r"<@([UW][A-Z0-9]+)>")
SPECIAL = re.compile(r"<!(here|channel|everyone)>")
SLACK_LINK = re.compile(r"<(https?://[^|>]+)\|([^>]+)>")
MD_LINK = re.compile(r"\[([^\]]+)\]\(<?(https?://[^\s)>]+)>?\)")


class SlackDriver(Driver):
    """Slack as the kit drives it: a DM per person, a channel where the bot answers an @mention or a message in its
    thread (a reply to the bot's message is one in that thread), commands as `/assistant <name> …` (personal answers
    ephemeral), buttons as block_actions answered through their response_url."""

    platform = "slack"
    names: Mapping[Who, str] = {"owner": "Alice", "friend": "Bob", "stranger": "Stranger"}

    def __init__(self, sl: FakeSlack, llm: FakeOpenAI, core: Core, pool: Pool) -> None:
        """The adapter (not started yet) for `core` on the fake `sl`."""
        super().__init__(llm, core, pool, SlackAdapter(core, core.settings))
        self.sl = sl
        for who, uid in USERS.items():
            sl.person(uid, self.names[who])
        self._last: str | None = None  # the envelope of the last message a person posted

    @staticmethod
    def settings(sl: FakeSlack) -> dict[str, str]:
        """The core's settings that put it on the fake (Socket Mode)."""
        return {"SLACK_BOT_TOKEN": sl.token, "SLACK_APP_TOKEN": sl.app_token, "SLACK_API_BASE_URL": sl.api_base}

    def user_id(self, who: Who) -> str:
        """The person's id as the core knows it: `<team>:<user>`."""
        return f"{TEAM}:{USERS[who]}"

    async def post_private(self, text: str, who: Who = "owner") -> None:
        """A message in the person's DM with the bot."""
        uid = USERS[who]
        self._last = await self.sl.push("events_api", self.sl.post(uid, text, channel=self.sl.dm_of(uid)))

    async def post_in_group(
        self, text: str, *, who: Who = "owner", mention: bool = False, reply_to: Said | None = None
    ) -> None:
        """A message in the channel: an @mention of the bot, or one in the thread of the bot's message."""
        thread = None
        if reply_to is not None:
            thread = reply_to.raw.get("thread_ts") or reply_to.raw["ts"]
        body = f"<@UBOT0001> {text}" if mention else text
        self._last = await self.sl.push("events_api", self.sl.post(USERS[who], body, channel=GROUP, thread_ts=thread))

    async def post_file(self, name: str, data: bytes, mime: str, caption: str, who: Who = "owner") -> None:
        """A file shared in the person's DM, with the caption as the message's text."""
        uid = USERS[who]
        f = self.sl.shared_file(name, data, mime)
        event = self.sl.post(uid, caption, channel=self.sl.dm_of(uid), files=[f])
        self._last = await self.sl.push("events_api", event)

    async def redeliver_last(self) -> None:
        """Slack sends the last envelope again (retry_attempt 1)."""
        assert self._last is not None
        await self.sl.redeliver(self._last)

    async def run_command(
        self, name: str, args: Args | None = None, who: Who = "owner", *, in_group: bool = False
    ) -> Said:
        """`/assistant name value…` in the person's DM or in the channel: what came to its response_url (an /export
        file arrives in the person's DM)."""
        command = next(c for c in COMMANDS if c.name == name)
        given = args or {}
        words = [
            o.name if given.get(o.name) is True else str(given[o.name]) for o in command.options if o.name in given
        ]
        uid = USERS[who]
        channel = GROUP if in_group else self.sl.dm_of(uid)
        files = len(self.sl.sent)
        it = await self.sl.interact("slash_commands", self.sl.command(uid, channel, COMMAND, " ".join([name, *words])))
        said = self._answer(await self.sl.wait_answered(it, TIMEOUT_S))
        shared = [m for m in self.sl.sent[files:] if m.get("files")]
        if shared:
            f = shared[-1]["files"][0]
            said.file = (str(f["name"]), self.sl.uploads[f["id"]]["data"])
        return said

    async def press(self, said: Said, label: str, who: Who = "owner") -> Said:
        """A block action: a refusal is ephemeral; otherwise the pressed message as it now reads."""
        [action_id] = [b["action_id"] for b in _buttons(said.raw) if b["text"]["text"] == label]
        payload = self.sl.block_action(USERS[who], said.raw, action_id)
        it = await self.sl.wait_answered(await self.sl.interact("interactive", payload), TIMEOUT_S)
        body = it.responses[-1]
        if not body.get("replace_original"):
            return self._answer(it)
        return self._said(said.raw)  # the fake edited it in place

    async def steps_of(self, said: Said, who: Who = "owner") -> str:
        """What Show steps opens: a message only the presser sees."""
        label = next(b["text"]["text"] for b in _buttons(said.raw) if SHOW_STEPS in b["text"]["text"])
        return (await self.press(said, label, who)).text

    def sent(self) -> list[Said]:
        """Messages the bot posted into channels, as they read now."""
        return [self._said(m) for m in self.sl.sent]

    async def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        """The fake's wait (woken by each call and ack)."""
        await self.sl.wait_for(predicate, TIMEOUT_S, what=what)

    def fits(self, said: Said) -> bool:
        """Each text block within Slack's limit."""
        return all(len(t) <= self.adapter.limits.message_chars for t in _texts(said.raw))

    def shows_as_code(self, said: Said, line: str) -> bool:
        """The line comes after an odd number of fence lines in its message's text."""
        lines = "\n".join(_texts(said.raw)).split("\n")
        at = next((i for i, text in enumerate(lines) if html.unescape(line) in html.unescape(text)), None)
        return at is not None and sum(1 for text in lines[:at] if text.startswith("```")) % 2 == 1

    def _answer(self, it: Interaction) -> Said:
        """An interaction's answer: every response_url post (and an ack's payload), the last one's buttons."""
        bodies = [*([it.ack_payload] if it.ack_payload else []), *it.responses]
        last = bodies[-1]
        said = self._said({**last, "channel": _channel(it.payload), "ts": _ts(it)})
        said.text = "\n".join(self._said(b).text for b in bodies)
        said.private = all(b.get("response_type", "ephemeral") == "ephemeral" for b in bodies) or _channel(
            it.payload
        ).startswith("D")
        if not last.get("replace_original"):
            said.raw = self._kept(it, last) or said.raw
        return said

    def _kept(self, it: Interaction, body: dict[str, Any]) -> dict[str, Any] | None:
        """The message the fake keeps for a response_url answer (to press its buttons)."""
        return body.get("_message")

    def _said(self, message: dict[str, Any]) -> Said:
        """A message as its reader sees it: its blocks' text, entities unescaped, Slack's links as their text."""
        raw = "\n".join(_texts(message)) or str(message.get("text") or "")
        pings = tuple(f"{TEAM}:{u}" for u in PING.findall(raw)) + (("everyone",) if SPECIAL.search(raw) else ())
        links = [(text, url) for url, text in SLACK_LINK.findall(raw)]
        text = html.unescape(SLACK_LINK.sub(r"\2", PING.sub(lambda m: f"@{m.group(1)}", raw)))
        text = text.replace(ZWSP, "")  # invisible: the reader sees "@here" (the space keeps it from being a name)
        links += MD_LINK.findall(text)
        channel = str(message.get("channel", ""))
        private = channel.startswith("D") or bool(message.get("ephemeral"))
        file = None
        if message.get("files"):
            f = message["files"][0]
            file = (str(f["name"]), self.sl.uploads.get(f["id"], {}).get("data", b""))
        labels = [str(b["text"]["text"]) for b in _buttons(message)]
        reply = bool(message.get("thread_ts")) and message.get("thread_ts") != message.get("ts")
        return Said(text, labels, private, file, pings, reply, message, links)


def _texts(message: dict[str, Any]) -> list[str]:
    """The mrkdwn of a message's section and context blocks."""
    out = []
    for block in message.get("blocks") or []:
        if block.get("type") == "section":
            out.append(str(block["text"]["text"]))
        elif block.get("type") == "context":
            out += [str(e.get("text", "")) for e in block.get("elements") or []]
    return out


def _buttons(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The buttons of a message's actions blocks."""
    return [e for b in message.get("blocks") or [] if b.get("type") == "actions" for e in b.get("elements") or []]


def _channel(payload: dict[str, Any]) -> str:
    """The channel of a command or a press."""
    channel = payload.get("channel")
    return str(channel["id"]) if isinstance(channel, dict) else str(payload.get("channel_id", ""))


def _ts(it: Interaction) -> str:
    """The pressed message's ts (a command's answer has none of its own)."""
    return str((it.payload.get("message") or {}).get("ts", ""))
