"""The command catalogue every front end offers (COMMANDS: /help, Telegram's menu, Discord's slash commands, the
terminal chat), and the answers the core gives them without the LLM, as platform-neutral Markdown."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import Literal, Protocol
from zoneinfo import ZoneInfo

from core import accounts, api_tokens, web_signin
from core.agent.llm import LLM
from core.agent.providers import ModelChoice
from core.constants import ABANDONED_MARGIN, FLEET_SEEN_S, WEB_LINK_TTL
from core.mcp_servers.hub import Hub
from core.media import speaking
from core.media.audio import Audio
from core.memory.blocks import normalise_name
from core.memory.show_and_erase import Overview, Wiped, delete_memory_line, memory_overview, wipe_memory
from core.own_data import FileAnswer, Summary, export_account, forget_account, summary
from core.reminders import recurrence
from core.reminders.engine import Outbox
from core.reminders.messages import SUPERSEDED
from core.reminders.queries import replan_zones
from core.settings import Settings
from core.storage import conversations, dead_letters, fleet
from core.storage.db import Pool
from core.timeutil import Clock, fmt_local, system_clock, valid_zone, zone
from core.tools.framework import ToolError
from core.tools.tasks import open_tasks
from core.types import Incoming

HELP_INTRO = (
    "I'm your personal assistant. Tell me what to remember or remind you of, in plain words — e.g. "
    "*remind me to call mum tomorrow at 18:00* or *every weekday at 8:00 remind me to stretch*."
)
CommandName = Literal[
    "help",
    "remind",
    "tasks",
    "timezone",
    "status",
    "reset",
    "memory",
    "model",
    "export",
    "forget_me",
    "link",
    "unlink",
    "usage",
    "budget",
    "token",
    "web",
    "voice",
    "mcp",
]
CommandArgs = Mapping[str, str]


@dataclass(frozen=True)
class Option:
    """One argument of a command: Discord shows it as a slash-command option, the text chats take it by position."""

    name: str
    description: str
    kind: Literal["text", "integer", "flag"] = "text"
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Command:
    """One command the bot answers without the LLM, as every front end offers it."""

    name: CommandName
    summary: str  # the menu line (Telegram's command list, Discord's slash command)
    help: str  # what /help says it does
    options: tuple[Option, ...] = ()
    private: bool = False  # asked in a group, the answer goes to the speaker's private chat (it is personal)
    aliases: tuple[str, ...] = ()  # other names the text chats accept (Telegram's /start)
    syntax: str = ""  # what /help shows after the name, e.g. Area/City

    def parse(self, text: str) -> dict[str, str]:
        """The arguments typed after the command in a text chat, by option name."""
        if self.name == "memory":
            return _memory_args(text.split())
        if self.name == "budget":  # `/budget <platform:id> <tokens|off>` (core/usage.py)
            words = text.split()
            return {"identity": words[0], "tokens": words[1]} if len(words) == 2 else {}
        if self.name == "token":  # `/token`, `/token new <name>`, `/token revoke <name>` (core/api_tokens.py)
            return api_tokens.parse(text)
        if self.name == "mcp":  # `/mcp [reconnect|accept|connect|disconnect <server>]` (core/mcp_servers/hub.py)
            return dict(zip(("action", "server"), text.split(), strict=False))
        if self.name == "forget_me":  # `/forget_me confirm` deletes at once, like `/memory wipe confirm`
            return {"confirm": "true"} if text.strip().lower() == "confirm" else {}
        text = text.strip()
        return {self.options[0].name: text} if self.options and text else {}


def _memory_args(words: list[str]) -> dict[str, str]:
    """`/memory`, `/memory forget <block> <line>`, `/memory wipe [confirm]` as options (else action "invalid")."""
    action = words[0].lower() if words else "show"
    if action in ("forget", "delete") and len(words) >= 3 and words[-1].isdecimal():
        return {"action": "forget", "block": "_".join(words[1:-1]), "line": words[-1]}
    if action == "wipe" and len(words) <= 2:
        confirm = [w.lower() for w in words[1:]]
        if confirm in ([], ["confirm"]):
            return {"action": "wipe", "confirm": "true" if confirm else "false"}
    return {"action": "show" if not words else "invalid"}


COMMANDS: tuple[Command, ...] = (
    Command(
        "remind",
        "a reminder at a time you say, e.g. /remind tomorrow 9:00 Buy milk",
        "a reminder at once, no model asked: /remind in 10 minutes Tea, /remind friday 18:30 Call mum, "
        "/remind every weekday 7:30 Stretch (in your time zone; Undo takes it back)",
        (
            Option("when", "When, in your words: in 10 minutes, tomorrow 9:00, every weekday 7:30"),
            Option("what", "What to remind you of"),
        ),
        syntax="<when> <what>",
    ),
    Command("tasks", "your open tasks", "your open tasks", private=True),
    Command(
        "timezone",
        "show or set your time zone",
        "show or set your time zone",
        (Option("zone", "An IANA time zone such as Europe/Berlin (leave empty to see yours)"),),
        private=True,
        syntax="Area/City",
    ),
    Command(
        "model",
        "show or switch the model that answers you",
        "show the model that answers you and the ones on offer; /model <name> switches to one",
        (Option("name", "The model to switch to (leave empty to see the ones on offer)"),),
        private=True,
        syntax="[name]",
    ),
    Command(
        "voice",
        "answer your voice notes with a voice note too",
        "show or switch voice answers: /voice on answers each voice note you send with a voice note too (and in "
        "writing), /voice off stops it",
        (Option("state", "on or off (leave empty to see yours)", choices=("on", "off")),),
        private=True,
        syntax="[on|off]",
    ),
    Command(
        "memory",
        "what I remember about you (forget a line, wipe)",
        "what I remember about you; /memory forget human 2 deletes line 2 of [human], "
        "/memory wipe erases all of it (after a confirmation)",
        (
            Option(
                "action",
                "show (default), forget one line, or wipe everything (asks to confirm)",
                choices=("show", "forget", "wipe"),
            ),
            Option("block", "forget: the block, e.g. human"),
            Option("line", "forget: the line number shown by /memory", kind="integer"),
            Option("confirm", "wipe: True erases at once, without asking", kind="flag"),
        ),
        private=True,
    ),
    Command(
        "export", "a file of everything I keep about you", "a JSON file of everything I keep about you", private=True
    ),
    Command(
        "forget_me",
        "delete everything I keep about you",
        "delete your account and everything I keep about you, on every platform you linked (after a confirmation)",
        (Option("confirm", "True deletes at once, without asking", kind="flag"),),
        private=True,
    ),
    Command(
        "link",
        "link your accounts on other platforms into one",
        "in a private chat: a one-time code (and the identities linked now); /link CODE, sent from your account on "
        "another platform, makes the two one account",
        (Option("code", "The code /link gave your other account (leave empty to get a code here)"),),
        syntax="[CODE]",
    ),
    Command(
        "unlink",
        "separate a linked identity again",
        "separate one identity (platform:id, as /link lists it) from your account again",
        (Option("identity", "platform:id as /link lists it, e.g. discord:123456"),),
        syntax="platform:id",
    ),
    Command(
        "token",
        "your API tokens: list, make or revoke one",
        "in a private chat: your API tokens; /token new <name> makes one (shown once), /token revoke <name> "
        "revokes one",
        (
            Option("action", "list (default), new (shows the token once) or revoke", choices=("list", "new", "revoke")),
            Option("name", "new, revoke: the token's name, e.g. laptop"),
        ),
        syntax="[new|revoke name]",
    ),
    Command(
        "web",
        "a sign-in link for the web chat",
        "in a private chat: a one-time link that signs you in to the web chat (expires in "
        f"{WEB_LINK_TTL.seconds // 60} minutes, works once)",
    ),
    Command(
        "usage",
        "your model tokens today and this month",
        "the model tokens you used today and this month (per model), and the budget you have left",
        private=True,
    ),
    Command(
        "budget",
        "admins: set a person's daily token budget",
        "admins only: a person's daily token budget (off: the default again)",
        (
            Option("identity", "platform:id of the person, e.g. telegram:123456"),
            Option("tokens", "tokens per day, or off for the default"),
        ),
        private=True,
        syntax="platform:id tokens|off",
    ),
    Command("reset", "start a fresh conversation", "start a fresh conversation"),
    Command(
        "mcp",
        "tool servers: connect your own account",
        "/mcp connect <server> sends you a link to connect your own account to a tool server, /mcp disconnect "
        "<server> forgets it, /mcp allow <id> runs a tool call you were asked about; admins: the MCP tool servers "
        "and their state, reconnect one, or accept its new or changed tools",
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
    ),
    Command("status", "how the bot is doing", "how the bot is doing", private=True),
    Command("help", "how to use me", "this help", aliases=("start",)),
)
COMMAND = {c.name: c for c in COMMANDS}
COMMAND_WORD = re.compile(r"/\w+")  # what a chat takes for a command: "/usr/bin/env is…" is a message
UNKNOWN_COMMAND = "Unknown command {word} — try /help."
_BY_WORD = {f"/{n}": c for c in COMMANDS for n in (c.name, *c.aliases)}


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


HELP_COMMANDS = "\n\nCommands:\n" + "\n".join(f"/{c.name}{c.syntax and ' ' + c.syntax} — {c.help}" for c in COMMANDS)
HELP = HELP_INTRO + HELP_COMMANDS
HELP_NO_MODEL = (  # LLM_PROVIDER=none: plain words get no answer, the commands do
    "I'm your personal assistant, answering commands only here (this bot has no model) — e.g. "
    "*/remind tomorrow 9:00 Buy milk* or */remind every weekday 8:00 Stretch*." + HELP_COMMANDS
)
NO_MODEL_STATUS = "none, commands only (LLM_PROVIDER=none)"
RESET_DONE = "Fresh start — I've put our earlier conversation aside."
STEPS_GONE = "I no longer have the steps of that answer (it was deleted)."
STEPS_NOT_YOURS = "Only the person who asked can see the steps of this answer."
MEMORY_HOW = (
    "To delete a line: /memory forget <block> <line>, e.g. /memory forget human 2. "
    "To erase everything I remember about you: /memory wipe."
)
MEMORY_WIPE_CONFIRM: CommandArgs = {"action": "wipe", "confirm": "true"}  # what a confirmation button sends
MEMORY_USAGE = "Use /memory, /memory forget <block> <line> (e.g. /memory forget human 2) or /memory wipe."
MEMORY_WIPE_ASK = "This erases everything I remember about you: {lines} and {archival}{files}. It cannot be undone. "
MEMORY_WIPE_HOW = {  # how to confirm, per platform (the chat adapters put a button under the question)
    "telegram": "To go ahead, press the button below or send /memory wipe confirm.",
    "discord": "To go ahead, press the button below or use /memory action:wipe confirm:True.",
    "api": "To go ahead, send /memory wipe confirm (or POST /v1/memory/wipe).",
}
MEMORY_WIPED = (
    "Done — I erased {lines} and {archival}{files}. Our conversation history is not memory and stays as it is."
)
FORGET_ME_CONFIRM: CommandArgs = {"confirm": "true"}  # what the /forget_me confirmation button sends
FORGET_ME_ASK = (
    "This deletes your account and everything I keep about you: {what}. Every identity goes with it ({identities}), "
    "so I will greet you as someone new. It cannot be undone; /export first if you want a copy. "
)
FORGET_ME_HOW = {  # how to confirm, per platform (the chat adapters put a button under the question)
    "telegram": "To go ahead, press the button below or send /forget_me confirm.",
    "discord": "To go ahead, press the button below or use /forget_me confirm:True.",
}
FORGOTTEN = "Done — I deleted your account and everything in it: {what}. If you write to me again, I start afresh."
NOTHING_TO_FORGET = "I keep nothing about you (any more)."
EXPORT_TEXT = "Everything I keep about you, as JSON: {what}."


MODEL_FIXED = "Answers come from **{model}**; this bot offers no other models (its operator lists them in LLM_MODELS)."
MODEL_HOW = {  # how to switch, per platform (the chat adapters put a button per model under the list)
    "telegram": "Press a button below, or send /model <name>, e.g. /model {example}.",
    "discord": "Press a button below, or use /model name:{example}.",
}
MODEL_NOT_OFFERED = "`{name}` is not a model on offer here; choose one of: {names}."
MODEL_SWITCHED = "Done — **{name}** answers you from now on, on every platform you linked."
MODEL_STALE = "That button is out of date (the models on offer changed): send /model to see them."
MODEL_NOT_YOURS = "This button is not for you: /model shows your own choice of models."


def model_token(index: int, choice: ModelChoice) -> str:
    """What a model button carries: the choice's place in the list and a check of its name (`3:1a2b3c4d`), so a
    press after the operator changed LLM_MODELS never picks another model than the one shown."""
    return f"{index}:{hashlib.sha256(choice.name.encode()).hexdigest()[:8]}"


def model_by_token(choices: tuple[ModelChoice, ...], token: str) -> ModelChoice | None:
    """The choice a button names (None: out of range, or the list changed since it was shown)."""
    index, _, _ = token.partition(":")
    if not index.isdecimal() or int(index) >= len(choices):
        return None
    choice = choices[int(index)]
    return choice if model_token(int(index), choice) == token else None


def model_by_name(choices: tuple[ModelChoice, ...], name: str) -> ModelChoice | None:
    """The choice typed after /model: its name in any case, or its model alone when only one choice has it."""
    wanted = name.strip().lower()
    by_name = [c for c in choices if c.name.lower() == wanted]
    by_model = [c for c in choices if c.model.lower() == wanted]
    return by_name[0] if by_name else by_model[0] if len(by_model) == 1 else None


def chosen_model(choices: tuple[ModelChoice, ...], stored: str | None) -> ModelChoice | None:
    """An account's stored choice among those on offer (None: the default, or a name no longer offered)."""
    return next((c for c in choices if c.name == stored), None)


