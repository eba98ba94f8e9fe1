"""The Matrix adapter (mautrix's ClientAPI, async; issue 37): start and stop, a /sync long-poll loop whose events
(messages, files, `!commands`, reactions that press buttons) go through the inbox, invitations accepted or declined,
answers and reminders out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp
from mautrix.client import ClientAPI
from mautrix.errors import MatrixError, MatrixRequestError, MUnknownToken
from mautrix.types import EventID, EventType, RoomID, SyncToken, UserID

from adapters.base import Limits, RunningAnswers
from adapters.matrix import commands, presses
from adapters.matrix.commands import command_of, on_matrix
from adapters.matrix.files import lazy
from adapters.matrix.guard import malformed, quarantine
from adapters.matrix.incoming import (
    StoredMessage,
    caption,
    content_of,
    files_of,
    from_a_person,
    inviter_incoming,
    mentions,
    obj,
    reaction,
    received,
    replied_to,
    reply_text,
    string,
    without_mention,
)
from adapters.matrix.limits import (
    MATRIX_BUTTON_LABEL,
    MATRIX_CUT_NOTE_S,
    MATRIX_SYNC_RETRY_S,
    MATRIX_SYNC_TIMEOUT_MS,
    MATRIX_TEXT_LIMIT,
    MATRIX_UPLOAD_BYTES,
)
from adapters.matrix.paced import PacedAPI
from adapters.matrix.render import content, parts
from adapters.matrix.reply import RoomReply
from adapters.matrix.send import DIRECT, Sender
from core import (
    CUT_SHORT,
    EXIT_UNREACHABLE,
    FAILED,
    REMINDER_BUTTON_LABELS,
    Button,
    Core,
    Delivery,
    DeliveryRefused,
    Incoming,
    OnTask,
    ReminderMessage,
    Settings,
    StartupError,
)

log = logging.getLogger(__name__)

MATRIX_LIMITS = Limits(
    message_chars=MATRIX_TEXT_LIMIT, upload_bytes=MATRIX_UPLOAD_BYTES, button_label=MATRIX_BUTTON_LABEL
)
# docs/platforms.md#matrix says why
ENCRYPTED_REFUSAL = "I don't take part in end-to-end encrypted rooms: please talk to me in a room without encryption."
REFUSED = frozenset({"M_FORBIDDEN", "M_NOT_FOUND", "M_UNKNOWN_TOKEN"})  # a send that will not pass on a retry
DEVICE_NAME = "assistant bot"  # the device a password login makes (as the account's sessions list shows it)


class MatrixAdapter:
    """Runs the bot on Matrix inside the caller's event loop.

    One /sync long-poll at a time; the events of a sync answer are stored in the core's inbox by event id before
    the sync token after them (next_batch) is kept in the database: a process killed in between syncs from the old
    token again, and the inbox answers each event once; a restart neither replays nor skips. Every process of the
    bot may sync: the inbox shares the work and stores a redelivered event once."""

    platform = "matrix"
    limits = MATRIX_LIMITS

    def __init__(self, core: Core, settings: Settings) -> None:
        """Prepare the client (nothing connected yet)."""
        assert settings.MATRIX_HOMESERVER and settings.MATRIX_USER_ID
        self.core, self.settings = core, settings
        self.homeserver = settings.MATRIX_HOMESERVER.strip().rstrip("/")
        self.user_id = settings.MATRIX_USER_ID.strip()
        given = settings.MATRIX_ACCESS_TOKEN
        self.token = given.get_secret_value().strip() if given is not None else ""  # "": log in with the password
        self.client: ClientAPI | None = None
        self.sender: Sender | None = None
        self.name = ""  # the bot's display name (what people call it in a group room)
        self.running = RunningAnswers("Matrix", settings.SHUTDOWN_GRACE_SECONDS, MATRIX_CUT_NOTE_S)
        self._sync: asyncio.Task[None] | None = None
        self._direct: dict[str, bool] = {}  # room id → a direct chat (kept in the database too)
        self._names: dict[str, str] = {}  # people's display names by user id
        self.clock: Callable[[], float] = time.monotonic  # paces the answers' drafts (a test steps it)

    @property
    def source(self) -> str:
        """The inbox key of this account's events."""
        return f"matrix:{self.user_id}"

    @property
    def _token_key(self) -> str:
        return f"{self.source}:next_batch"

    # ---- start and stop ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the token (whoami), serve the stored messages, then start syncing; a failure is one StartupError
        line."""
        self.running.restart()
        client = ClientAPI(UserID(self.user_id), api=PacedAPI(base_url=self.homeserver, token=self.token))
        try:
            if not self.token:
                await self._log_in(client)
            whoami = await client.whoami()
            if whoami.user_id != self.user_id:
                raise StartupError(
                    f"MATRIX_ACCESS_TOKEN belongs to {whoami.user_id}, not MATRIX_USER_ID {self.user_id}"
                )
            with contextlib.suppress(MatrixError):
                self.name = await client.get_displayname(UserID(self.user_id)) or ""
        except BaseException as e:
            await client.api.session.close()
            if isinstance(e, MatrixRequestError):
                what = "MATRIX_ACCESS_TOKEN" if self.token else "MATRIX_PASSWORD"
                raise StartupError(f"{what} was refused by {self.homeserver} ({e.errcode})") from None
            if isinstance(e, aiohttp.ClientError | OSError):
                why = f"cannot reach the Matrix homeserver at {self.homeserver} ({e})"
                raise StartupError(why, exit_code=EXIT_UNREACHABLE) from None
            raise
        self.client = client
        self.sender = Sender(client, self.core, self.source, self.user_id)
        self.core.serve(self.source, StoredMessage.from_payload, self._on_stored)
        self._sync = asyncio.create_task(self._sync_loop(), name="matrix sync")
        self.core.report_state(self.platform, f"{self.user_id} on {self.homeserver}")

    async def _log_in(self, client: ClientAPI) -> None:
        """MATRIX_PASSWORD instead of a token: the token a password login handed out before (kept in the database)
        while the homeserver still takes it, else a new login whose token is kept for every later start."""
        key = f"{self.source}:access_token"
        kept = await self.core.kept.get(key)
        if kept:
            client.api.token = kept
            try:
                await client.whoami()
                return
            except MUnknownToken:
                log.info("the kept Matrix access token was refused; logging in with MATRIX_PASSWORD again")
        assert self.settings.MATRIX_PASSWORD is not None
        password = self.settings.MATRIX_PASSWORD.get_secret_value()
        login = await client.login(password=password, device_name=DEVICE_NAME)
        await self.core.kept.put(key, login.access_token)

    async def stop(self) -> None:
        """Stop syncing, let running answers finish (at most SHUTDOWN_GRACE_SECONDS), then disconnect."""
        self.running.stopping = True
        self.core.unserve(self.source)
        if self._sync is not None:
            self._sync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sync
            self._sync = None
        await self.running.drain()
        if self.client is not None:
            await self.client.api.session.close()
            self.client = self.sender = None
        self.core.report_state(self.platform, None)

    # ---- in: /sync ---------------------------------------------------------------------------------

    async def _sync_loop(self) -> None:
        """Long-poll /sync from the kept token; a failed sync or a failed store is tried again from the same token
        after a growing wait. The very first sync (no token kept) takes invitations but answers no history."""
        assert self.client is not None
        failures = 0
        kept = await self._kept_token()
        since = SyncToken(kept) if kept else None
        while True:
            try:
                answer = await self.client.sync(since=since, timeout=MATRIX_SYNC_TIMEOUT_MS if since else 0)
                await self.on_sync(answer, history=since is None)
                since = SyncToken(str(answer["next_batch"]))
                await self.core.kept.put(self._token_key, since)  # only now: the events before it are stored
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:
                wait = MATRIX_SYNC_RETRY_S[min(failures, len(MATRIX_SYNC_RETRY_S) - 1)]
                failures += 1
                log.warning("Matrix sync failed (%s); again in %g s from the same point", e, wait)
                await asyncio.sleep(wait)

    async def _kept_token(self) -> str | None:
        """The kept sync token, waiting out a database that is away."""
        for wait in (*MATRIX_SYNC_RETRY_S, None):
            try:
                return await self.core.kept.get(self._token_key)
            except Exception:
                if wait is None:
                    raise
                await asyncio.sleep(wait)
        return None

    async def on_sync(self, answer: dict[str, Any], *, history: bool = False) -> None:
        """One sync answer: invitations handled, each joined room's timeline events for the bot stored (raises when
        one cannot be: the token is then not kept and the same events come again). `history`: the first sync ever,
        whose timeline is what was said before the bot was here."""
        rooms = obj(answer.get("rooms"))
        for room_id, invited in obj(rooms.get("invite")).items():
            events = obj(obj(invited).get("invite_state")).get("events")
            await self._guarded(str(room_id), events, self._on_invite(str(room_id), _events(events)))
        for room_id, joined in obj(rooms.get("join")).items():
            for event in _events(obj(obj(joined).get("timeline")).get("events")):
                if await self._guarded(str(room_id), event, self._on_timeline(str(room_id), event, history)):
                    break

    async def _guarded(self, room_id: str, event: object, handled: Awaitable[bool | None]) -> bool:
        """Handle one event (or invitation); one the adapter cannot read is kept as a dead letter and the sync goes
        on. Whether the room's other events are to be passed over (it was left)."""
        try:
            return bool(await handled)
        except Exception as e:
            if not malformed(e):
                raise  # the database or the homeserver is away: the sync is tried again from the same point
            log.warning("a Matrix event in %s could not be handled (%s); kept as a dead letter", room_id, e)
            await quarantine(self.core, self.source, room_id, event, e)
            return False

    async def _on_timeline(self, room_id: str, event: dict[str, Any], history: bool) -> bool:
        """One timeline event of a joined room; whether the bot left the room over it (encryption turned on)."""
        if event.get("type") == "m.room.encryption" and not history:  # turned on while the bot is in
            await self._refuse_encrypted(room_id)
            return True
        if event.get("type") == "m.room.member" and event.get("state_key") == self.user_id:
            if content_of(event).get("is_direct"):
                await self._mark_direct(room_id, string(event.get("sender")))
        if not history:
            await self.on_event(room_id, event)
        return False

    async def _on_invite(self, room_id: str, state: list[dict[str, Any]]) -> None:
        """Join a room an allowed person invited the bot to (a direct chat when the invitation says so); decline
        others', with the refusal that names their id as the reason (their client shows it); an encrypted room is
        refused with one line (docs/platforms.md#matrix)."""
        assert self.client is not None
        mine = [e for e in state if e.get("type") == "m.room.member" and e.get("state_key") == self.user_id]
        if not mine:
            return
        invite = mine[-1]
        sender = string(invite.get("sender"))
        room = RoomID(room_id)
        inviter = inviter_incoming(sender, room_id)
        if not self.core.is_allowed(inviter):
            log.info("declined %s's invitation to %s: not allowed to use the bot", sender, room_id)
            await self.client.leave_room(room, reason=self.core.refusal_text(inviter))
            return
        await self.client.join_room_by_id(room)
        if any(e.get("type") == "m.room.encryption" for e in state):
            await self._refuse_encrypted(room_id)
            return
        if content_of(invite).get("is_direct"):
            await self._mark_direct(room_id, sender)

    async def _refuse_encrypted(self, room_id: str) -> None:
        """Say in one line that the bot takes no part in encrypted rooms, and leave."""
        assert self.client is not None
        room = RoomID(room_id)
        txn = f"encrypted.{room_id}"
        await self.client.send_message_event(room, EventType.ROOM_MESSAGE, content(ENCRYPTED_REFUSAL), txn_id=txn)
        await self.client.leave_room(room)

    async def _mark_direct(self, room_id: str, person: str) -> None:
        """A direct chat, and the direct room of the person who opened it."""
        self._direct[room_id] = True
        await self.core.kept.put(f"{self.source}:room:{room_id}", DIRECT)
        if person and person != self.user_id and self.sender is not None:
            await self.sender.keep_direct(person, room_id)

    async def _is_direct(self, room_id: str) -> bool:
        if room_id not in self._direct:
            self._direct[room_id] = await self.core.kept.get(f"{self.source}:room:{room_id}") == DIRECT
        return self._direct[room_id]

    async def on_event(self, room_id: str, event: dict[str, Any]) -> None:
        """A timeline event: a person's message or command for the bot, or their reaction to one of the bot's
        messages with buttons, stored in the inbox (a refusal of a message answered here)."""
        pressed = reaction(event, self.user_id)
        if pressed is not None:
            await self._on_reaction(room_id, event, *pressed)
            return
        if not from_a_person(event, self.user_id):
            return
        direct = await self._is_direct(room_id)
        content = content_of(event)
        text = caption(content).strip()
        found = command_of(text)
        if (
            not direct
            and found is None
            and not mentions(event, self.user_id, self.name)
            and not await self._replies_to_bot(room_id, event)
        ):
            return
        sender = str(event["sender"])
        text = text if direct or found else without_mention(text, self.user_id, self.name)
        if found is None and await self._pressed_by_reply(room_id, event, text):
            return
        files = files_of(content, text) if found is None else ()
        stored = received(event, room_id, direct, await self._name(sender), text, files)
        if found is not None:
            stored = replace(stored, kind="command", command=found[0].name, args=found[1])
        inc = stored.incoming
        if not self.core.is_allowed(inc):
            refusal = await self.core.refusal(inc)
            if refusal is not None:
                await self._post(room_id, refusal.message, f"refusal.{stored.event_id}")
        elif inc.text or files:
            await self.core.receive(self.source, stored.update_id, inc.chat_key, stored.payload(), stored)

    async def _on_reaction(self, room_id: str, event: dict[str, Any], target: str, key: str) -> None:
        """A reaction to one of the bot's messages with buttons: a press, stored like a message (the core and
        presses.py decide who may press what)."""
        assert self.sender is not None
        if await self.sender.kept(target) is None:
            return
        sender, direct = str(event["sender"]), await self._is_direct(room_id)
        inc = Incoming(
            platform="matrix",
            user_id=sender,
            chat_id=room_id,
            chat_kind="private" if direct else "group",
            chat_title="" if direct else room_id,
            text="",
            user_name=await self._name(sender),
            message_id=str(event["event_id"]),
        )
        stored = StoredMessage(inc, room_id, str(event["event_id"]), kind="press", target=target, key=key)
        await self.core.receive(self.source, stored.update_id, inc.chat_key, stored.payload(), stored)

    async def _pressed_by_reply(self, room_id: str, event: dict[str, Any], text: str) -> bool:
        """A reply to a message with buttons that names one of them ("done", "snooze 10 min", "2") presses it, for
        clients that cannot react; whether it did."""
        assert self.sender is not None
        replied = replied_to(event)
        kept = await self.sender.kept(replied) if replied else None
        key = kept.named(reply_text(text)) if kept is not None else None
        if key is None:
            return False
        await self._on_reaction(room_id, event, replied, key)
        return True

    async def _name(self, user: str) -> str:
        """A person's display name (their profile's, kept); their id when the homeserver will not say."""
        if user not in self._names:
            assert self.client is not None
            try:
                self._names[user] = await self.client.get_displayname(UserID(user)) or user
            except MatrixError:
                return user
        return self._names[user]

    async def _replies_to_bot(self, room_id: str, event: dict[str, Any]) -> bool:
        """Whether the message replies to one of the bot's (the replied-to event asked of the homeserver)."""
        assert self.client is not None
        replied = replied_to(event)
        if not replied:
            return False
        try:
            original = await self.client.get_event(RoomID(room_id), EventID(replied))
        except MatrixRequestError:  # gone, or not visible to the bot
            return False
        return str(original.sender) == self.user_id

    # ---- answers out -------------------------------------------------------------------------------

    async def _on_stored(self, delivery: Delivery) -> None:
        """A stored message's turn (or a command, or a press), in the process that received it or another one."""
        stored: StoredMessage = delivery.update
        if self.running.stopping or self.client is None or self.sender is None:  # declined: handed back
            raise asyncio.CancelledError
        with self.running.tracked():
            try:
                await self._handle(stored, delivery)
            except asyncio.CancelledError:
                if self.running.cutting:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(MATRIX_CUT_NOTE_S):
                            await self._post(stored.room_id, CUT_SHORT, f"cut.{stored.event_id}")
                raise
            except Exception as e:
                if isinstance(e, MatrixRequestError) and e.errcode in REFUSED:  # kicked, say: a note would fail too
                    log.warning("could not answer in Matrix room %s (%s)", stored.room_id, e.errcode)
                    return
                log.exception("a Matrix answer failed")
                with contextlib.suppress(Exception):
                    await self._post(stored.room_id, FAILED, f"failed.{stored.event_id}")

    def _handle(self, stored: StoredMessage, delivery: Delivery) -> Awaitable[None]:
        """A stored command, press or message (a turn, with its files fetched when the core takes them in)."""
        assert self.client is not None and self.sender is not None
        if stored.kind == "command":
            return commands.run(self.core, self.sender, stored)
        if stored.kind == "press":
            return presses.press(self.core, self.sender, stored)
        inc = stored.incoming
        if stored.files:
            inc = replace(inc, uploads=tuple(lazy(self.client, f) for f in stored.files))
        group = inc.chat_kind == "group"
        reply = RoomReply(self.client, stored.room_id, stored.event_id, self.sender, reply=group, clock=self.clock)
        return self.core.answer(inc, reply, delivery=delivery)

    async def _post(self, room_id: str, text: str, txn: str) -> None:
        """Plain text into a room, its parts sent with transaction ids made of `txn`."""
        assert self.client is not None
        for i, part in enumerate(parts(text)):
            await self.client.send_message_event(
                RoomID(room_id), EventType.ROOM_MESSAGE, content(part), txn_id=f"{txn}.{i}"
            )

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Push a reminder into the room it was made in, with Done / Snooze as reactions (in a group room it
        mentions its owner, the only one it notifies): the parts the room does not have yet, each with a
        transaction id of its occurrence and index, so a retried send is the same event. The last part's event
        id; a room closed to the bot raises DeliveryRefused."""
        if self.sender is None:
            raise DeliveryRefused("Matrix is not connected")
        buttons = [Button(REMINDER_BUTTON_LABELS[n], OnTask(n, msg.task_id)) for n in msg.buttons]
        mention = (msg.owner_id, msg.owner_name) if msg.chat_kind == "group" else None
        txn = f"reminder.{msg.task_id}.{msg.scheduled_at.isoformat()}"
        try:
            return await self.sender.post(
                msg.chat_id,
                on_matrix(msg.text),  # a notice may name a command (/link's "/unlink separates one again")
                txn,
                buttons=buttons,
                mention=mention,
                first=msg.sent_parts,
                sent=msg.mark_sent,
            )
        except MatrixRequestError as e:
            if e.errcode in REFUSED:
                raise DeliveryRefused(f"Matrix: {e.errcode}") from e
            raise


def _events(events: object) -> list[dict[str, Any]]:
    """The events of a sync's list that are JSON objects (anything else in it is no event: skipped)."""
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
