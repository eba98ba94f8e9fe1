"""What a command is: its declaration (name, options, parser, handler) and what its handler is given (`Ask`: the
speaker's message, the options, the core's parts). A new command is one `Command(...)` beside its handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from core.accounts.own_data import FileAnswer
from core.accounts.usage import Spending
from core.agent.llm import LLM
from core.agent.providers import ModelChoice
from core.buttons import Buttons
from core.commands.board import StatusBoard
from core.mcp_servers.hub import Hub
from core.media.audio import Audio
from core.remind import Reminded
from core.reminders.engine import Outbox
from core.reminders.watching import PageReader
from core.settings import Settings
from core.storage import conversations
from core.storage.db import Pool
from core.timeutil import Clock
from core.tools.framework import Caps
from core.types import ChatRef, Incoming, UserRef

CommandName = str  # a name of the catalogue (core/commands/catalogue.py: COMMAND)
CommandArgs = Mapping[str, str]
Answer = str | FileAnswer | Reminded | Buttons  # Markdown, a file (/export), a made reminder, an answer with buttons


class CoreParts(Protocol):
    """What the command handlers use of the core (it builds them; they never import it)."""

    settings: Settings
    pool: Pool
    llm: LLM
    models: tuple[ModelChoice, ...]  # the models people may pick, the default first
    clock: Clock
    caps: Caps
    task_listeners: list[Callable[[], None]]
    outboxes: dict[str, Outbox]  # the running front ends' (Core.running): messages without a user message
    mcp: Hub  # the MCP tool servers (their state for /status)
    web_url: str | None  # where this process serves the web page on this machine (None: it does not)
    audio: Audio
    spending: Spending
    status_board: StatusBoard
    page_reader: PageReader | None  # reads a web page (/watch); None: this bot reads none

    def is_admin(self, inc: Incoming) -> bool:
        """Whether the speaker is named in ADMINS."""

    async def reset(self, inc: Incoming) -> None:
        """Start a fresh conversation in the message's chat."""

    async def allow_mcp(self, inc: Incoming, ask_id: int) -> tuple[bool, str]:
        """Run a parked MCP call its person allowed."""


@dataclass(frozen=True)
class Ask:
    """One command asked: the speaker's message (their identity from the platform), its options, the core."""

    inc: Incoming
    options: CommandArgs
    core: CoreParts

    def get(self, name: str) -> str:
        """An option's value ("" when not given)."""
        return self.options.get(name, "")

    async def speaker(self) -> tuple[UserRef, ChatRef]:
        """The speaking person and the chat, as stored (upserted)."""
        return await conversations.identify(self.core.pool, self.inc, self.core.settings.DEFAULT_TIMEZONE)

    def tasks_changed(self) -> None:
        """Tell the reminder scheduler that tasks were made, moved or deleted."""
        for listener in self.core.task_listeners:
            listener()


Handler = Callable[[Ask], Awaitable[Answer]]


def first_option(command: Command, text: str) -> dict[str, str]:
    """The text after the command as its first option (nothing when empty): the parser of most commands."""
    text = text.strip()
    return {command.options[0].name: text} if command.options and text else {}


@dataclass(frozen=True)
class Option:
    """One argument of a command: Discord shows it as a slash-command option, the text chats take it by position."""

    name: str
    description: str
    kind: Literal["text", "integer", "flag"] = "text"
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Command:
    """One command the bot answers without the LLM, as every front end offers it, with its handler."""

    name: CommandName
    summary: str  # the menu line (Telegram's command list, Discord's slash command)
    help: str  # what /help says it does
    run: Handler = field(repr=False)
    options: tuple[Option, ...] = ()
    private: bool = False  # asked in a group, the answer goes to the speaker's private chat (it is personal)
    aliases: tuple[str, ...] = ()  # other names the text chats accept (Telegram's /start)
    syntax: str = ""  # what /help shows after the name, e.g. Area/City
    reader: Callable[[str], dict[str, str]] | None = field(default=None, repr=False)  # typed text → options

    def parse(self, text: str) -> dict[str, str]:
        """The arguments typed after the command in a text chat, by option name."""
        return self.reader(text) if self.reader is not None else first_option(self, text)


def counted(n: int, noun: str) -> str:
    """`1 line`, `3 lines`, `2 archival entries`."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") else f"{n} {noun}s"
