"""The kit's driver for Matrix: the real adapter (mautrix) against the fake homeserver (tests/fake_matrix.py)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Mapping
from html.parser import HTMLParser
from typing import Any

from adapters.matrix.adapter import MatrixAdapter
from adapters.matrix.buttons import BUTTONS_FIELD, LEGEND
from adapters.matrix.commands import PRIMARY
from adapters.matrix.limits import MATRIX_EVENT_BYTES, MATRIX_EVENT_HEADROOM
from core.commands import COMMANDS
from core.front_door import Core
from core.storage.db import Pool
from tests.adapter_kit.driver import TIMEOUT_S, Args, Driver, Said, Who
from tests.fake_matrix import BOT, BOT_NAME, SERVER, TOKEN, FakeMatrix, Room
from tests.fake_openai import FakeOpenAI

USERS: dict[Who, str] = {"owner": f"@owner:{SERVER}", "friend": f"@friend:{SERVER}", "stranger": f"@stranger:{SERVER}"}
MD_LINK = re.compile(r"\[([^\]]+)\]\(<?(https?://[^\s)>]+)>?\)")
A_LINK = re.compile(r'<a href="(https?://[^"]+)">(.*?)</a>', re.S)
DETAILS = re.compile(r"<details>(.*?)</details>", re.S)
PRE = re.compile(r"<pre>(.*?)</pre>", re.S)
TAG = re.compile(r"<[^>]+>")


class MatrixDriver(Driver):
    """Matrix as the kit drives it: a direct room per person (opened by them, or made by the bot), a group room
    where the bot answers a mention or a reply to its message, commands typed as `!name …`, buttons as the bot's
    reactions (a press: the person reacts with the same key; someone else first joins the room, as anyone invited
    could). What only the person should read arrives in their direct room; a stranger's invitation is declined with
    the refusal as its reason."""

    platform = "matrix"
    names: Mapping[Who, str] = {"owner": "Alice", "friend": "Bob", "stranger": "Stranger"}

    def __init__(self, mx: FakeMatrix, llm: FakeOpenAI, core: Core, pool: Pool) -> None:
        """The adapter (not started yet) for `core` on the fake `mx`."""
        super().__init__(llm, core, pool, MatrixAdapter(core, core.settings))
        self.mx = mx
        for who, uid in USERS.items():
            mx.person(uid, self.names[who])
        self._group: Room | None = None
        self._last: str | None = None  # the event id of the last message a person posted

    @staticmethod
    def settings(mx: FakeMatrix) -> dict[str, str]:
        """The core's settings that put it on the fake."""
        return {"MATRIX_HOMESERVER": mx.origin, "MATRIX_USER_ID": BOT, "MATRIX_ACCESS_TOKEN": TOKEN}

    def user_id(self, who: Who) -> str:
        """The person's Matrix id."""
        return USERS[who]

    # ---- rooms ---------------------------------------------------------------------------------------

    def _direct_of(self, uid: str) -> Room | None:
        """The person's direct room with the bot, if there is one (the bot in it or inviting them)."""
        for room in self.mx.rooms.values():
            people = room.members | room.invited
            if room.direct and uid in people and (BOT in room.members) and len(people - {BOT}) >= 1:
                if room.creator in (uid, BOT):
                    return room
        return None

    async def _direct(self, who: Who) -> Room:
        """The person's direct room: the one they have, joined; else one they open (the bot joins or declines)."""
        uid = USERS[who]
        room = self._direct_of(uid)
        if room is not None:
            if uid not in room.members:
                self.mx.join(room, uid)
            return room
        room = self.mx.direct(uid)
        await self.wait_for(lambda: BOT in room.members or BOT not in room.invited, "the bot answering the invitation")
        return room

    async def _group_room(self) -> Room:
        """The shared group room: everyone in it, the bot invited by the owner."""
        if self._group is None:
            room = self.mx.room(USERS["owner"])
            self.mx.join(room, USERS["friend"])
            self.mx.join(room, USERS["stranger"])
            self.mx.invite(room, USERS["owner"])
            await self.wait_for(lambda: BOT in room.members, "the bot joining the group room")
            self._group = room
        return self._group

    # ---- what people do ------------------------------------------------------------------------------

    async def post_private(self, text: str, who: Who = "owner") -> None:
        """A message in the person's direct room."""
        room = await self._direct(who)
        self._last = self.mx.say(room, USERS[who], text)

    async def post_in_group(
        self, text: str, *, who: Who = "owner", mention: bool = False, reply_to: Said | None = None
    ) -> None:
        """A message in the group room: a mention as Element writes it (the name, m.mentions), or a reply."""
        room = await self._group_room()
        body = f"{BOT_NAME}: {text}" if mention else text
        replied = str(reply_to.raw["event_id"]) if reply_to is not None else None
        self._last = self.mx.say(room, USERS[who], body, mentions=[BOT] if mention else None, reply_to=replied)

    async def post_file(self, name: str, data: bytes, mime: str, caption: str, who: Who = "owner") -> None:
        """An m.file in the person's direct room, the caption as its body."""
        room = await self._direct(who)
        self._last = self.mx.send_file(room, USERS[who], name, data, mime, caption)

    async def redeliver_last(self) -> None:
        """The homeserver delivers the last message again (a sync from an older token)."""
        assert self._last is not None
        self.mx.redeliver(self._last)

    async def run_command(
        self, name: str, args: Args | None = None, who: Who = "owner", *, in_group: bool = False
    ) -> Said:
        """`!name value…` typed in the person's direct room or the group room; a personal command asked in the group
        is answered in the person's direct room: that answer."""
        command = next(c for c in COMMANDS if c.name == name)
        given = args or {}
        words = [
            o.name if given.get(o.name) is True else str(given[o.name]) for o in command.options if o.name in given
        ]
        room = await self._group_room() if in_group else await self._direct(who)
        uid = USERS[who]
        before = len(self._events())
        self._last = self.mx.say(room, uid, " ".join([f"{PRIMARY}{name}", *words]))
        privately = in_group and command.private

        def answer() -> dict[str, Any] | None:
            for event in self._events()[before:]:
                there = self.mx.rooms[event["room_id"]]
                if (there.direct and uid in there.members | there.invited) if privately else there.id == room.id:
                    return event if self._complete(event) else None
            return None

        await self.wait_for(lambda: answer() is not None, f"the answer to {PRIMARY}{name}")
        found = answer()
        assert found is not None
        return self._said(found)

    async def press(self, said: Said, label: str, who: Who = "owner") -> Said:
        """The person reacts with the button's key: a refusal arrives in their direct room; otherwise the message
        as it now reads (edited)."""
        target = str(said.raw["event_id"])
        offered = said.raw["content"].get(BUTTONS_FIELD) or []
        [key] = [b["key"] for b in offered if b["label"] == label]
        room, uid = self.mx.rooms[said.raw["room_id"]], USERS[who]
        if uid not in room.members:
            self.mx.join(room, uid)
        before, edits = len(self._events()), len(self.mx.edits(target))

        def refusal() -> dict[str, Any] | None:
            return next((e for e in self._events()[before:] if self._private_to(e, uid)), None)

        self.mx.react(room, uid, target, key)
        await self.wait_for(lambda: len(self.mx.edits(target)) > edits or refusal() is not None, "the press's outcome")
        found = refusal()
        if found is not None:
            return self._said(found)
        await self.wait_for(lambda: not self.mx.reactions(target), "the bot's reactions taken away")
        return self._said(self.mx.event(target))

    async def steps_of(self, said: Said, who: Who = "owner") -> str:
        """The collapsed <details> under the answer, opened."""
        content = said.raw["content"]
        found = DETAILS.search(str(content.get("formatted_body", "")))
        return _visible(found.group(1)) if found else ""

    # ---- what the bot sent ---------------------------------------------------------------------------

    def _events(self) -> list[dict[str, Any]]:
        """The bot's messages (not its edits) and its declined invitations with a reason, oldest first."""
        out = []
        for logged in self.mx.log:
            event = logged.event
            if event.get("sender") != BOT and event.get("state_key") != BOT:
                continue
            content = event.get("content") or {}
            if event["type"] == "m.room.message" and content.get("m.relates_to", {}).get("rel_type") != "m.replace":
                out.append(event)
            elif event["type"] == "m.room.member" and content.get("membership") == "leave" and content.get("reason"):
                out.append(event)
        return out

    def _complete(self, event: dict[str, Any]) -> bool:
        """A message whose buttons (the bot's reactions) are all there, or one without."""
        offered = (event.get("content") or {}).get(BUTTONS_FIELD) or []
        return (
            not offered
            or bool(self.mx.edits(event["event_id"]))
            or len(self.mx.reactions(event["event_id"])) >= len(offered)
        )

    def _private_to(self, event: dict[str, Any], uid: str) -> bool:
        """Whether the event is in the person's direct room with the bot."""
        room = self.mx.rooms[event["room_id"]]
        return room.direct and uid in room.members | room.invited

    def sent(self) -> list[Said]:
        """The bot's messages as their readers see them now (each once its buttons are there)."""
        return [self._said(e) for e in self._events() if self._complete(e)]

    async def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        """The fake's wait (woken by each event and call)."""
        await self.mx.wait_for(predicate, TIMEOUT_S, what=what)

    def fits(self, said: Said) -> bool:
        """The event's content within the spec's 65,536 bytes of an event, with room for the homeserver's fields."""
        size = len(json.dumps(said.raw.get("content") or {}, ensure_ascii=False).encode())
        return size <= MATRIX_EVENT_BYTES - MATRIX_EVENT_HEADROOM

    def shows_as_code(self, said: Said, line: str) -> bool:
        """The line lies inside a <pre> of the HTML, or (a message without HTML) between fence lines of the body."""
        content = said.raw["content"]
        if "formatted_body" in content:
            return any(line in html.unescape(TAG.sub("", block)) for block in PRE.findall(content["formatted_body"]))
        lines = str(content.get("body", "")).split("\n")
        at = next((i for i, text in enumerate(lines) if line in text), None)
        return at is not None and sum(1 for text in lines[:at] if text.startswith("```")) % 2 == 1

    def _said(self, event: dict[str, Any]) -> Said:
        """A message as its reader sees it now: the body of its last edit, without the line naming the reactions;
        the buttons still offered; whom it notifies (m.mentions)."""
        room = self.mx.rooms[event["room_id"]]
        if event["type"] == "m.room.member":  # a declined invitation: its reason is what the person reads
            return Said(str(event["content"]["reason"]), private=room.direct, raw=event)
        original = event["content"]
        edits = self.mx.edits(event["event_id"])
        content = edits[-1]["content"]["m.new_content"] if edits else original
        body = shown(content)
        offered = content.get(BUTTONS_FIELD) or []
        if offered:  # the line naming the reactions is the buttons, not the text
            body = "\n".join(line for line in body.split("\n") if not line.startswith(f"{LEGEND} ")).rstrip()
        live = {r["content"]["m.relates_to"]["key"] for r in self.mx.reactions(event["event_id"])}
        buttons = [str(b["label"]) for b in offered if b["key"] in live]
        mentions = original.get("m.mentions") or {}
        pings = tuple(mentions.get("user_ids") or ()) + (("everyone",) if mentions.get("room") else ())
        file = None
        if content.get("msgtype") == "m.file":
            media = str(content["url"]).rsplit("/", 1)[-1]
            file = (str(content.get("filename") or body), self.mx.media[media][0])
        reply = "m.in_reply_to" in (original.get("m.relates_to") or {})
        links = _links(content)
        return Said(body, buttons, room.direct, file, pings, reply, {**event, "content": content}, links)


