"""The command catalogue every front end offers (COMMANDS: /help, Telegram's menu, Discord's slash commands, the
terminal chat and the HTTP API), in menu order; /mcp, /reset and /help, whose handlers are about the chat itself;
and how a typed message is found to be a command."""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.commands import account, memory, model, status, tasks
from core.commands.base import Ask, Command, Option
from core.mcp_servers import confirm as mcp_confirm
from core.mcp_servers.hub import MCP_ADMINS_ONLY

HELP_INTRO = (
    "I'm your personal assistant. Tell me what to remember or remind you of, in plain words — e.g. "
    "*remind me to call mum tomorrow at 18:00* or *every weekday at 8:00 remind me to stretch*."
)
RESET_DONE = "Fresh start — I've put our earlier conversation aside."
COMMAND_WORD = re.compile(r"/\w+")  # what a chat takes for a command: "/usr/bin/env is…" is a message
UNKNOWN_COMMAND = "Unknown command {word} — try /help."


async def mcp(ask: Ask) -> str:
    """/mcp: anyone connects or disconnects their own account at a per-person server, or allows a call parked for
    their OK; admins see the servers' state, reconnect one, or accept its new or changed tools."""
    core, inc = ask.core, ask.inc
    action = ask.get("action").lower()
    if action in ("connect", "disconnect"):  # anyone's own account at a per_person server
        user, _ = await ask.speaker()
        return await core.mcp.personal(
            action,
            ask.get("server"),
            account_id=user.account_id,
            identity=inc.user_key,
            is_admin=core.is_admin(inc),
            private=inc.chat_kind == "private",
            base_url=core.settings.public_base_url,
        )
    if action == "allow":  # anyone: a call waiting for their OK (core/mcp_servers/confirm.py)
        ref = ask.get("server")
        if not (ref.isdecimal() and len(ref) < 19):
            return mcp_confirm.USAGE
        return (await core.allow_mcp(inc, int(ref)))[1]
    if not core.is_admin(inc):
        return MCP_ADMINS_ONLY
    return await core.mcp.command(action, ask.get("server"))


async def reset(ask: Ask) -> str:
    """/reset: a fresh conversation in this chat (the old messages stay stored)."""
    await ask.core.reset(ask.inc)
    return RESET_DONE


async def help_text(ask: Ask) -> str:
    """/help (/start): what the bot does and the commands."""
    return HELP_NO_MODEL if ask.core.settings.model_off else HELP


MCP = Command(
    "mcp",
    "tool servers: connect your own account",
    "/mcp connect <server> sends you a link to connect your own account to a tool server, /mcp disconnect "
    "<server> forgets it, /mcp allow <id> runs a tool call you were asked about; admins: the MCP tool servers "
    "and their state, reconnect one, or accept its new or changed tools",
    mcp,
    (
        Option(
            "action",
            "show (default), connect, disconnect, allow, reconnect or accept",
            choices=("show", "connect", "disconnect", "allow", "reconnect", "accept"),
        ),
        Option("server", "the server's name in MCP_CONFIG (allow: the call's number)"),
    ),
    private=True,
    syntax="[connect|disconnect|reconnect|accept server | allow id]",
    reader=lambda text: dict(zip(("action", "server"), text.split(), strict=False)),
)
RESET = Command("reset", "start a fresh conversation", "start a fresh conversation", reset)
HELP_COMMAND = Command("help", "how to use me", "this help", help_text, aliases=("start",))

COMMANDS: tuple[Command, ...] = (
    tasks.REMIND,
    tasks.WATCH,
    tasks.TASKS,
    tasks.TIMEZONE,
    model.MODEL,
    model.VOICE,
    memory.MEMORY,
    account.EXPORT,
    account.FORGET_ME,
    account.LINK,
    account.UNLINK,
    account.TOKEN,
    account.WEB,
    account.USAGE,
    account.WHOAMI_COMMAND,
    account.BUDGET,
    RESET,
    MCP,
    status.STATUS,
    HELP_COMMAND,
)
COMMAND = {c.name: c for c in COMMANDS}
_BY_WORD = {f"/{n}": c for c in COMMANDS for n in (c.name, *c.aliases)}
HELP_COMMANDS = "\n\nCommands:\n" + "\n".join(f"/{c.name}{c.syntax and ' ' + c.syntax} — {c.help}" for c in COMMANDS)
HELP = HELP_INTRO + HELP_COMMANDS
HELP_NO_MODEL = (  # LLM_PROVIDER=none: plain words get no answer, the commands do
    "I'm your personal assistant, answering commands only here (this bot has no model) — e.g. "
    "*/remind tomorrow 9:00 Buy milk* or */remind every weekday 8:00 Stretch*." + HELP_COMMANDS
)


@dataclass(frozen=True)
class TypedCommand:
    """A /word a message starts with, as the text chats take it: the catalogue's command (None: not one of its) and
    the text after it."""

    word: str
    command: Command | None
    args: str

    def unknown(self) -> str:
        """What a chat answers a /word the catalogue does not have."""
        return UNKNOWN_COMMAND.format(word=self.word)


def typed_command(text: str) -> TypedCommand | None:
    """The command a typed message is (the terminal, the HTTP API), or None when it is a message for the model."""
    word, *rest = text.strip().split(None, 1) or [""]
    if not COMMAND_WORD.fullmatch(word):
        return None
    return TypedCommand(word, _BY_WORD.get(word.lower()), rest[0] if rest else "")
