"""The terminal chat: the local user talks to the core from a shell (and is an admin)."""

from __future__ import annotations

import asyncio
import getpass
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TextIO

from core import (
    NOT_YOUR_PRESS,
    Assistant,
    Buttons,
    CommandArgs,
    CommandName,
    Confirm,
    Core,
    Error,
    FileAnswer,
    Incoming,
    QuietReply,
    Reminded,
    ReminderMessage,
    Settings,
    activity_lines,
    fix_hint,
    summary_line,
    typed_command,
)

BANNER = "Terminal chat — type a message; /help for the commands, /reset for a fresh conversation, /quit to leave."
NO_MODEL_BANNER = (
    "Terminal chat, no model set — commands work: try /remind in 10 minutes Tea or /help; to get answers, see "
    "“Choosing the model” in the README."
)
PROMPT = "you › "
BOT = "bot › "
QUIT = ("/quit", "/exit")
PRESS_HOW = "Type its number to press it; anything else leaves it as it is."  # under a confirmation's numbered buttons
LEFT = "Left as it was."  # a confirmation or choice answered with anything but one of its numbers
READ_SIZE = 65536  # bytes read from standard input at a time
MIN_WIDTH = 20  # columns Markdown is laid out in, however narrow the terminal
EXPORTS = "exports"  # /export writes its file into this folder of DATA_DIR
Write = Callable[[str], None]
Show = Callable[[str, str], str]  # (prefix, Markdown) → the text printed: the prefix, then the Markdown
Choices = tuple[tuple[str, Confirm], ...]  # a confirmation's or choice's buttons (label, press), numbered from 1
# markdown-it's inline tokens shown otherwise than rich does: a soft line break stays a break, and `<name>` (read as
# inline HTML, which rich drops) is text: /help's `/model <name>` keeps its placeholder
INLINE_AS = {"softbreak": "hardbreak", "html_inline": "text"}


def as_written(prefix: str, text: str) -> str:
    """The Markdown as written, after the prefix: what pipes, files and scripts get."""
    return prefix + text


def markdown_for(stream: TextIO) -> Show:
    """Markdown rendered with rich when `stream` is a terminal (continuation lines indented under the prefix's end),
    else as written."""
    if not stream.isatty():
        return as_written
    from rich.console import Console
    from rich.markdown import Markdown

    terminal = Console(file=stream, force_terminal=True)

    def show(prefix: str, text: str) -> str:
        markdown = Markdown(text)
        for token in markdown.parsed:  # a line break inside a paragraph stays one, as in the chats (and Telegram)
            for child in token.children or ():
                child.type = INLINE_AS.get(child.type, child.type)
        with terminal.capture() as captured:
            terminal.print(markdown, width=max(terminal.width - len(prefix), MIN_WIDTH))
        lines = [line.rstrip(" ") for line in captured.get().rstrip("\n ").split("\n")]
        return prefix + ("\n" + " " * len(prefix)).join(lines)

    return show


class ConsoleOutbox:
    """Reminders printed into the terminal chat while it runs."""

    def __init__(self, write: Write, show: Show = as_written, *, model: bool = True) -> None:
        """Print through `write`, the Markdown shown by `show` (`model`: a model is there to say Done or Snooze to)."""
        self.write = write
        self.show = show
        self.hint = "(task #{id}: say 'done' or 'snooze' to me)" if model else "(task #{id}: /tasks lists what is open)"

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Print one reminder (the buttons become a hint)."""
        hint = "\n   " + self.hint.format(id=msg.task_id) if msg.buttons else ""  # a link notice: none
        self.write(f"\n{self.show('', msg.text)}{hint}\n{PROMPT}")
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


def render(event: Assistant | Error, settings: Settings, show: Show = as_written, prefix: str = "") -> str:
    """The answer (its Markdown shown by `show`), then a compact activity summary (or the error, with what to check
    about the configured model when it could not be used)."""
    if isinstance(event, Error):
        text = f"{prefix}⚠️  {event.message}"
        if event.code == "llm_unavailable":
            text += f" To fix: {fix_hint(settings)}."
        return text
    out = [show(prefix, event.text)]
    if event.steps:
        out.append("   " + summary_line(event.steps, event.elapsed_s))
        out.extend("   " + line for line in activity_lines(event.steps))
    return "\n".join(out)


async def ask_once(core: Core, text: str, *, fresh: bool = True) -> tuple[str, bool]:
    """`bot ask`: answer in the ask conversation, started afresh unless `fresh` is False (`--continue`), or a command of
    the catalogue without the model; Markdown rendered when standard output is a terminal, as written when it is not."""
    show = markdown_for(sys.stdout)
    typed = typed_command(text)  # a command of the catalogue is answered as the terminal chat answers it
    if typed is not None and typed.command is not None:  # in the ask conversation (/reset: the one --continue goes on)
        return await command(core, typed.command.name, typed.args, show, chat=ASK_CHAT), True
    if typed is not None:
        return typed.unknown(), False
    inc = console_incoming(text, ASK_CHAT)
    if fresh:
        await core.reset(inc)
    return await ask(core, inc, show)


async def ask(core: Core, inc: Incoming, show: Show = as_written, prefix: str = "") -> tuple[str, bool]:
    """Answer one message; returns the printed text and whether it was answered without error."""
    reply = ConsoleReply(core.settings, show, prefix)
    await core.answer(inc, reply)
    return reply.text, reply.ok


class ConsoleReply(QuietReply):
    """The reply port of one terminal message: the answer's text as it will be printed."""

    def __init__(self, settings: Settings, show: Show, prefix: str) -> None:
        """Render with `show` after `prefix` (nothing came: the prefix alone)."""
        self.settings, self.show, self.prefix = settings, show, prefix
        self.text, self.ok = prefix, True

    async def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """The answer with its activity."""
        self.text, self.ok = render(answer, self.settings, self.show, self.prefix), True
        yield 1

    async def error(self, error: Error) -> None:
        """The error line (with what to check about the model)."""
        self.text, self.ok = render(error, self.settings, self.show, self.prefix), False