class Reader(HTMLParser):
    """Matrix HTML as a reader sees its text: each block on lines of its own, a list's items numbered or bulleted,
    a line break as one; whitespace between tags ignored outside <pre>."""

    BLOCKS = frozenset({"p", "div", "pre", "blockquote", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "table", "tr"})
    BLOCKS |= {"details", "summary", "hr"}

    def __init__(self) -> None:
        """Nothing read yet."""
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.lists: list[list[int]] = []  # per open list: [next number] (ol) or [] (ul)
        self.pre = 0

    def _line(self) -> None:
        """End the current line (once)."""
        if self.out and not self.out[-1].endswith("\n"):
            self.out.append("\n")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """Blocks start on a line of their own; a list item with its number or bullet."""
        if tag == "br":
            self.out.append("\n")
        elif tag in ("ol", "ul"):
            self._line()
            start = int(dict(attrs).get("start") or 1)
            self.lists.append([start] if tag == "ol" else [])
        elif tag == "li":
            self._line()
            numbers = self.lists[-1] if self.lists else []
            self.out.append(f"{numbers[0]}. " if numbers else "• ")
            if numbers:
                numbers[0] += 1
        elif tag in self.BLOCKS:
            self._line()
        if tag == "pre":
            self.pre += 1

    def handle_endtag(self, tag: str) -> None:
        """A block ends its line."""
        if tag in ("ol", "ul") and self.lists:
            self.lists.pop()
        if tag == "pre":
            self.pre -= 1
        if tag in self.BLOCKS or tag == "li":
            self._line()

    def handle_data(self, data: str) -> None:
        """Text as it is (whitespace between blocks dropped)."""
        if self.pre or data.strip():
            self.out.append(data)

    def text(self) -> str:
        """What was read."""
        return "".join(self.out).strip()


def shown(content: dict[str, Any]) -> str:
    """A message's text as a client shows it: its HTML read as text, else its body."""
    if content.get("format") != "org.matrix.custom.html" or not isinstance(content.get("formatted_body"), str):
        return str(content.get("body", ""))
    reader = Reader()
    reader.feed(content["formatted_body"])
    reader.close()
    return reader.text()


def _links(content: dict[str, Any]) -> list[tuple[str, str]]:
    """The links a reader can open: the HTML's (not mentions), else the Markdown links of the body."""
    found = [
        (_visible(text), url)
        for url, text in A_LINK.findall(str(content.get("formatted_body", "")))
        if not url.startswith("https://matrix.to/")
    ]
    return found or [(text, url) for text, url in MD_LINK.findall(str(content.get("body", "")))]


def _visible(fragment: str) -> str:
    """HTML as its text: line breaks kept, tags dropped, entities unescaped."""
    text = re.sub(r"<br\s*/?>|</p>|</li>|</summary>", "\n", fragment)
    return html.unescape(TAG.sub("", text)).strip()