class CoreParts(Protocol):
    """What the command answers read from the core (it builds them; they never import it)."""

    settings: Settings
    pool: Pool
    llm: LLM
    models: tuple[ModelChoice, ...]  # the models people may pick, the default first
    clock: Clock
    task_listeners: list[Callable[[], None]]
    outboxes: dict[str, Outbox]  # the running front ends' (Core.running): messages without a user message
    mcp: Hub  # the MCP tool servers (their state for /status)
    web_url: str | None  # where this process serves the web page on this machine (None: it does not)


def app_version() -> str:
    """The installed version of the bot."""
    try:
        return version("assistant-bot")
    except PackageNotFoundError:
        return "dev"


@dataclass
class StatusBoard:
    """Facts for /status that adapters and the scheduler report into."""

    started_monotonic: float = field(default_factory=time.monotonic)
    adapters: dict[str, str] = field(default_factory=dict)  # name → state
    disconnected: set[str] = field(default_factory=set)  # adapters whose platform connection is down now
    last_poll: dict[str, datetime] = field(default_factory=dict)  # adapter → last successful poll (UTC)
    failed_deliveries: int = 0
    process_id: str | None = None  # this process's id in the fleet while it beats (core/storage/fleet.py)


def _uptime(seconds: float) -> str:
    """`2 d 3 h`, `3 h 12 min` or `45 s`."""
    s = int(seconds)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d} d {h} h"
    if h:
        return f"{h} h {m} min"
    return f"{m} min {sec} s" if m else f"{sec} s"


