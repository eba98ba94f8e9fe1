"""What the HTTP front end calls (adapters/http): whom a request acts as, the account's sessions, an answer run as a
live feed that outlives its request, the account's tasks and memory by the chats' own commands, and the outbox that
delivers reminders into a session. A caller acts exactly as its identity in a private chat: `Incoming.via` = "api"
makes the session the chat while the identity (its rights, account, memory, budget, model) stays its own."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from core.accounts import web_signin
from core.accounts.api_tokens import Bearer
from core.accounts.own_data import FileAnswer
from core.accounts.web_signin import WebLogin
from core.api import sessions
from core.api.feed import Feed, FeedReply, Feeds
from core.api.parts import REMINDER_PREFIX, REPLY, Button, Message, Page, Session, message_key
from core.buttons import Button as Choice
from core.buttons import Buttons, Confirm, unpack
from core.commands import CommandArgs, CommandName, TypedCommand, typed_command
from core.memory.blocks import DESCRIPTIONS
from core.memory.show_and_erase import memory_overview
from core.remind import Reminded
from core.reminders import recurrence
from core.reminders.buttons import UNDO
from core.reminders.engine import DeliveryRefused
from core.reminders.messages import ReminderMessage
from core.storage import conversations
from core.texts import FAILED, NOT_YOUR_PRESS
from core.textsafe import strip_nul
from core.timeutil import zone
from core.tools.tasks import open_tasks
from core.types import API, Assistant, AssistantDelta, Error, Incoming, Upload

if TYPE_CHECKING:
    from core.front_door import Core

log = logging.getLogger(__name__)

HOME = "home:"  # the chat id of an identity's API commands made outside any session (/v1/tasks, /v1/memory)
UNKNOWN_MODEL = "Unknown model `{name}`: pick one of {names}."
SESSION_GONE = "the session was deleted"
FILE_ELSEWHERE = "The file itself comes only in a chat with the bot (Telegram, Discord or the terminal)."


@dataclass(frozen=True)
class OpenTask:
    """One open task as GET /v1/tasks lists it: its next time in UTC and in the person's zone."""

    id: int
    title: str
    state: Literal["pending", "in_progress"]
    kind: Literal["reminder", "agent"]  # fixed text, or a job the model runs
    due_at: datetime | None
    due_local: datetime | None
    recurrence: str | None  # as /tasks says it, e.g. `every mon-fri at 08:00`
    overdue: bool


@dataclass(frozen=True)
class TaskList:
    """The person's open tasks: /tasks's Markdown, their time zone and the tasks."""

    text: str
    timezone: str
    tasks: tuple[OpenTask, ...]


@dataclass(frozen=True)
class MemoryBlock:
    """One core memory block: its lines (numbered from 1, as /memory forget takes them) and its words."""

    name: str
    description: str
    lines: tuple[str, ...]
    words: int


@dataclass(frozen=True)
class MemoryView:
    """What the bot remembers about the person: /memory's Markdown, the blocks and what else it keeps."""

    text: str
    blocks: tuple[MemoryBlock, ...]
    word_limit: int
    archival: int
    files: int


