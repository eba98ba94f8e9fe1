"""The terminal chat: the local user talks to the core from a shell (and is an admin)."""

from __future__ import annotations

import asyncio
import getpass
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from core import (
    COMMANDS,
    HOW_TO_CONFIGURE,
    Assistant,
    CommandName,
    Core,
    Error,
    Incoming,
    ReminderMessage,
    activity_lines,
    summary_line,
)

PROMPT = "you › "
QUIT = ("/quit", "/exit")
BY_NAME: dict[str, CommandName] = {f"/{n}": c.name for c in COMMANDS for n in (c.name, *c.aliases)}
Write = Callable[[str], None]


class ConsoleOutbox:
    """Reminders printed into the terminal chat while it runs."""

    def __init__(self, write: Write) -> None:
        """Print through `write`."""
        self.write = write

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Print one reminder (the buttons become a hint)."""
        self.write(f"\n{msg.text}\n   (task #{msg.task_id}: say 'done' or 'snooze' to me)\n{PROMPT}")
        return None


CHAT = "local"  # the interactive terminal chat
ASK_CHAT = "ask"  # `bot ask`: its own conversation, fresh for each ask unless continued


def console_incoming(text: str, chat: str = CHAT) -> Incoming:
    """An Incoming from the local terminal user."""
    try:
        name = getpass.getuser()
    except Exception:
        name = "local"
    return Incoming(platform="console", user_id="local", chat_id=chat, text=text, user_name=name)


def render(event: Assistant | Error) -> str:
    """The answer, then a compact activity summary (or the error, with a config hint for LLM outages)."""
    if isinstance(event, Error):
        text = f"⚠️  {event.message}"
        if event.code == "llm_unavailable":
            text += f" To fix: {HOW_TO_CONFIGURE}."
        return text
    out = [event.text]
    if event.steps:
        out.append("   " + summary_line(event.steps, event.elapsed_s))
        out.extend("   " + line for line in activity_lines(event.steps))
    return "\n".join(out)


async def ask_once(core: Core, text: str, *, fresh: bool = True) -> tuple[str, bool]:
    """`bot ask`: answer in the ask conversation, started afresh unless `fresh` is False (`--continue`)."""
    inc = console_incoming(text, ASK_CHAT)
    if fresh:
        await core.reset(inc)
    return await ask(core, inc)


async def ask(core: Core, inc: Incoming) -> tuple[str, bool]:
    """Answer one message; returns the printed text and whether it was answered without error."""
    async with aclosing(core.handle(inc)) as events:
        async for event in events:
            if isinstance(event, Assistant | Error):
                return render(event), isinstance(event, Assistant)
    return "", True


async def command(core: Core, name: CommandName, arg: str) -> str:
    """A command of the catalogue typed in the terminal chat, answered without the LLM."""
    answer = await core.command(console_incoming(f"/{name} {arg}"), name, arg.strip(), must_answer=True)
    return render(answer) if isinstance(answer, Error) else answer or ""


async def stdin_lines() -> AsyncIterator[str]:
    """Lines typed in the terminal, read without blocking the event loop."""
    loop = asyncio.get_running_loop()
    while True:
        sys.stdout.write(PROMPT)
        sys.stdout.flush()
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        yield line.rstrip("\n")


async def chat_loop(core: Core, lines: AsyncIterator[str], write: Write) -> None:
    """The interactive terminal conversation: the commands of the catalogue (/help lists them) are answered without
    the LLM, /quit (or end of input) leaves, anything else goes to the model."""
    write("Terminal chat — type a message; /help for the commands, /reset for a fresh conversation, /quit to leave.\n")
    async for line in lines:
        text = line.strip()
        word, _, arg = text.partition(" ")
        if text in QUIT:
            return
        if word in BY_NAME:
            write(f"bot › {await command(core, BY_NAME[word], arg)}\n")
            continue
        if text:
            answer, _ = await ask(core, console_incoming(text))
            write(f"bot › {answer}\n")