def _files(held: Wiped | Overview) -> str:
    """`, plus the 3 files you sent` (nothing when there are none): a wipe takes the kept files too."""
    return f", plus {_count(held.files, 'file')} you sent" if held.files else ""


def _count(n: int, noun: str) -> str:
    """`1 line`, `3 lines`, `2 archival entries`."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") else f"{n} {noun}s"


def _held(held: Summary) -> str:
    """`1 identity, 12 stored messages, 2 tasks, 3 memory lines and 1 archival note`."""
    parts = [
        _count(len(held.identities), "identity"),
        _count(held.messages, "stored message"),
        _count(held.tasks, "task"),
        _count(held.lines, "memory line"),
    ]
    return ", ".join(parts) + " and " + _count(held.archival, "archival note")


class Commands:
    """The command answers; they need the database, never the LLM."""

    def __init__(self, core: CoreParts) -> None:
        """Bind to the core whose data they show."""
        self.core = core

    async def tasks(self, inc: Incoming) -> str:
        """The speaking user's open tasks with local due times."""
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        rows = await open_tasks(self.core.pool, user.account_id)
        tz, now = zone(user.timezone), self.core.clock()
        skipped = await self.core.pool.fetch(
            "SELECT t.id, t.title, o.scheduled_at FROM occurrences o JOIN tasks t ON t.id = o.task_id"
            " WHERE t.user_id = $1 AND o.status = 'skipped' AND o.scheduled_at > $2 AND o.error IS DISTINCT FROM $3"
            " ORDER BY o.scheduled_at",
            user.account_id,
            now - timedelta(days=7),
            SUPERSEDED,
        )
        notes = [f"- #{r['id']} {r['title']} — was due {fmt_local(r['scheduled_at'], tz, now)}" for r in skipped]
        skipped_text = "\n\n**Missed while I was offline** (not sent):\n" + "\n".join(notes) if notes else ""
        skipped_text += await self._not_delivered(user.account_id, tz, now)
        if not rows:
            return "You have no open tasks. Tell me what to remember!" + skipped_text
        lines = [f"**Your open tasks** ({tz.key}):"]
        for r in rows:
            line = f"- #{r['id']} {r['title']}"
            if r["due_at"] is not None:
                line += f" — {fmt_local(r['due_at'], tz, now)}"
                if r["due_at"] < now:
                    line += " ⚠️ overdue"
            rec = recurrence.from_json(r["recurrence"])
            if rec is not None:
                line += f" 🔁 {recurrence.describe(rec)}"
            lines.append(line)
        return "\n".join(lines) + skipped_text

    async def _not_delivered(self, user_id: int, tz: ZoneInfo, now: datetime) -> str:
        """Reminders of the last 7 days that failed (with the reason) or are still being retried."""
        rows = await self.core.pool.fetch(
            "SELECT t.id, t.title, o.scheduled_at, o.status, o.error, o.lease_until FROM occurrences o"
            " JOIN tasks t ON t.id = o.task_id WHERE t.user_id = $1 AND o.scheduled_at > $2"
            " AND (o.status = 'failed' OR (o.status = 'claimed' AND o.error IS NOT NULL"
            "      AND t.due_at = o.scheduled_at AND t.status IN ('pending', 'in_progress')))"  # not done/snoozed since
            " ORDER BY o.scheduled_at",
            user_id,
            now - timedelta(days=7),
        )
        failed = [r for r in rows if r["status"] == "failed"]
        retrying = [r for r in rows if r["status"] == "claimed"]
        out = ""
        if failed:
            out += "\n\n**Reminders that could not be delivered:**\n" + "\n".join(
                f"- #{r['id']} {r['title']} — was due {fmt_local(r['scheduled_at'], tz, now)}: {r['error']}"
                for r in failed
            )
        if retrying:
            out += "\n\n**Reminders not sent yet** (retrying):\n" + "\n".join(
                f"- #{r['id']} {r['title']} — was due {fmt_local(r['scheduled_at'], tz, now)}, next try "
                f"{fmt_local(r['lease_until'], tz, now)}: {r['error']}"
                for r in retrying
            )
        return out

    async def link(self, inc: Incoming, code: str) -> str:
        """/link: a new one-time code and the identities linked now; /link CODE: this account joins the code's (whose
        identity is told in the chat where it asked). Only in a private chat: a code is never shown in a group."""
        if inc.chat_kind != "private":
            retired = code.strip() and await accounts.retire(self.core.pool, code)
            return accounts.ONLY_IN_PRIVATE.format(command="/link") + (accounts.RETIRED if retired else "")
        core, words = self.core, self.core.settings.MEMORY_BLOCK_WORDS
        user, chat = await conversations.identify(core.pool, inc, core.settings.DEFAULT_TIMEZONE)
        now = core.clock()
        if not code.strip():
            made = await accounts.issue(core.pool, user, chat, now)
            return accounts.code_text(made, await accounts.identities(core.pool, user.account_id), user)
        busy = timedelta(seconds=core.settings.AGENT_TOTAL_TIMEOUT) + ABANDONED_MARGIN  # a turn still running
        linked = await accounts.redeem(core.pool, user, code, now, block_words=words, busy_within=busy)
        if isinstance(linked, str):
            return linked
        if await replan_zones(core.pool, now, core.settings.DEFAULT_TIMEZONE, linked.account_id):
            for listener in core.task_listeners:  # moved tasks repeat in the kept time zone now
                listener()
        await accounts.tell(core.outboxes, linked.told_in, linked.issuer, linked.notice(words), now)
        return linked.answer(words)

    async def token(self, inc: Incoming, options: CommandArgs) -> str:
        """/token: the speaker's account's API tokens, a new one (its secret shown once) or a revocation; only in a
        private chat, so a secret is never shown in a group."""
        if inc.chat_kind != "private":
            return accounts.ONLY_IN_PRIVATE.format(command="/token")
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        return await api_tokens.answer(self.core.pool, user, dict(options), self.core.clock())

    async def web(self, inc: Incoming) -> str:
        """/web: a one-time link signing the speaker in to the web chat (core/web_signin.py); only in a private chat,
        so the link is never shown in a group. The terminal's user, at this machine, gets the local page's address
        when no public one is set (or how to serve it)."""
        if inc.chat_kind != "private":
            return accounts.ONLY_IN_PRIVATE.format(command="/web")
        base = self.core.settings.public_base_url
        if base is None and inc.platform == "console":
            base = self.core.web_url
            if base is None:
                return web_signin.NOT_SERVED
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        return await web_signin.answer(self.core.pool, user, base, self.core.clock())

    async def unlink(self, inc: Incoming, identity: str) -> str:
        """/unlink platform:id: that identity leaves the speaker's account for an empty one of its own."""
        if inc.chat_kind != "private":
            return accounts.ONLY_IN_PRIVATE.format(command="/unlink")
        if not identity.strip():
            return accounts.UNLINK_USAGE
        user, chat = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        busy = timedelta(seconds=self.core.settings.AGENT_TOTAL_TIMEOUT) + ABANDONED_MARGIN  # a turn still running
        return await accounts.unlink(
            self.core.pool, user, identity, here=chat.id, now=self.core.clock(), busy_within=busy
        )

    async def timezone(self, inc: Incoming, arg: str) -> str:
        """Show the user's time zone, or set it when `arg` names one."""
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        now = self.core.clock()
        if not arg.strip():
            return (
                f"Your time zone is **{user.timezone}** (now {fmt_local(now, zone(user.timezone), now)}). "
                "Change it with /timezone Area/City, e.g. /timezone Europe/Berlin."
            )
        name = valid_zone(arg)
        if name is None:
            return f"`{arg.strip()[:60]}` is not a time zone I know. Use an IANA name like Europe/Berlin."
        await conversations.set_timezone(self.core.pool, user, name)
        if await replan_zones(self.core.pool, now, self.core.settings.DEFAULT_TIMEZONE, user.account_id):
            for listener in self.core.task_listeners:  # the scheduler plans the moved times
                listener()
        return f"Time zone set to **{name}** — it is {fmt_local(now, zone(name), now)} there."

    async def voice(self, inc: Incoming, state: str, audio: Audio) -> str:
        """/voice: whether the speaker's voice notes are answered aloud too; /voice on|off switches (core/media)."""
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        return await speaking.answer(self.core.pool, audio, inc, user.account_id, state)

    async def memory(self, inc: Incoming, args: CommandArgs) -> str:
        """/memory: the speaker's memory with line numbers; forget one line; wipe (asks first unless confirmed)."""
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        action = args.get("action", "show")
        if action == "show":
            overview = await memory_overview(self.core.pool, user.account_id)
            text = overview.text(self.core.settings.MEMORY_BLOCK_WORDS)
            return f"**What I remember about you**\n```\n{text}\n```\n{MEMORY_HOW}"
        if action == "forget" and args.get("block") and (args.get("line") or "").isdecimal():
            block = args["block"].strip().lower().replace(" ", "_")
            try:
                number = int(args["line"])  # ValueError past Python's digit limit
                gone = await delete_memory_line(self.core.pool, user.account_id, block, number)
            except ValueError:
                return MEMORY_USAGE
            except ToolError as e:
                return str(e)
            return f"Forgot line {number} of [{normalise_name(block)}]: “{gone}”."
        if action == "wipe" and args.get("confirm") == "true":
            wiped = await wipe_memory(self.core.pool, user.account_id)
            return MEMORY_WIPED.format(
                lines=_count(wiped.lines, "line"),
                archival=_count(wiped.archival, "archival entry"),
                files=_files(wiped),
            )
        if action == "wipe":
            overview = await memory_overview(self.core.pool, user.account_id)
            lines = sum(len(block.lines) for block in overview.blocks)
            how = MEMORY_WIPE_HOW.get(inc.chat_platform, "To go ahead, send /memory wipe confirm.")
            counts = {
                "lines": _count(lines, "line"),
                "archival": _count(overview.archival, "archival entry"),
                "files": _files(overview),
            }
            return MEMORY_WIPE_ASK.format(**counts) + how
        return MEMORY_USAGE

    async def model(self, inc: Incoming, args: CommandArgs) -> str:
        """/model: the speaker's model and the ones on offer; switch by name (typed) or by choice (a button)."""
        choices = self.core.models
        if self.core.settings.model_off:
            return f"Model: {NO_MODEL_STATUS}."
        if len(choices) < 2:
            return MODEL_FIXED.format(model=choices[0].name)
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        if args.get("choice") or args.get("name"):
            token, name = args.get("choice", ""), args.get("name", "")
            pick = model_by_token(choices, token) if token else model_by_name(choices, name)
            if pick is None and token:
                return MODEL_STALE
            if pick is None:
                return MODEL_NOT_OFFERED.format(name=name.strip()[:60], names=", ".join(c.name for c in choices))
            await conversations.set_model(self.core.pool, user, None if pick == choices[0] else pick.name)
            return MODEL_SWITCHED.format(name=pick.name)
        chosen = chosen_model(choices, user.model)
        current = chosen or choices[0]
        lines = [f"Your model: **{current.name}**" + (" (the default)." if current == choices[0] else ".")]
        if user.model is not None and chosen is None:
            lines.append(f"You picked {user.model[:60]}, which is no longer on offer, so the default answers you.")
        lines.append("On offer:")
        for choice in choices:
            notes = [n for n, on in (("the default", choice == choices[0]), ("yours", choice == current)) if on]
            lines.append(f"- `{choice.name}`" + (f" ({', '.join(notes)})" if notes else ""))
        example = next(c.name for c in choices if c != current)
        how = MODEL_HOW.get(inc.chat_platform, "Switch with /model <name>, e.g. /model {example}.")
        return "\n".join([*lines, how.format(example=example)])

    async def _your_model(self, inc: Incoming) -> str:
        """The /status line of the asker's model."""
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        choice = chosen_model(self.core.models, user.model)
        if choice is not None and choice != self.core.models[0]:
            return f"- your model: {choice.name}"
        gone = f" ({user.model[:60]} is no longer on offer)" if user.model is not None else ""
        return f"- your model: {self.core.models[0].name}, the default{gone}"

    async def export(self, inc: Incoming) -> FileAnswer:
        """/export: everything the bot keeps about the speaker's account, as a JSON file."""
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        held = await summary(self.core.pool, user.account_id)
        filename, data = await export_account(self.core.pool, user.account_id, self.core.clock())
        return FileAnswer(EXPORT_TEXT.format(what=_held(held)), filename, data)

    async def forget_me(self, inc: Incoming, args: CommandArgs) -> str:
        """/forget_me: what deleting the speaker's account would delete (a confirmation asks for it), or, confirmed,
        delete it: the confirmed path looks the identity up without storing anything, so nothing of it comes back."""
        if args.get("confirm") == "true":
            chat = inc.chat_id if inc.chat_kind == "private" else None
            gone = await forget_account(self.core.pool, inc.platform, inc.user_id, chat)
            if gone is None:
                return NOTHING_TO_FORGET
            for listener in self.core.task_listeners:  # the scheduler drops the deleted tasks' reminders
                listener()
            return FORGOTTEN.format(what=_held(gone))
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        held = await summary(self.core.pool, user.account_id)
        how = FORGET_ME_HOW.get(inc.chat_platform, "To go ahead, send /forget_me confirm.")
        return FORGET_ME_ASK.format(what=_held(held), identities=", ".join(held.identities)) + how

    async def status(self, board: StatusBoard, inc: Incoming | None = None, admin: Sequence[str] = ()) -> str:
        """Version, uptime, model (and the asker's), adapters, last successful polls, pending reminders, the lines
        only admins see (the bot's spend today, dead letters), then the fleet."""
        pending = await self.core.pool.fetchval(
            "SELECT count(*) FROM tasks WHERE status IN ('pending', 'in_progress') AND due_at IS NOT NULL"
        )
        failed, retrying = await self._delivery_counts()
        now = system_clock()
        lines = [
            f"**Status** — version {app_version()}",
            f"- uptime: {_uptime(time.monotonic() - board.started_monotonic)}",
            f"- model: {NO_MODEL_STATUS if self.core.settings.model_off else self.core.llm.model}",
            *([await self._your_model(inc)] if inc is not None and not self.core.settings.model_off else []),
            "- adapters: " + (", ".join(f"{k} ({v})" for k, v in board.adapters.items()) or "none"),
        ]
        for name, when in board.last_poll.items():
            lines.append(f"- last successful {name} poll: {int((now - when).total_seconds())} s ago")
        lines.append(f"- pending reminders: {pending}")
        lines += [f"- MCP {line}" for line in self.core.mcp.lines()]
        if retrying:
            lines.append(f"- reminders being retried: {retrying}")
        if failed or board.failed_deliveries:
            lines.append(
                f"- failed reminder deliveries (7 days): {failed}"
                + (f" ({board.failed_deliveries} since this start)" if board.failed_deliveries else "")
            )
        lines += admin
        lines += await self._fleet(board.process_id)
        return "\n".join(lines)

    async def _fleet(self, me: str | None) -> list[str]:
        """This process's id and the processes seen in the last minute (nothing while no process beats)."""
        procs = await fleet.seen(self.core.pool, timedelta(seconds=FLEET_SEEN_S))
        if [p.id for p in procs] == [me]:
            return [f"- this process: `{me}`, the only one seen in the last minute"]
        lines = [f"- this process: `{me}`"] if me else []
        if procs or me:
            n = f"{len(procs)} process" + ("" if len(procs) == 1 else "es")
            lines.append(f"- fleet: {n} seen in the last minute" + (":" if procs else ""))
        for p in procs:
            mark = " (this one)" if p.id == me else ""
            adapters = ", ".join(p.adapters) or "no adapters"
            lines.append(f"  - `{p.id}`{mark}: {adapters} · version {p.version} · seen {round(p.seen_s_ago)} s ago")
        return lines

    async def _delivery_counts(self) -> tuple[int, int]:
        """Reminder occurrences failed in the last 7 days, and ones waiting for a retry (from the database)."""
        row = await self.core.pool.fetchrow(
            "SELECT (SELECT count(*) FROM occurrences WHERE status = 'failed' AND scheduled_at > $1) AS failed,"
            " (SELECT count(*) FROM occurrences o JOIN tasks t ON t.id = o.task_id WHERE o.status = 'claimed'"
            "  AND o.error IS NOT NULL AND t.due_at = o.scheduled_at AND t.status IN ('pending', 'in_progress'))"
            " AS retrying",
            self.core.clock() - timedelta(days=7),
        )
        assert row is not None
        return int(row["failed"]), int(row["retrying"])


async def dead_letter_lines(pool: Pool) -> list[str]:
    """The admins' /status line about updates kept as dead letters (none when there are none)."""
    kept = await dead_letters.summary(pool)
    if not kept.count or kept.newest_at is None:
        return []
    ago = _uptime((system_clock() - kept.newest_at).total_seconds())
    return [
        f"- dead letters (updates that could not be stored or read): {kept.count}, newest {ago} ago: "
        f"{kept.newest_reason}"
    ]