class Api:
    """The sessions API of one process: its live feeds, and the core it runs turns on."""

    def __init__(self, core: Core) -> None:
        """Serve `core`'s turns to HTTP clients."""
        self.core = core
        self.feeds = Feeds()
        self._running: set[asyncio.Task[None]] = set()

    async def caller(self, secret: str, session_id: str | None = None) -> tuple[Bearer, Session | None] | None:
        """Whom a bearer token acts as (None: wrong or revoked) and, in the same round trip, the account's session
        `session_id` when one is named (None: not theirs, or none such)."""
        return await sessions.caller(self.core.pool, secret, self.core.clock(), session_id)

    # ---- the web page's sign-in (core/accounts/web_signin.py) -------------------------------------------------------

    async def web_caller(self, secret: str) -> tuple[Bearer, str] | None:
        """Whom a web sign-in's cookie secret acts as, with its CSRF token (None: unknown, expired or signed out)."""
        return await web_signin.authenticate(self.core.pool, secret, self.core.clock())

    async def redeem_link(self, code: str) -> WebLogin | None:
        """The web sign-in a /web link's code makes, once (None: a wrong, used or expired code)."""
        return await web_signin.redeem(self.core.pool, code, self.core.clock())

    async def sign_out(self, secret: str) -> None:
        """End the web sign-in of this cookie's secret."""
        await web_signin.sign_out(self.core.pool, secret, self.core.clock())

    @staticmethod
    def csrf_matches(expected: str, presented: str | None) -> bool:
        """Whether a request carries the sign-in's CSRF token (constant time)."""
        return web_signin.csrf_matches(expected, presented)

    def refusal(self, who: Bearer) -> str | None:
        """Why this identity may not use the bot (no longer in ALLOWED_USERS), or None."""
        inc = self._incoming(who, HOME, "")
        return None if self.core.is_allowed(inc) else self.core.refusal_text(inc)

    def models(self) -> tuple[str, ...]:
        """The models a message may ask for (LLM_MODELS; the default first)."""
        return tuple(c.name for c in self.core.models)

    def model_problem(self, name: str | None) -> str | None:
        """Why a message's `model` cannot be used (None: it can, or none was asked for)."""
        names = self.models()
        if name is None or name in names:
            return None
        return UNKNOWN_MODEL.format(name=name, names=", ".join(f"`{n}`" for n in names))

    @staticmethod
    def _incoming(
        who: Bearer, chat: str, text: str, *, message_id: str | None = None, model: str | None = None, title: str = ""
    ) -> Incoming:
        """A message of `who` carried by the API into the chat `chat` (a session, or the identity's home)."""
        return Incoming(
            platform=who.platform,
            user_id=who.platform_user_id,
            chat_id=chat,
            text=text,
            user_name=who.display_name,
            chat_title=title,
            message_id=message_id,
            via=API,
            model=model,
        )

    # ---- sessions ---------------------------------------------------------------------------------------------------

    async def sessions(self, who: Bearer, limit: int) -> list[Session]:
        """The account's sessions, most recently used first."""
        return await sessions.listed(self.core.pool, who.account_id, limit)

    async def new_session(self, who: Bearer, title: str | None) -> Session:
        """A new session of the caller's identity."""
        made = await sessions.create(self.core.pool, who.identity_id, title)
        assert made is not None  # a fresh random id
        return made

    async def client_session(self, who: Bearer, client_key: str, title: str | None) -> Session:
        """The session that stands for a client's own conversation (Open WebUI's chat id), made on first use."""
        session_id = sessions.client_session_id(who.identity_id, client_key)
        found = await self.session(who, session_id)
        if found is None:  # made now, or by a request of the same chat that just won the race
            found = await sessions.create(self.core.pool, who.identity_id, title, session_id)
            found = found or await self.session(who, session_id)
        assert found is not None  # the id is this identity's own: nobody else's session holds it
        return found

    async def session(self, who: Bearer, session_id: str) -> Session | None:
        """The account's session (None: none such, or another account's)."""
        found = await sessions.find(self.core.pool, who.account_id, session_id)
        return None if found is None else found[1]

    async def delete_session(self, who: Bearer, session_id: str) -> bool:
        """Delete the account's session (False: none such)."""
        return await sessions.delete(self.core.pool, who.account_id, session_id)

    async def messages(self, who: Bearer, session_id: str, before: str | None, limit: int) -> Page | None:
        """A page of the session's messages (None: not the account's session)."""
        found = await sessions.find(self.core.pool, who.account_id, session_id)
        if found is None:
            return None
        cursor = int(before) if before is not None and before.isdecimal() and len(before) < 19 else None
        return await sessions.page(self.core.pool, found[0], session_id, cursor, limit)

    async def stored_turn(self, who: Bearer, session_id: str, message_id: str) -> tuple[Message, ...] | None:
        """The stored messages of one turn of the account's session (None: no such turn)."""
        return await sessions.turn_of(self.core.pool, who.account_id, session_id, message_id)

    async def artifact(self, who: Bearer, artifact_id: str) -> tuple[str, str] | None:
        """A whole tool result of the account's sessions: (tool name, result JSON)."""
        return await sessions.artifact(self.core.pool, who.account_id, artifact_id)

    # ---- answers ----------------------------------------------------------------------------------------------------

    async def send(
        self,
        who: Bearer,
        session: Session,
        content: str,
        *,
        model: str | None = None,
        key: str | None = None,
        uploads: tuple[Upload, ...] = (),
    ) -> Feed | tuple[Message, ...]:
        """Start answering `content` (and the files in `uploads`) in the session (the turn runs on when the client goes
        away): its live feed; with an Idempotency-Key seen before, that turn's feed or, when it is no longer live here,
        its stored messages."""
        content = strip_nul(content)  # from any client: PostgreSQL takes no NUL
        message_id = message_key(key)
        live = self.feeds.get(session.id, message_id)
        if live is not None:
            return live
        if key:
            stored = await self.stored_turn(who, session.id, message_id)
            if stored:
                return stored
        shown = content or " ".join(f"[{up.kind}: {up.name}]" for up in uploads)  # until the files are taken in
        if not session.title:  # made without one: named by its first message, as a one-shot is
            await sessions.title_untitled(self.core.pool, session.id, shown)
        feed = Feed(session.id, message_id, shown, self.core.clock, self.core.clock())
        self.feeds.add(feed)
        inc = self._incoming(who, session.id, content, message_id=message_id, model=model, title=session.title)
        inc = replace(inc, uploads=uploads) if uploads else inc
        typed = None if uploads else typed_command(content)
        task = asyncio.create_task(self._run(inc, feed) if typed is None else self._run_command(inc, feed, typed))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return feed

    async def _run(self, inc: Incoming, feed: Feed) -> None:
        """Run one turn into its feed (a failure of the core becomes the chats' error text)."""
        try:
            await self.core.answer(inc, FeedReply(feed))
        except Exception:
            if await sessions.exists(self.core.pool, feed.session_id):
                log.exception("an API turn failed")
            else:  # deleted while it ran: its writes had nowhere to go
                log.info("an API turn ended without its session (deleted while it ran)")
            if feed.answer is None:
                feed.push(Error("failed", FAILED))
        finally:
            feed.finish()

    async def _run_command(self, inc: Incoming, feed: Feed, typed: TypedCommand) -> None:
        """A /command said in a session, answered as the terminal answers it (the catalogue's answer, or a hint for a
        /word it lacks) into the feed as the answer's text; like the chats' commands, it is not part of the session's
        conversation with the model (nothing of it is stored)."""
        try:
            said = typed.unknown() if typed.command is None else await self._answer(inc, typed.command.name, typed.args)
            if isinstance(said, Reminded):  # with its Undo button
                feed.buttons, said = (Button(UNDO, said.task_id),), said.text
            if isinstance(said, Buttons):  # a confirmation or a choice, with its buttons
                feed.choices, said = choices(said), said.text
            if isinstance(said, Error):
                feed.push(said)
            else:
                feed.push(AssistantDelta(said))
                feed.push(Assistant(said, None))
        except Exception:
            log.exception("an API command failed")
            if feed.answer is None:
                feed.push(Error("failed", FAILED))
        finally:
            feed.finish()

    def feed(self, session_id: str, message_id: str) -> Feed | None:
        """A turn's feed in this process, live or finished within API_FEED_KEEP_S."""
        return self.feeds.get(session_id, message_id)

    def latest_feed(self, session_id: str) -> Feed | None:
        """The session's newest feed in this process."""
        return self.feeds.latest(session_id)

    # ---- the chats' commands ----------------------------------------------------------------------------------------

    async def command(
        self, who: Bearer, name: CommandName, args: dict[str, str] | None = None, session: Session | None = None
    ) -> str:
        """A command of the catalogue as the caller's private chat answers it (in the session, or outside any)."""
        chat = session.id if session is not None else f"{HOME}{who.identity_id}"
        inc = self._incoming(who, chat, f"/{name}", title=session.title if session is not None else "")
        answer = await self._answer(inc, name, args or {})
        return answer.message if isinstance(answer, Error) else answer if isinstance(answer, str) else answer.text

    async def _answer(
        self, inc: Incoming, name: CommandName, args: CommandArgs | str
    ) -> str | Reminded | Buttons | Error:
        """A command's answer as the API shows it (`args`: by name, or the text typed after it): its Markdown (for
        /remind with the task its Undo button undoes; a confirmation or a choice with its buttons, its text saying what
        to type instead), or the refusal; a file (/export) is described, not sent."""
        answer = await self.core.command(inc, name, args, must_answer=True)
        if isinstance(answer, FileAnswer):
            return f"{answer.text}\n\n{FILE_ELSEWHERE}"
        return answer or ""

    async def press(
        self, who: Bearer, session: Session, message_id: str, task_id: int, action: str
    ) -> tuple[bool, str]:
        """A button under a message of the session pressed by the caller (Done, Snooze, Undo: the core checks that the
        task is theirs): whether it took effect, and what to show; under a stored reminder what it did is kept."""
        inc = self._incoming(who, session.id, "", title=session.title)
        done, said = await self.core.press_reminder(inc, task_id, action)
        if done:
            await sessions.note_pressed(self.core.pool, who.account_id, session.id, message_id, task_id, said)
        return done, said

    async def press_choice(self, who: Bearer, session: Session, message_id: str, packed: str) -> tuple[bool, str]:
        """A button of a confirmation or a choice under a command's answer in the session (`packed`: its `press`)
        pressed by the caller: the command runs again for them, as a press in their private chat runs it, only when
        the button was offered to them; whether it ran, and its answer (the answer's buttons then go)."""
        pressed = unpack(packed)
        if not isinstance(pressed, Confirm) or pressed.owner != who.platform_user_id:
            return False, NOT_YOUR_PRESS
        inc = self._incoming(who, session.id, f"/{pressed.command}", title=session.title)
        answer = await self._answer(inc, pressed.command, pressed.args)
        if isinstance(answer, Error):
            return False, answer.message
        feed = self.feeds.get(session.id, message_id.removesuffix(REPLY))
        if feed is not None:  # a stream resumed later shows the answer without them
            feed.choices = ()
        return True, answer if isinstance(answer, str) else answer.text

    async def tasks(self, who: Bearer) -> TaskList:
        """The caller's open tasks: /tasks's answer, and each task with its next time in UTC and in their zone."""
        text = await self.command(who, "tasks")
        inc = self._incoming(who, f"{HOME}{who.identity_id}", "/tasks")
        user, _ = await conversations.identify(self.core.pool, inc, self.core.settings.DEFAULT_TIMEZONE)
        tz, now = zone(user.timezone), self.core.clock()
        found = []
        for r in await open_tasks(self.core.pool, user.account_id):
            due, rec = r["due_at"], recurrence.from_json(r["recurrence"])
            described = recurrence.describe(rec) if rec is not None else None
            local = due.astimezone(tz) if due is not None else None
            overdue = due is not None and due < now
            found.append(OpenTask(r["id"], r["title"], r["status"], r["kind"], due, local, described, overdue))
        return TaskList(text, tz.key, tuple(found))

    async def memory(self, who: Bearer) -> MemoryView:
        """What the bot remembers about the caller: /memory's answer, and its blocks line by line."""
        text = await self.command(who, "memory")
        overview = await memory_overview(self.core.pool, who.account_id)
        blocks = tuple(
            MemoryBlock(b.name, DESCRIPTIONS.get(b.name, "Custom block"), b.lines, b.words) for b in overview.blocks
        )
        limit = self.core.settings.MEMORY_BLOCK_WORDS
        return MemoryView(text, blocks, limit, overview.archival, overview.files)

    # ---- reminders into sessions (the Outbox of platform "api") -----------------------------------------------------

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Store a reminder in its session, where GET …/messages shows it (DeliveryRefused when the session is gone)."""
        key = f"{msg.task_id}:{msg.scheduled_at.isoformat()}"
        if not await sessions.store_reminder(self.core.pool, msg.chat_id, key, msg.text):
            raise DeliveryRefused(SESSION_GONE)
        await msg.mark_sent(1)
        return REMINDER_PREFIX + key


def choices(answer: Buttons) -> tuple[Choice, ...]:
    """The buttons of a confirmation or a choice that run a command again (a `Confirm`), in order."""
    return tuple(b for row in answer.rows for b in row if isinstance(b.press, Confirm))
