"""The Driver: what a kit test does on a platform (say something, press a button, run a command), written once per
platform against its fake server; and Said, a bot message or answer as the person sees it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from adapters.base import Adapter
from core.front_door import Core
from core.storage.db import Pool
from core.types import Incoming
from tests.fake_openai import FakeOpenAI
from tests.helpers import WAIT_S, incoming

Who = Literal["owner", "friend", "stranger"]  # the admin, a person allowed to use the bot, someone who is not
Until = Callable[[list["Said"]], bool]  # when the bot's new messages are complete
Args = Mapping[str, str | int | bool]  # a command's options by name (a flag: True)


def one(saids: list[Said]) -> bool:
    """At least one new message (the usual wait)."""
    return bool(saids)


@dataclass
class Said:
    """One bot message (or answer to a command or a press) as its reader sees it."""

    text: str  # the visible text: markup rendered away (Telegram's HTML, Discord's backslash escapes)
    buttons: list[str] = field(default_factory=list)  # the labels of the buttons under it
    private: bool = False  # only the person sees it (their private chat, an alert, an ephemeral answer)
    file: tuple[str, bytes] | None = None  # a file sent with it: (name, bytes)
    pings: tuple[str, ...] = ()  # who it notifies: user ids (and "everyone")
    reply: bool = False  # it replies to the person's message
    raw: Any = None  # the platform's own record of it (what press() needs)
    links: list[tuple[str, str]] = field(default_factory=list)  # (text, URL) of each link its reader can open


class Driver(ABC):
    """A running adapter on a Core with its fake platform; one implementation per platform hides how the platform
    does a thing (an @mention or not, a typed command or a slash command, an alert or an ephemeral answer)."""

    platform: str
    names: Mapping[Who, str]  # the display name each person has there

    def __init__(self, llm: FakeOpenAI, core: Core, pool: Pool, adapter: Adapter) -> None:
        """Keep the pieces together."""
        self.llm, self.core, self.pool, self.adapter = llm, core, pool, adapter

    @abstractmethod
    def user_id(self, who: Who) -> str:
        """The person's id on the platform."""

    def identity(self, who: Who) -> str:
        """The person as ADMINS and refusals name them: platform:id."""
        return f"{self.platform}:{self.user_id(who)}"

    def incoming(self, who: Who) -> Incoming:
        """An Incoming of the person in their private chat (to give them memory and the like directly)."""
        return incoming("", user=self.user_id(who), platform=self.platform, name=self.names[who])

    # what people do

    @abstractmethod
    async def post_private(self, text: str, who: Who = "owner") -> None:
        """The person writes to the bot privately (does not wait)."""

    @abstractmethod
    async def post_in_group(
        self, text: str, *, who: Who = "owner", mention: bool = False, reply_to: Said | None = None
    ) -> None:
        """The person writes in the shared group (channel), maybe @mentioning the bot or replying to its message."""

    @abstractmethod
    async def post_file(self, name: str, data: bytes, mime: str, caption: str, who: Who = "owner") -> None:
        """The person sends a file (a document) privately, with a caption."""

    @abstractmethod
    async def redeliver_last(self) -> None:
        """The platform delivers the person's last message again (after a restart, a second session)."""

    @abstractmethod
    async def run_command(
        self, name: str, args: Args | None = None, who: Who = "owner", *, in_group: bool = False
    ) -> Said:
        """The person runs a catalogue command (options by name) privately or in the group; the answer they get."""

    @abstractmethod
    async def press(self, said: Said, label: str, who: Who = "owner") -> Said:
        """The person presses the button labelled `label` under a message; what they see then (a refusal only they
        see, or the message as it now reads)."""

    @abstractmethod
    async def steps_of(self, said: Said, who: Who = "owner") -> str:
        """The activity of an answer, opened as the person opens it (Telegram: the expandable quote; Discord: Show
        steps)."""

    # what the bot sent

    @abstractmethod
    def sent(self) -> list[Said]:
        """Every message the bot sent into a chat so far (not answers to commands or presses), oldest first."""

    @abstractmethod
    async def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        """Wait until predicate() holds (re-checked whenever the fake sees a change), within WAIT_S."""

    @abstractmethod
    def fits(self, said: Said) -> bool:
        """Whether the message is within the platform's message limit, counted as the platform counts it."""

    @abstractmethod
    def shows_as_code(self, said: Said, line: str) -> bool:
        """Whether `line` of the message is shown as code (inside a code block)."""

    async def wait_sent(self, before: int, until: Until = one) -> list[Said]:
        """The messages sent after the first `before`, once `until` holds for them."""
        await self.wait_for(lambda: until(self.sent()[before:]), f"the bot's messages after {before}")
        return self.sent()[before:]

    async def say_private(self, text: str, who: Who = "owner", until: Until = one) -> list[Said]:
        """Write privately and wait for the answer (its parts until `until` holds)."""
        before = len(self.sent())
        await self.post_private(text, who)
        return await self.wait_sent(before, until)

    async def say_in_group(
        self, text: str, *, who: Who = "owner", mention: bool = False, reply_to: Said | None = None
    ) -> list[Said]:
        """Write in the group and wait for the answer."""
        before = len(self.sent())
        await self.post_in_group(text, who=who, mention=mention, reply_to=reply_to)
        return await self.wait_sent(before)

    async def send_file(self, name: str, data: bytes, mime: str, caption: str, who: Who = "owner") -> list[Said]:
        """Send a file privately and wait for the answer."""
        before = len(self.sent())
        await self.post_file(name, data, mime, caption, who)
        return await self.wait_sent(before)


TIMEOUT_S = WAIT_S  # every wait of a driver