async def command(
    core: Core, name: CommandName, arg: str, show: Show = as_written, prefix: str = "", *, chat: str = CHAT
) -> str:
    """A command of the catalogue typed in the terminal chat (or `bot ask`'s, `chat`), answered without the LLM; a
    confirmation or a choice as its text, which says what to type (`bot ask` cannot ask for a number)."""
    said, _ = await answered(core, console_incoming(f"/{name} {arg}", chat), name, arg.strip(), show, prefix)
    return said


async def answered(
    core: Core, inc: Incoming, name: CommandName, args: CommandArgs | str, show: Show, prefix: str
) -> tuple[str, Choices]:
    """A command's answer as printed, and the buttons of a confirmation or a choice under it (the chat numbers them;
    /remind's Undo is not one: its text stays as it is, as a file's or a refusal's)."""
    answer = await core.command(inc, name, args, must_answer=True)
    if isinstance(answer, FileAnswer):
        path = save_file(core.settings.DATA_DIR / EXPORTS, answer)
        return show(prefix, f"{answer.text}\n\nSaved to `{path}`."), ()
    if isinstance(answer, Buttons):
        choices = tuple((b.label, b.press) for row in answer.rows for b in row if isinstance(b.press, Confirm))
        return show(prefix, answer.text), choices
    if isinstance(answer, Reminded):
        return show(prefix, answer.text), ()
    return render(answer, core.settings, show, prefix) if isinstance(answer, Error) else show(prefix, answer or ""), ()


def numbered(choices: Choices) -> str:
    """The buttons as the chat lists them under the answer (`1) Yes  2) No`), and how to press one ("": none)."""
    if not choices:
        return ""
    indent = " " * len(BOT)
    listed = "  ".join(f"{n}) {label}" for n, (label, _) in enumerate(choices, 1))
    return f"{indent}{listed}\n{indent}{PRESS_HOW}\n"


def pick(choices: Choices, typed: str) -> Confirm | None:
    """The press of the button whose number was typed (None: anything else)."""
    return {str(n): confirm for n, (_, confirm) in enumerate(choices, 1)}.get(typed)


async def press(core: Core, pressed: Confirm, show: Show = as_written) -> tuple[str, Choices]:
    """A button pressed by its number, as a press on Telegram: the command run again for the button's owner (only the
    terminal's user); its answer as printed, with the buttons of a confirmation or choice under it."""
    inc = console_incoming(f"/{pressed.command}")
    if pressed.owner != inc.user_id:
        return f"{BOT}{NOT_YOUR_PRESS}", ()
    return await answered(core, inc, pressed.command, pressed.args, show, BOT)


def save_file(folder: Path, answer: FileAnswer) -> Path:
    """Write a file answer (an export) into `folder`, readable by the local user only; returns its path."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / answer.filename
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(answer.data)
    return path.resolve()


async def readable(fd: int) -> bytes:
    """What `fd` has once it is readable (b"" at its end), waited for in the event loop: no thread is left blocked
    in a read when the loop ends (Ctrl-C then waited for Enter)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    try:
        loop.add_reader(fd, wake)
    except PermissionError:  # a regular file (stdin redirected from one) cannot be polled: reading it never waits
        return os.read(fd, READ_SIZE)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
    return os.read(fd, READ_SIZE)


async def stdin_lines() -> AsyncIterator[str]:
    """Lines typed in the terminal, each after the prompt; at the end of input the cursor goes to a new line."""
    fd = sys.stdin.fileno()
    pending, ended = b"", False
    while True:
        sys.stdout.write(PROMPT)
        sys.stdout.flush()
        while b"\n" not in pending and not ended:
            chunk = await readable(fd)
            pending, ended = pending + chunk, not chunk
        if not pending:
            sys.stdout.write("\n")
            return
        line, _, pending = pending.partition(b"\n")
        yield line.decode(errors="replace").rstrip("\r")


async def chat_loop(core: Core, lines: AsyncIterator[str], write: Write, show: Show = as_written) -> None:
    """The interactive terminal conversation: the commands of the catalogue (/help lists them) are answered without
    the LLM (a confirmation's or choice's buttons numbered, the next line pressing one by its number), other /words get
    a one-line hint, /quit (or end of input) leaves, anything else goes to the model."""
    write((NO_MODEL_BANNER if core.settings.model_off else BANNER) + "\n")
    choices: Choices = ()
    async for line in lines:
        text = line.strip()
        typed = typed_command(text)  # the catalogue's commands are found as the HTTP API finds them (core)
        if text.lower() in QUIT:
            return
        if choices:  # the line answers the buttons listed: a number presses one, anything else leaves it
            pressed, choices = pick(choices, text), ()
            if pressed is not None:
                said, choices = await press(core, pressed, show)
                write(f"{said}\n{numbered(choices)}")
                continue
            write(f"{BOT}{LEFT}\n")
            if typed is None:  # never sent to the model; a command typed instead still runs
                continue
        if typed is not None and typed.command is not None:
            inc = console_incoming(f"/{typed.command.name} {typed.args}")
            said, choices = await answered(core, inc, typed.command.name, typed.args.strip(), show, BOT)
            write(f"{said}\n{numbered(choices)}")
        elif typed is not None:
            write(f"{BOT}{typed.unknown()}\n")
        elif text:
            answer, _ = await ask(core, console_incoming(text), show, BOT)
            write(f"{answer}\n")
