"""The kit's driver for Telegram: the real adapter (python-telegram-bot) against the fake Bot API."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from adapters.telegram import TelegramAdapter
from core import COMMANDS
from core.front_door import Core
from core.storage.db import Pool
from tests.adapter_kit.driver import TIMEOUT_S, Args, Driver, Said, Who
from tests.fake_openai import FakeOpenAI
from tests.fake_telegram import FakeTelegram, parse_html, utf16_len

USERS: dict[Who, int] = {"owner": 1001, "friend": 1002, "stranger": 4242}
GROUP = -100  # a supergroup all three are in
MENTION = "tg://user?id="


class TelegramDriver(Driver):
    """Telegram as the kit drives it: a private chat per person, a supergroup where the bot answers an @mention or a
    reply to its message, commands typed as text, buttons as inline keyboards (a refusal is an alert)."""

    platform = "telegram"
    names: Mapping[Who, str] = {"owner": "Ann", "friend": "Bob", "stranger": "Eve"}

    def __init__(self, tg: FakeTelegram, llm: FakeOpenAI, core: Core, pool: Pool) -> None:
        """The adapter (not started yet) for `core` on the fake `tg`."""
        super().__init__(llm, core, pool, TelegramAdapter(core, core.settings, poll_timeout=1))
        self.tg = tg
        self._last: dict[str, Any] | None = None  # the last update a person sent

    @staticmethod
    def settings(tg: FakeTelegram) -> dict[str, str]:
        """The core's settings that put it on the fake."""
        return {"TELEGRAM_BOT_TOKEN": tg.token, "TELEGRAM_API_BASE_URL": tg.base_url}

    def user_id(self, who: Who) -> str:
        """The person's Telegram id."""
        return str(USERS[who])

    def _person(self, who: Who) -> dict[str, Any]:
        """message_update's keywords for the person."""
        return {"user_id": USERS[who], "first_name": self.names[who]}

    def _push(self, update: dict[str, Any]) -> None:
        """Send an update to the bot, remembering it for redeliver_last."""
        self._last = update
        self.tg.push_update(update)

    async def post_private(self, text: str, who: Who = "owner") -> None:
        """A message in the person's private chat."""
        self._push(self.tg.message_update(text, chat_id=USERS[who], **self._person(who)))

    async def post_in_group(
        self, text: str, *, who: Who = "owner", mention: bool = False, reply_to: Said | None = None
    ) -> None:
        """A message in the supergroup: an @mention is typed before the text, a reply names the bot's message."""
        text = f"@{self.tg.bot_username} {text}" if mention else text
        replied = reply_to.raw if reply_to is not None else None
        update = self.tg.message_update(
            text, chat_id=GROUP, chat_type="supergroup", reply_to=replied, **self._person(who)
        )
        self._push(update)

    async def post_file(self, name: str, data: bytes, mime: str, caption: str, who: Who = "owner") -> None:
        """A document in the person's private chat."""
        update = self.tg.document_update(
            data, file_name=name, mime_type=mime, caption=caption, chat_id=USERS[who], **self._person(who)
        )
        self._push(update)

    async def redeliver_last(self) -> None:
        """The same message again under a new update id (Telegram after a restart)."""
        assert self._last is not None
        self.tg.push_update({k: v for k, v in self._last.items() if k != "update_id"})

    async def run_command(
        self, name: str, args: Args | None = None, who: Who = "owner", *, in_group: bool = False
    ) -> Said:
        """Typed: `/name value…` (a flag as its name) in the private chat, or `/name@bot …` in the group; a personal
        command asked in the group is answered in the private chat (the group gets a note): that answer."""
        command = next(c for c in COMMANDS if c.name == name)
        given = args or {}
        words = [
            o.name if given.get(o.name) is True else str(given[o.name]) for o in command.options if o.name in given
        ]
        text = " ".join([f"/{name}@{self.tg.bot_username}" if in_group else f"/{name}", *words])
        before = len(self.tg.sent)
        if in_group:
            await self.post_in_group(text, who=who)
        else:
            await self.post_private(text, who)
        count = 2 if in_group and command.private else 1
        await self.tg.wait_sent(before + count, TIMEOUT_S)
        return next(self._said(s) for s in self.tg.sent[before:] if count == 1 or s["chat_id"] == USERS[who])

    async def press(self, said: Said, label: str, who: Who = "owner") -> Said:
        """A callback query: a refusal is an alert to the presser; otherwise the press is answered and the message
        edited (its new text)."""
        [data] = [b["callback_data"] for row in _keyboard(said.raw) for b in row if b["text"] == label]
        entry, answers, edits = said.raw, len(self.tg.callback_answers), said.raw.get("edit_count", 0)
        self.tg.push_update(self.tg.callback_update(data, message=entry, **self._person(who)))
        await self.wait_for(lambda: len(self.tg.callback_answers) > answers, "an answer to the press")
        answer = self.tg.callback_answers[answers]
        if answer.get("show_alert"):
            return Said(str(answer.get("text") or ""), private=True, raw=answer)
        await self.wait_for(lambda: entry.get("edit_count", 0) > edits, "the pressed message edited")
        return self._said(entry)

    async def steps_of(self, said: Said, who: Who = "owner") -> str:
        """The expandable quote under the answer (Telegram shows it collapsed, a tap opens it)."""
        html: str = said.raw["text"]
        start = html.find("<blockquote expandable>")
        return parse_html(html[start:])[0] if start >= 0 else ""

    def sent(self) -> list[Said]:
        """sendMessage and sendDocument calls, as their readers see them now."""
        return [self._said(s) for s in self.tg.sent]

    async def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        """The fake's wait (woken by each call it gets)."""
        await self.tg.wait_for(predicate, TIMEOUT_S, what=what)

    def fits(self, said: Said) -> bool:
        """Telegram counts UTF-16 units of the text after tags."""
        return utf16_len(said.text) <= self.adapter.limits.message_chars

    def shows_as_code(self, said: Said, line: str) -> bool:
        """The line lies inside a `pre` entity."""
        visible, entities = parse_html(said.raw["text"]) if said.raw.get("parse_mode") else (said.text, [])
        at = visible.find(line)
        offset = utf16_len(visible[:at])
        return at >= 0 and any(
            e["type"] == "pre" and e["offset"] <= offset < e["offset"] + e["length"] for e in entities
        )

    def _said(self, entry: dict[str, Any]) -> Said:
        """A sent entry of the fake as its reader sees it (HTML parsed as Telegram does: invalid HTML fails here)."""
        message = entry["message"]
        raw_text = str(entry.get("text") if "text" in entry else entry.get("caption") or "")
        visible, entities = parse_html(raw_text) if entry.get("parse_mode") == "HTML" else (raw_text, [])
        pings = tuple(e["url"][len(MENTION) :] for e in entities if str(e.get("url", "")).startswith(MENTION))
        document = message.get("document")
        file = (document["file_name"], entry["document_data"]) if document else None
        buttons = [b["text"] for row in _keyboard(entry) for b in row]
        chat = entry["chat_id"]
        private = isinstance(chat, int) and chat > 0
        links = [
            (_slice(visible, e), e["url"])
            for e in entities
            if e["type"] == "text_link" and not e["url"].startswith(MENTION)
        ]
        return Said(visible, buttons, private, file, pings, "reply_parameters" in entry, entry, links)


def _keyboard(entry: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The inline keyboard under a sent message (none: empty)."""
    markup = entry.get("reply_markup") or {}
    return list(markup.get("inline_keyboard") or [])


def _slice(visible: str, entity: dict[str, Any]) -> str:
    """The text an entity covers (its offset and length count UTF-16 units)."""
    units = visible.encode("utf-16-le")
    start, length = entity["offset"] * 2, entity["length"] * 2
    return units[start : start + length].decode("utf-16-le")
