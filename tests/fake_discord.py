"""In-process fake of the Discord REST API and gateway for tests that drive the real discord.py."""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import BodyPartReader, WSMsgType, web

from tests.loopback import LoopbackServer

__all__ = [
    "API_VERSION",
    "EPHEMERAL",
    "INTENT_DIRECT_MESSAGES",
    "INTENT_GUILDS",
    "INTENT_GUILD_MEMBERS",
    "INTENT_GUILD_MESSAGES",
    "INTENT_GUILD_PRESENCES",
    "INTENT_MESSAGE_CONTENT",
    "IS_VOICE_MESSAGE",
    "MAX_CONTENT_LENGTH",
    "PRIVILEGED_INTENTS",
    "FakeDiscord",
    "FakeInteraction",
]

API_VERSION = 10
MAX_CONTENT_LENGTH = 2000
DISCORD_EPOCH_MS = 1_420_070_400_000
HEARTBEAT_INTERVAL_MS = 41_250  # discord.py heartbeats from a thread on this period: tests never wait for it
ATTACHMENT_SIZE_LIMIT = 10 * 1024 * 1024

# message flags
EPHEMERAL = 1 << 6
HAS_SNAPSHOT = 1 << 14  # a forward: the message carries a snapshot of another message
LOADING = 1 << 7
IS_VOICE_MESSAGE = 1 << 13  # a voice message: one audio/ogg attachment with duration_secs and a waveform
IS_COMPONENTS_V2 = 1 << 15

# gateway intents
INTENT_GUILDS = 1 << 0
INTENT_GUILD_MEMBERS = 1 << 1
INTENT_GUILD_PRESENCES = 1 << 8
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_DIRECT_MESSAGES = 1 << 12
INTENT_MESSAGE_CONTENT = 1 << 15
PRIVILEGED_INTENTS = INTENT_GUILD_MEMBERS | INTENT_GUILD_PRESENCES | INTENT_MESSAGE_CONTENT

# what @everyone may do in the fake guild (and what the bot's interactions report as app_permissions)
DEFAULT_PERMISSIONS = (
    (1 << 6)  # ADD_REACTIONS
    | (1 << 10)  # VIEW_CHANNEL
    | (1 << 11)  # SEND_MESSAGES
    | (1 << 14)  # EMBED_LINKS
    | (1 << 15)  # ATTACH_FILES
    | (1 << 16)  # READ_MESSAGE_HISTORY
    | (1 << 18)  # USE_EXTERNAL_EMOJIS
    | (1 << 31)  # USE_APPLICATION_COMMANDS
    | (1 << 35)  # CREATE_PUBLIC_THREADS
    | (1 << 38)  # SEND_MESSAGES_IN_THREADS
)

# interaction (callback) types
_APPLICATION_COMMAND = 2
_MESSAGE_COMPONENT = 3
_CHANNEL_MESSAGE = 4
_DEFERRED_CHANNEL_MESSAGE = 5
_DEFERRED_UPDATE_MESSAGE = 6
_UPDATE_MESSAGE = 7
_AUTOCOMPLETE_RESULT = 8
_MODAL = 9
_MODAL_SUBMIT = 5  # interaction type
_TEXT_INPUT = 4
_LABEL = 18

_NAME_RE = re.compile(r"[-_'\w]{1,32}")
_USER_MENTION_RE = re.compile(r"<@!?(\d{15,21})>")
_ROLE_MENTION_RE = re.compile(r"<@&(\d{15,21})>")
_SNOWFLAKE_OPTION_TYPES = frozenset({6, 7, 8, 9, 11})
_SELECT_TYPES = frozenset({3, 5, 6, 7, 8})
_EVENT_ONLY = frozenset({"READY", "RESUMED", "GUILD_CREATE"})


def _now() -> str:
    """The current time as Discord's ISO 8601 timestamp."""
    return datetime.now(UTC).isoformat()


def _member_fields(roles: list[str], joined_at: str) -> dict[str, Any]:
    """A guild member object without its "user"."""
    return {
        "roles": roles,
        "joined_at": joined_at,
        "premium_since": None,
        "deaf": False,
        "mute": False,
        "pending": False,
        "nick": None,
        "avatar": None,
        "banner": None,
        "flags": 0,
        "communication_disabled_until": None,
    }


def _context_of(channel: dict[str, Any]) -> int:
    """The interaction context type of a channel: 0 a server, 1 the bot's DM, 2 a group DM (or another DM)."""
    if channel.get("guild_id"):
        return 0
    return 2 if channel.get("type") == 3 else 1


def _snowflake_time(snowflake: str) -> str:
    """The creation time in a snowflake id as Discord's ISO 8601 timestamp (milliseconds)."""
    ms = (int(snowflake) >> 22) + DISCORD_EPOCH_MS
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response whose Content-Type is exactly application/json (discord.py compares it verbatim)."""
    return web.Response(body=json.dumps(body).encode(), status=status, content_type="application/json", headers=headers)


def _field_error(path: list[str | int], code: str, message: str) -> dict[str, Any]:
    """The nested "errors" object of a 50035 Invalid Form Body for one field."""
    errors: dict[str, Any] = {"_errors": [{"code": code, "message": message}]}
    for key in reversed(path):
        errors = {str(key): errors}
    return errors


class _ApiError(Exception):
    """A request Discord answers with an error object."""

    def __init__(self, status: int, code: int, message: str, errors: dict[str, Any] | None = None) -> None:
        """Store the HTTP status, JSON error code, message and optional field errors."""
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.errors = errors

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        body: dict[str, Any] = {"message": self.message, "code": self.code}
        if self.errors is not None:
            body["errors"] = self.errors
        return body


def _invalid(path: list[str | int], code: str, message: str) -> _ApiError:
    """A 400 Invalid Form Body (50035) about one field."""
    return _ApiError(400, 50035, "Invalid Form Body", _field_error(path, code, message))


def _not_found(code: int, what: str) -> _ApiError:
    """A 404 Unknown <what>."""
    return _ApiError(404, code, f"Unknown {what}")


@dataclass
class _Upload:
    """A file part of a multipart request."""

    index: int
    filename: str
    content_type: str
    data: bytes


@dataclass
class _Call:
    """One decoded REST request."""

    method: str
    path: str  # relative to /api/v10
    params: dict[str, str]  # path parameters
    query: dict[str, str]
    body: Any
    uploads: list[_Upload]


@dataclass
class _Session:
    """A gateway session: its intents and every dispatch sent in it (seq = index + 1)."""

    id: str
    intents: int
    history: list[tuple[str, Any]] = field(default_factory=list)
    delivered: int = 0  # how many history entries were written to some connection


@dataclass
class _Connection:
    """One gateway websocket."""

    ws: web.WebSocketResponse
    path: str
    session: _Session | None = None
    cursor: int = 0  # index of the next history entry to send
    live: bool = False  # identified or resumed, and still the current connection
    shard: int = 0  # the shard it identified (or resumed) as; 0 when unsharded


@dataclass
class _Slot:
    """One gateway shard: its session, its current connection and dispatches made before it had a session."""

    session: _Session | None = None
    conn: _Connection | None = None
    pending: list[tuple[str, Any]] = field(default_factory=list)


RouteHandler = Callable[[_Call], Awaitable[Any]]


class FakeInteraction:
    """One INTERACTION_CREATE dispatched by the fake, and what the bot answered to it."""

    def __init__(self, fake: FakeDiscord, payload: dict[str, Any]) -> None:
        """Track the interaction payload sent to the client."""
        self.fake = fake
        self.payload = payload
        self.id: str = payload["id"]
        self.token: str = payload["token"]
        self.type: int = payload["type"]
        self.responses: list[dict[str, Any]] = []  # callback bodies ({"type": 4, "data": {...}} ...)
        self.followups: list[dict[str, Any]] = []  # followup messages as stored
        self.edits: list[dict[str, Any]] = []  # PATCH bodies for the original or a followup, with "message_id"
        self.message: dict[str, Any] | None = None  # original response message (the clicked one after 6/7)
        self.clicked: dict[str, Any] | None = None  # the message a component interaction came from
        self._messages: dict[str, dict[str, Any]] = {}  # messages owned by this interaction's webhook
        self._texts: list[str] = []

    def __repr__(self) -> str:
        """Short description for assertion messages."""
        return f"<FakeInteraction id={self.id} type={self.type} responses={self.responses!r} texts={self._texts!r}>"

    @property
    def responded(self) -> bool:
        """Whether the interaction callback arrived."""
        return bool(self.responses)

    @property
    def deferred(self) -> bool:
        """Whether the callback was a deferral (type 5 or 6)."""
        return bool(self.responses) and self.responses[0].get("type") in (
            _DEFERRED_CHANNEL_MESSAGE,
            _DEFERRED_UPDATE_MESSAGE,
        )

    @property
    def done(self) -> bool:
        """A callback arrived and, after a deferral, a followup or an edit too."""
        return self.responded and (not self.deferred or bool(self.followups) or bool(self.edits))

    @property
    def ephemeral(self) -> bool:
        """Whether the answer carried the EPHEMERAL flag (64)."""
        for response in self.responses:
            data = response.get("data")
            if isinstance(data, dict) and int(data.get("flags") or 0) & EPHEMERAL:
                return True
        return any(int(f.get("flags") or 0) & EPHEMERAL for f in self.followups)

    def texts(self) -> list[str]:
        """Contents of the message response, updates, followups and edits, in arrival order."""
        return list(self._texts)

    async def wait_done(self, timeout: float = 10.0) -> FakeInteraction:
        """Wait until `done`; return self."""
        await self.fake.wait_for(lambda: self.done, timeout, what=f"an answer to interaction {self.id}")
        return self


class FakeDiscord(LoopbackServer):
    """A fake Discord (REST API + gateway) on 127.0.0.1 for the real discord.py.

    Point discord.py at it with ``discord.http.Route.BASE = fake.api_base`` and
    ``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)`` (monkeypatched), or per
    client as adapters.discord.endpoints does. Close the clients before the fake: a client that loses its server
    logs its reconnect attempts as errors.
    """

    handler_cancellation = True

    def __init__(
        self,
        token: str = "fake-discord-token",
        *,
        application_id: str | None = None,
        enabled_intents: int = PRIVILEGED_INTENTS,
        guild_shard: tuple[int, int] | None = None,
    ) -> None:
        """Create the (not yet started) server with one guild, two text channels and a thread; `guild_shard`
        (shard, count) picks a guild id that shard owns when the bot runs that many shards."""
        self.token = token
        self.enabled_intents = enabled_intents  # privileged intents switched on in the "developer portal"
        self._last_id = 0
        self._users: dict[str, dict[str, Any]] = {}
        self.bot_user: dict[str, Any] = self.user("1000000000000000001", "assistant", bot=True)
        self.application_id: str = application_id or self.bot_user["id"]  # modern apps share the bot's id
        self.owner: dict[str, Any] = self.user(self._snowflake(), "owner")
        self.guild_id = self._snowflake()
        if guild_shard is not None:  # move the id's timestamp a few ms on until (id >> 22) % count is the shard
            shard, count = guild_shard
            self._last_id = int(self.guild_id) + (((shard - (int(self.guild_id) >> 22)) % count) << 22)
            self.guild_id = str(self._last_id)
        self.bot_role_id = self._snowflake()
        self.channel_id = self._snowflake()
        self.other_channel_id = self._snowflake()
        self.thread_id = self._snowflake()
        joined = _now()
        self.guild: dict[str, Any] = {
            "id": self.guild_id,
            "name": "Test Guild",
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "banner": None,
            "description": None,
            "owner_id": self.owner["id"],
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "premium_progress_bar_enabled": False,
            "preferred_locale": "en-US",
            "features": [],
            "system_channel_id": self.channel_id,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "public_updates_channel_id": None,
            "safety_alerts_channel_id": None,
            "vanity_url_code": None,
            "max_members": 500000,
            "max_video_channel_users": 25,
            "max_stage_video_channel_users": 50,
            "application_id": None,
            "widget_enabled": False,
            "widget_channel_id": None,
            "incidents_data": None,
            "emojis": [],
            "stickers": [],
            "roles": [
                self._role(self.guild_id, "@everyone", 0),
                {
                    **self._role(self.bot_role_id, "assistant", 1),
                    "managed": True,
                    "tags": {"bot_id": self.bot_user["id"]},
                },
            ],
        }
        self.members: dict[str, dict[str, Any]] = {}  # guild members by user id (with "user")
        self._add_member(self.bot_user, roles=[self.bot_role_id], joined_at=joined)
        self._add_member(self.owner, roles=[], joined_at=joined)
        self._channels: dict[str, dict[str, Any]] = {}
        self._add_guild_text_channel(self.channel_id, "general", 0)
        self._add_guild_text_channel(self.other_channel_id, "random", 1)
        self._channels[self.thread_id] = {
            "id": self.thread_id,
            "type": 11,
            "guild_id": self.guild_id,
            "parent_id": self.channel_id,
            "owner_id": self.owner["id"],
            "name": "assistant-thread",
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "message_count": 0,
            "member_count": 1,
            "total_message_sent": 0,
            "flags": 0,
            "applied_tags": [],
            "thread_metadata": {
                "archived": False,
                "auto_archive_duration": 1440,
                "archive_timestamp": joined,
                "locked": False,
                "create_timestamp": joined,
            },
        }
        self._dm_channels: dict[str, str] = {}  # user id -> DM channel id
        self._messages: dict[str, dict[str, Any]] = {}
        self._files: dict[str, tuple[str, bytes]] = {}  # attachment id -> (content type, data)
        self.downloads: list[str] = []  # ids of the attachments fetched from the fake CDN, in order
        self._nonces: dict[str, dict[str, Any]] = {}
        # recordings
        # messages the bot posted with POST /channels/{id}/messages (stored dicts, kept up to date by edits);
        # interaction answers are recorded on their FakeInteraction instead
        self.sent: list[dict[str, Any]] = []
        self.edits: list[dict[str, Any]] = []  # PATCH bodies for bot messages, with "message_id"
        self.deleted: list[str] = []  # ids of deleted messages
        self.reactions: list[tuple[str, str]] = []  # (message id, emoji) the bot added
        self.typing: list[str] = []  # channel ids of typing indicators
        self.requests: list[tuple[str, str, Any]] = []  # every REST call: (method, path, JSON body)
        self.unknown_requests: list[str] = []  # "METHOD /path" of requests no route matched
        self.rate_limited: list[str] = []  # "METHOD /path" answered with a scripted 429
        self.presence_updates: list[Any] = []
        self.commands: list[dict[str, Any]] = []  # global application commands
        self.guild_commands: dict[str, list[dict[str, Any]]] = {}
        self.command_puts = 0
        self.interactions: list[FakeInteraction] = []
        self._interactions: dict[str, FakeInteraction] = {}  # by id and by token
        self._rate_limits: list[tuple[str, float, bool]] = []
        self._failures: list[tuple[str, int, int, str, int]] = []  # scripted error answers (see fail_next)
        self.failed: list[str] = []  # "METHOD /path" answered with a scripted error
        # gateway
        self.identify_count = 0
        self.resume_count = 0
        self.heartbeats = 0
        self.gateway_connections: list[str] = []  # path of every websocket connection
        self.gateway_closes: list[int] = []  # close codes the fake sent
        # per shard (0 when unsharded): a guild's events go to shard (guild id >> 22) % shard_count, DMs to 0
        self._slots: dict[int, _Slot] = {0: _Slot()}
        self.shard_count = 1  # as the latest IDENTIFY said
        self.identified_shards: list[list[int] | None] = []  # the "shard" field of every IDENTIFY
        self._sockets: set[web.WebSocketResponse] = set()
        self._send_lock = asyncio.Lock()
        super().__init__()
        self._app.router.add_route("*", "/{tail:.*}", self._handle)
        self._routes: list[tuple[str, re.Pattern[str], RouteHandler, bool]] = []
        self._install_routes()

    # shard 0 (the only one when unsharded): what the scripting API below talks about

    @property
    def _session(self) -> _Session | None:
        """Shard 0's session."""
        return self._slots[0].session

    @_session.setter
    def _session(self, value: _Session | None) -> None:
        """Set shard 0's session."""
        self._slots[0].session = value

    @property
    def _conn(self) -> _Connection | None:
        """Shard 0's current connection."""
        return self._slots[0].conn

    @_conn.setter
    def _conn(self, value: _Connection | None) -> None:
        """Set shard 0's current connection."""
        self._slots[0].conn = value

    def shard_of(self, guild_id: int | str | None) -> int:
        """The shard that receives a guild's events (DMs, guild_id None: shard 0), as Discord routes them."""
        return 0 if not guild_id else (int(guild_id) >> 22) % self.shard_count

    def shard_connected(self, shard: int) -> bool:
        """Whether a shard's gateway connection is identified or resumed and receiving dispatches."""
        slot = self._slots.get(shard)
        return slot is not None and slot.conn is not None and slot.conn.live

    # lifecycle

    async def stop(self) -> None:
        """Close every gateway connection and shut the server down."""
        for slot in self._slots.values():
            slot.conn = None
        for ws in list(self._sockets):
            await ws.close(code=1001, message=b"Going away")
        await super().stop()

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT."""
        return self.origin

    @property
    def api_base(self) -> str:
        """Value for discord.http.Route.BASE, e.g. http://127.0.0.1:PORT/api/v10."""
        return f"{self.base_url}/api/v{API_VERSION}"

    @property
    def gateway_url(self) -> str:
        """Value for DiscordWebSocket.DEFAULT_GATEWAY, e.g. ws://127.0.0.1:PORT/."""
        return f"ws://127.0.0.1:{self._port}/" if self._port is not None else self.base_url

    @property
    def resume_gateway_url(self) -> str:
        """The resume_gateway_url READY announces (the same server, path /resume)."""
        return f"ws://127.0.0.1:{self._port}/resume"

    # scripting: users, channels and messages

    def user(self, uid: int | str, name: str, *, bot: bool = False) -> dict[str, Any]:
        """A user object (an author for post_message/slash/click); the fake remembers it."""
        user: dict[str, Any] = {
            "id": str(uid),
            "username": name,
            "discriminator": "0",
            "global_name": None if bot else name.capitalize(),
            "avatar": None,
            "banner": None,
            "accent_color": None,
            "avatar_decoration_data": None,
            "collectibles": None,
            "primary_guild": None,
            "public_flags": 0,
        }
        if bot:
            user["bot"] = True
        self._users[user["id"]] = user
        return user

    def dm_channel_id(self, user_id: int | str) -> str:
        """The id of the bot's DM channel with a user (created on first use)."""
        uid = str(user_id)
        channel_id = self._dm_channels.get(uid)
        if channel_id is None:
            recipient = self._users.get(uid) or self.user(uid, f"user{uid}")
            channel_id = self._snowflake()
            self._channels[channel_id] = {
                "id": channel_id,
                "type": 1,
                "last_message_id": None,
                "flags": 0,
                "recipients": [recipient],
            }
            self._dm_channels[uid] = channel_id
        return channel_id

    def group_dm_channel_id(self, *users: dict[str, Any], name: str = "friends") -> str:
        """A new group DM of these users (the bot cannot be a member: only a user-installed app reaches it)."""
        channel_id = self._snowflake()
        for user in users:
            self._users.setdefault(str(user["id"]), user)
        self._channels[channel_id] = {
            "id": channel_id,
            "type": 3,
            "name": name,
            "icon": None,
            "owner_id": str(users[0]["id"]) if users else None,
            "last_message_id": None,
            "flags": 0,
            "recipients": [copy.deepcopy(u) for u in users],
        }
        return channel_id

    def channel(self, channel_id: int | str) -> dict[str, Any]:
        """A channel object the fake knows (KeyError otherwise)."""
        return self._channels[str(channel_id)]

    def message(self, message_id: int | str) -> dict[str, Any]:
        """A stored message (KeyError otherwise)."""
        return self._messages[str(message_id)]

    def messages_in(self, channel_id: int | str) -> list[dict[str, Any]]:
        """Stored messages of a channel, oldest first."""
        cid = str(channel_id)
        return [m for m in self._messages.values() if m["channel_id"] == cid]

    def attachment_data(self, attachment: dict[str, Any]) -> tuple[str, bytes]:
        """The content type and bytes of an attachment (one a user posted, or a file the bot uploaded)."""
        return self._files[str(attachment["id"])]

    async def post_message(
        self,
        author: dict[str, Any],
        content: str,
        *,
        channel_id: int | str | None = None,
        mention_bot: bool = False,
        reply_to: dict[str, Any] | None = None,
        ping_reply: bool = True,
        attachments: list[dict[str, Any]] | None = None,
        embeds: list[dict[str, Any]] | None = None,
        components: list[dict[str, Any]] | None = None,
        dm: bool = False,
        flags: int = 0,
        stickers: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A user posts a message (dispatched as MESSAGE_CREATE); return the stored message.

        attachments: dicts with "filename" and optionally "data" (bytes served at the attachment url),
        "content_type" and any other attachment field (a "size" given overrides the data's length). With
        author=fake.bot_user and components this also makes a bot message "from an earlier run" (e.g. to click a
        persistent view after a restart). flags: the message's flags (IS_VOICE_MESSAGE: see post_voice_message).
        stickers: the message's sticker_items, e.g. sticker_item("Wave") (Discord sends only these, no sticker file).
        """
        self._users.setdefault(str(author["id"]), author)
        if dm:
            channel = self._channels[self.dm_channel_id(author["id"])]
        else:
            channel = self._channel_or_raise(channel_id or self.channel_id)
        if mention_bot:
            content = f"<@{self.bot_user['id']}> {content}"
        message = self._new_message(channel, author, content)
        for item in attachments or []:
            data = item.get("data")
            extra = {k: v for k, v in item.items() if k not in ("data", "filename", "content_type")}
            message["attachments"].append(
                self._attachment(
                    channel["id"],
                    str(item["filename"]),
                    data if isinstance(data, bytes) else b"",
                    str(item.get("content_type") or "application/octet-stream"),
                    extra,
                )
            )
        message["flags"] = flags
        if embeds:
            message["embeds"] = copy.deepcopy(embeds)
        if stickers:
            message["sticker_items"] = copy.deepcopy(stickers)
        if components:
            message["components"] = copy.deepcopy(components)
        if reply_to is not None:
            self._set_reference(message, reply_to)
        message["mentions"] = self._mentions(message, None, reply_to if ping_reply else None)
        self._store(message)
        await self._dispatch("MESSAGE_CREATE", message)
        return message

    def sticker_item(self, name: str, format_type: int = 1) -> dict[str, Any]:
        """A sticker as a message carries it (format_type: 1 PNG, 2 APNG, 3 Lottie, 4 GIF)."""
        return {"id": self._snowflake(), "name": name, "format_type": format_type}

    async def post_voice_message(
        self, author: dict[str, Any], data: bytes, *, duration_secs: float, **kwargs: Any
    ) -> dict[str, Any]:
        """A user records a voice message (as the Discord apps send one: no content, the IS_VOICE_MESSAGE flag and
        one voice-message.ogg attachment with its duration and waveform); kwargs as post_message's. Return it."""
        waveform = base64.b64encode(bytes(min(255, 16 * i) for i in range(32))).decode()  # 1 byte per sample
        attachment = {
            "filename": "voice-message.ogg",
            "data": data,
            "content_type": "audio/ogg",
            "duration_secs": duration_secs,
            "waveform": waveform,
        }
        return await self.post_message(author, "", attachments=[attachment], flags=IS_VOICE_MESSAGE, **kwargs)

    async def forward_message(
        self,
        author: dict[str, Any],
        forwarded: dict[str, Any],
        *,
        channel_id: int | str | None = None,
        dm: bool = False,
        content: str = "",
    ) -> dict[str, Any]:
        """A user forwards a message (a stored one, or any message dict of a channel the bot may not see) into a
        channel or their DM with the bot; Discord sends a default message with a forward reference and a
        snapshot of the forwarded message (no author), and `content` is what the user added. Return it."""
        self._users.setdefault(str(author["id"]), author)
        if dm:
            channel = self._channels[self.dm_channel_id(author["id"])]
        else:
            channel = self._channel_or_raise(channel_id or self.channel_id)
        message = self._new_message(channel, author, content)
        reference: dict[str, Any] = {"type": 1, "message_id": forwarded["id"], "channel_id": forwarded["channel_id"]}
        if forwarded.get("guild_id"):
            reference["guild_id"] = forwarded["guild_id"]
        message["message_reference"] = reference
        keys = (
            "type",
            "content",
            "embeds",
            "attachments",
            "timestamp",
            "edited_timestamp",
            "flags",
            "mentions",
            "mention_roles",
            "components",
            "sticker_items",
        )
        snapshot = {k: copy.deepcopy(forwarded[k]) for k in keys if k in forwarded}
        snapshot.setdefault("edited_timestamp", None)
        message["message_snapshots"] = [{"message": snapshot}]
        message["flags"] = int(message.get("flags") or 0) | HAS_SNAPSHOT
        message["mentions"] = self._mentions(message, None, None)
        self._store(message)
        await self._dispatch("MESSAGE_CREATE", message)
        return message

    async def edit_message(self, message: dict[str, Any], content: str) -> dict[str, Any]:
        """A user edits their message (dispatched as MESSAGE_UPDATE); return it."""
        stored = self._messages[str(message["id"])]
        stored["content"] = content
        stored["edited_timestamp"] = _now()
        stored["mentions"] = self._mentions(stored, None, None)
        await self._dispatch("MESSAGE_UPDATE", stored)
        return stored

    async def delete_message(self, message: dict[str, Any]) -> None:
        """A message is deleted (dispatched as MESSAGE_DELETE)."""
        stored = self._messages.pop(str(message["id"]))
        self.deleted.append(stored["id"])
        await self._dispatch("MESSAGE_DELETE", self._delete_event(stored))

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send any gateway dispatch (queued while the client is disconnected)."""
        await self._dispatch(event, data)

    # scripting: interactions

    async def slash(
        self,
        name: str,
        options: dict[str, Any] | None,
        user: dict[str, Any],
        *,
        channel_id: int | str | None = None,
        dm: bool = False,
        user_install: bool = False,
        locale: str = "en-US",
    ) -> FakeInteraction:
        """A user invokes a registered slash command ("group sub" for subcommands); dispatch it.

        dm: in the user's DM with the bot; a channel_id of group_dm_channel_id: in that group DM (only through a
        user install); user_install: the app is installed to the user rather than to the server. Like Discord,
        a command is only offered where its contexts and integration types allow it."""
        self._users.setdefault(str(user["id"]), user)
        parts = name.split()
        channel = (
            self._channels[self.dm_channel_id(user["id"])]
            if dm
            else self._channel_or_raise(channel_id or self.channel_id)
        )
        context = _context_of(channel)
        command = self._find_command(parts[0], context != 0)
        if command is None:
            raise ValueError(f"slash command {parts[0]!r} is not registered (sync the command tree first)")
        contexts = command.get("contexts")
        if context != 0 and (command.get("guild_id") or command.get("dm_permission") is False):
            raise ValueError(f"slash command {parts[0]!r} is not available in DMs")
        if contexts is not None and context not in contexts:
            where = {0: "servers", 1: "DMs with the bot", 2: "group DMs and other DMs"}[context]
            raise ValueError(f"slash command {parts[0]!r} is not available in {where}")
        user_install = user_install or context == 2
        if (1 if user_install else 0) not in (command.get("integration_types") or [0]):
            install = "user" if user_install else "server"
            raise ValueError(f"slash command {parts[0]!r} is not available to a {install} install")
        definitions: list[dict[str, Any]] = command.get("options") or []
        path: list[tuple[str, int]] = []
        for part in parts[1:]:
            found = next((o for o in definitions if o.get("name") == part and o.get("type") in (1, 2)), None)
            if found is None:
                raise ValueError(f"{name!r}: no subcommand {part!r}")
            path.append((part, int(found["type"])))
            definitions = found.get("options") or []
        if any(o.get("type") in (1, 2) for o in definitions):
            raise ValueError(f"{name!r} is a group: name a subcommand")
        built, resolved = self._build_options(name, definitions, options or {}, channel)
        for part, kind in reversed(path):
            built = [{"name": part, "type": kind, "options": built}]
        data: dict[str, Any] = {"id": command["id"], "name": command["name"], "type": command.get("type", 1)}
        if built:
            data["options"] = built
        if resolved:
            data["resolved"] = resolved
        if command.get("guild_id"):
            data["guild_id"] = command["guild_id"]
        owners = {"1": str(user["id"])} if user_install else None
        return await self._interact(_APPLICATION_COMMAND, data, user, channel, None, owners=owners, locale=locale)

    async def click(
        self,
        message: dict[str, Any],
        custom_id: str,
        user: dict[str, Any],
        *,
        values: list[str] | None = None,
        dm: bool = False,
    ) -> FakeInteraction:
        """A user clicks a component of a stored message (values for select menus); dispatch it."""
        self._users.setdefault(str(user["id"]), user)
        stored = self._messages.get(str(message["id"]), message)
        component = self._find_component(stored.get("components") or [], custom_id)
        if component is None:
            raise ValueError(f"message {stored['id']} has no component with custom_id {custom_id!r}")
        if component.get("disabled"):
            raise ValueError(f"component {custom_id!r} is disabled")
        channel = self._channels.get(stored["channel_id"])
        if channel is None or (dm and channel.get("type") != 1):
            channel = self._channels[self.dm_channel_id(user["id"])]
        data: dict[str, Any] = {"custom_id": custom_id, "component_type": int(component.get("type", 2))}
        if data["component_type"] in _SELECT_TYPES:
            data["values"] = list(values or [])
        return await self._interact(_MESSAGE_COMPONENT, data, user, channel, stored)

    async def submit_modal(
        self,
        opened: FakeInteraction,
        values: dict[str, Any],
        user: dict[str, Any] | None = None,
    ) -> FakeInteraction:
        """A user submits the modal the bot opened in answer to `opened` (values by custom_id; lists for selects)."""
        modal = next((r.get("data") for r in opened.responses if r.get("type") == _MODAL), None)
        if not isinstance(modal, dict):
            raise ValueError(f"interaction {opened.id} was not answered with a modal")
        unknown = set(values)

        def submitted(component: dict[str, Any]) -> dict[str, Any]:
            kind = int(component.get("type", 0))
            if kind == 1:
                return {"type": 1, "components": [submitted(c) for c in component.get("components") or []]}
            if kind == _LABEL:
                return {"type": _LABEL, "component": submitted(component["component"])}
            custom_id = component.get("custom_id")
            result: dict[str, Any] = {"type": kind}
            if "id" in component:
                result["id"] = component["id"]
            if custom_id is None:
                return result
            result["custom_id"] = custom_id
            unknown.discard(custom_id)
            value = values.get(custom_id)
            if kind == _TEXT_INPUT:
                text = "" if value is None else str(value)
                if component.get("required", True) and not text:
                    raise ValueError(f"modal field {custom_id!r} is required")
                if text and not int(component.get("min_length") or 0) <= len(text) <= int(
                    component.get("max_length") or 4000
                ):
                    raise ValueError(f"modal field {custom_id!r}: {len(text)} characters is out of bounds")
                result["value"] = text
            else:
                result["values"] = [
                    str(v) for v in (value if isinstance(value, list) else [] if value is None else [value])
                ]
            return result

        components = [submitted(c) for c in modal.get("components") or []]
        if unknown:
            raise ValueError(f"the modal has no fields {sorted(unknown)}")
        author = user or opened.payload.get("user") or opened.payload["member"]["user"]
        channel = self._channels[opened.payload["channel_id"]]
        data = {"custom_id": modal.get("custom_id"), "components": components}
        return await self._interact(_MODAL_SUBMIT, data, author, channel, opened.clicked)

    def interaction(self, key: str) -> FakeInteraction:
        """A dispatched interaction by id or token."""
        return self._interactions[key]

    # scripting: failures and the gateway

    def rate_limit_next(self, path_substring: str, retry_after: float = 0.05, *, global_: bool = False) -> None:
        """Answer the next REST request whose "METHOD /path" (path after /api/v10) contains the text with 429."""
        self._rate_limits.append((path_substring, retry_after, global_))

    def fail_next(self, path_substring: str, status: int, code: int, message: str, *, after: int = 0) -> None:
        """Answer the next REST request whose "METHOD /path" contains the text with a Discord error
        (e.g. 403, 50013, "Missing Permissions"; 404, 10003, "Unknown Channel"; 503, 0, "upstream"), once `after`
        more such requests went through."""
        self._failures.append((path_substring, status, code, message, after))

    async def reconnect(self) -> None:
        """Send op 7 RECONNECT: the client reconnects to resume_gateway_url and RESUMEs."""
        conn = self._take_connection()
        async with self._send_lock:
            await self._send(conn, {"op": 7, "d": None, "s": None, "t": None})

    async def disconnect(self, code: int = 4000) -> None:
        """Close the gateway connection with a code (4000: the client resumes; 4004 and the like: it gives up)."""
        conn = self._take_connection()
        self.gateway_closes.append(code)
        await conn.ws.close(code=code, message=b"closed by the fake")

    async def invalidate_session(self, resumable: bool = False) -> None:
        """Send op 9 INVALID_SESSION (not resumable: discord.py sleeps 5 s before it identifies again)."""
        conn = self._take_connection()
        if not resumable:
            self._session = None
        async with self._send_lock:
            await self._send(conn, {"op": 9, "d": resumable, "s": None, "t": None})

    @property
    def connected(self) -> bool:
        """Whether a gateway connection is identified or resumed and receiving dispatches."""
        return self._conn is not None and self._conn.live

    @property
    def session_id(self) -> str | None:
        """The current gateway session id."""
        return self._session.id if self._session is not None else None

    @property
    def intents(self) -> int | None:
        """The intents of the current session."""
        return self._session.intents if self._session is not None else None

    # waiting

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until the latest gateway connection is identified or resumed."""
        await self.wait_for(lambda: self.connected, timeout, what="a ready gateway connection")

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until the bot has sent at least n channel messages; return `sent`."""
        try:
            await self.wait_for(lambda: len(self.sent) >= n, timeout, what=f"{n} sent message(s)")
        except TimeoutError as e:  # list what was sent only on failure (building it every call is quadratic)
            raise TimeoutError(f"{e}; sent so far: {[m.get('content') for m in self.sent]!r}") from None
        return self.sent

    # internals: ids, objects

    def _snowflake(self) -> str:
        """A new snowflake id, increasing, with the current time in it."""
        candidate = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
        self._last_id = max(candidate, self._last_id + 1)
        return str(self._last_id)

    def _recent(self) -> str:
        """The last REST requests, for timeout messages."""
        return f"recent requests: {self.requests[-6:]!r}"

    @staticmethod
    def _role(role_id: str, name: str, position: int) -> dict[str, Any]:
        """A role object."""
        return {
            "id": role_id,
            "name": name,
            "color": 0,
            "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": position,
            "permissions": str(DEFAULT_PERMISSIONS),
            "managed": False,
            "mentionable": False,
            "flags": 0,
        }

    def _add_member(self, user: dict[str, Any], *, roles: list[str], joined_at: str) -> None:
        """Make a user a member of the test guild with these roles."""
        self.members[user["id"]] = {"user": user, **_member_fields(roles, joined_at)}

    def _member_of(self, user: dict[str, Any]) -> dict[str, Any]:
        """The member object (without "user") of a user in the guild; a fresh one for non-members."""
        member = self.members.get(str(user["id"]))
        if member is None:
            return _member_fields([], _now())
        return {k: copy.deepcopy(v) for k, v in member.items() if k != "user"}

    def _add_guild_text_channel(self, channel_id: str, name: str, position: int) -> None:
        """Add a text channel to the guild."""
        self._channels[channel_id] = {
            "id": channel_id,
            "type": 0,
            "guild_id": self.guild_id,
            "name": name,
            "position": position,
            "parent_id": None,
            "topic": None,
            "nsfw": False,
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "permission_overwrites": [],
            "flags": 0,
        }

    def _channel_or_raise(self, channel_id: int | str) -> dict[str, Any]:
        """A known channel, or ValueError for test scripts."""
        channel = self._channels.get(str(channel_id))
        if channel is None:
            raise ValueError(f"unknown channel {channel_id}")
        return channel

    def _guild_create(self, intents: int) -> dict[str, Any]:
        """The GUILD_CREATE payload (members beyond the bot only with the GUILD_MEMBERS intent)."""
        members = list(self.members.values())
        if not intents & INTENT_GUILD_MEMBERS:
            members = [m for m in members if m["user"]["id"] == self.bot_user["id"]]
        guild_channels = [c for c in self._channels.values() if c.get("guild_id") == self.guild_id]
        return {
            **copy.deepcopy(self.guild),
            "joined_at": self.members[self.bot_user["id"]]["joined_at"],
            "large": False,
            "unavailable": False,
            "lazy": True,
            "member_count": len(self.members),
            "members": copy.deepcopy(members),
            "channels": copy.deepcopy([c for c in guild_channels if c["type"] not in (10, 11, 12)]),
            "threads": copy.deepcopy([c for c in guild_channels if c["type"] in (10, 11, 12)]),
            "presences": [],
            "voice_states": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
            "embedded_activities": [],
        }

    def _ready(self, session: _Session, shard: list[int] | None, has_guild: bool) -> dict[str, Any]:
        """The READY payload (the guild only on the shard that owns it)."""
        extra = {"shard": shard} if shard is not None else {}
        return {
            **extra,
            "v": API_VERSION,
            "user": {**self.bot_user, "verified": True, "mfa_enabled": False, "flags": 0},
            "guilds": [{"id": self.guild_id, "unavailable": True}] if has_guild else [],
            "session_id": session.id,
            "session_type": "normal",
            "resume_gateway_url": self.resume_gateway_url,
            "application": {"id": self.application_id, "flags": self._application_flags()},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": [],
            "user_settings": {},
            "_trace": ["fake-discord"],
        }

    def _application_flags(self) -> int:
        """ApplicationFlags matching the enabled privileged intents."""
        flags = 1 << 23  # APPLICATION_COMMAND_BADGE
        if self.enabled_intents & INTENT_GUILD_PRESENCES:
            flags |= 1 << 12
        if self.enabled_intents & INTENT_GUILD_MEMBERS:
            flags |= 1 << 14
        if self.enabled_intents & INTENT_MESSAGE_CONTENT:
            flags |= 1 << 18
        return flags

    def _attachment(
        self, channel_id: str, filename: str, data: bytes, content_type: str, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """An attachment object whose url serves data."""
        attachment_id = self._snowflake()
        self._files[attachment_id] = (content_type, data)
        url = f"{self.base_url}/attachments/{channel_id}/{attachment_id}/{filename}"
        attachment: dict[str, Any] = {
            "id": attachment_id,
            "filename": filename,
            "size": len(data),
            "url": url,
            "proxy_url": url,
            "content_type": content_type,
        }
        attachment.update(extra or {})
        return attachment

    def _new_message(self, channel: dict[str, Any], author: dict[str, Any], content: str) -> dict[str, Any]:
        """A message object in a channel (not yet stored); like Discord's, its timestamp is its id's time."""
        message_id = self._snowflake()
        message: dict[str, Any] = {
            "id": message_id,
            "type": 0,
            "channel_id": channel["id"],
            "author": copy.deepcopy(author),
            "content": content,
            "timestamp": _snowflake_time(message_id),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "components": [],
            "pinned": False,
            "flags": 0,
        }
        guild_id = channel.get("guild_id")
        if guild_id:
            message["guild_id"] = guild_id
            message["member"] = self._member_of(author)
        return message

    def _set_reference(
        self, message: dict[str, Any], replied: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> None:
        """Make message a reply (type 19) to replied."""
        reference: dict[str, Any] = {"type": 0, "message_id": replied["id"], "channel_id": replied["channel_id"]}
        if replied.get("guild_id"):
            reference["guild_id"] = replied["guild_id"]
        reference.update(extra or {})
        message["type"] = 19
        message["message_reference"] = reference
        message["referenced_message"] = self._wire({k: v for k, v in replied.items() if k != "referenced_message"})

    def _mentions(
        self, message: dict[str, Any], allowed: dict[str, Any] | None, replied: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        """The mentions array: known users mentioned in the content (and the replied author), per allowed_mentions."""
        content = str(message.get("content") or "")
        parse = allowed.get("parse", []) if isinstance(allowed, dict) else ["users"]
        explicit = {str(u) for u in allowed.get("users", [])} if isinstance(allowed, dict) else set()
        ids = [uid for uid in dict.fromkeys(_USER_MENTION_RE.findall(content)) if "users" in parse or uid in explicit]
        if replied is not None and (allowed is None or allowed.get("replied_user")):
            author_id = str(replied["author"]["id"])
            if author_id not in ids and author_id != str(message["author"]["id"]):
                ids.append(author_id)
        roles = _ROLE_MENTION_RE.findall(content)
        known_roles = {r["id"] for r in self.guild["roles"]}
        if message.get("guild_id"):
            message["mention_roles"] = [r for r in dict.fromkeys(roles) if r in known_roles]
        message["mention_everyone"] = "@everyone" in content and (allowed is None or "everyone" in parse)
        mentions: list[dict[str, Any]] = []
        for uid in ids:
            user = self._users.get(uid)
            if user is None:
                continue
            mention = copy.deepcopy(user)
            if message.get("guild_id"):
                mention["member"] = self._member_of(user)
            mentions.append(mention)
        return mentions

    def _store(self, message: dict[str, Any]) -> None:
        """Remember a message and bump its channel's last_message_id."""
        self._messages[message["id"]] = message
        channel = self._channels.get(message["channel_id"])
        if channel is not None and not int(message.get("flags") or 0) & EPHEMERAL:
            channel["last_message_id"] = message["id"]
            if channel.get("type") in (10, 11, 12):
                channel["message_count"] = channel.get("message_count", 0) + 1
                channel["total_message_sent"] = channel.get("total_message_sent", 0) + 1

    @staticmethod
    def _wire(message: dict[str, Any]) -> dict[str, Any]:
        """A message as sent on the wire (without request-only keys kept by the fake)."""
        return {k: copy.deepcopy(v) for k, v in message.items() if k != "allowed_mentions"}

    @staticmethod
    def _delete_event(message: dict[str, Any]) -> dict[str, Any]:
        """A MESSAGE_DELETE payload."""
        event = {"id": message["id"], "channel_id": message["channel_id"]}
        if message.get("guild_id"):
            event["guild_id"] = message["guild_id"]
        return event

    @staticmethod
    def _find_component(components: list[dict[str, Any]], custom_id: str) -> dict[str, Any] | None:
        """The component with custom_id anywhere in a component tree."""
        for component in components:
            if component.get("custom_id") == custom_id:
                return component
            children = list(component.get("components") or [])
            accessory = component.get("accessory")
            if isinstance(accessory, dict):
                children.append(accessory)
            found = FakeDiscord._find_component(children, custom_id)
            if found is not None:
                return found
        return None

    # internals: validation

    def _check_message(self, body: dict[str, Any], has_files: bool, path: list[str | int] | None = None) -> None:
        """Reject a message body the way Discord does (length, emptiness, embeds, components)."""
        prefix = path or []
        content = body.get("content")
        if content is not None and not isinstance(content, str):
            raise _invalid([*prefix, "content"], "STRING_TYPE_CONVERT", "Could not interpret the value as string.")
        if isinstance(content, str) and len(content) > MAX_CONTENT_LENGTH:
            raise _invalid(
                [*prefix, "content"], "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_CONTENT_LENGTH} or fewer in length."
            )
        flags = int(body.get("flags") or 0)
        if flags & IS_COMPONENTS_V2 and (content or body.get("embeds")):
            raise _invalid(
                [*prefix, "content"],
                "MESSAGE_CANNOT_USE_LEGACY_FIELDS_WITH_COMPONENTS_V2",
                "The 'content' and 'embeds' fields cannot be used when using MessageFlags.IS_COMPONENTS_V2",
            )
        embeds = body.get("embeds") or []
        if len(embeds) > 10:
            raise _invalid([*prefix, "embeds"], "BASE_TYPE_MAX_LENGTH", "Must be 10 or fewer in length.")
        total = 0
        for i, embed in enumerate(embeds):
            total += self._check_embed(embed, [*prefix, "embeds", i])
        if total > 6000:
            raise _invalid([*prefix, "embeds"], "MAX_EMBED_SIZE_EXCEEDED", "Embed size exceeds maximum size of 6000")
        self._check_components(body.get("components") or [], flags, [*prefix, "components"])
        allowed = body.get("allowed_mentions")
        if isinstance(allowed, dict):
            for kind in ("users", "roles"):
                if kind in (allowed.get("parse") or []) and allowed.get(kind):
                    raise _invalid(
                        [*prefix, "allowed_mentions"],
                        "ALLOWED_MENTIONS_PARSE_EXCLUSIVE",
                        f'parse:["{kind}"] and {kind}: [ids...] are mutually exclusive.',
                    )
        has_content = bool(content and content.strip()) or bool(embeds) or bool(body.get("components")) or has_files
        has_content = has_content or bool(body.get("sticker_ids")) or bool(body.get("poll"))
        if not has_content:
            raise _ApiError(400, 50006, "Cannot send an empty message")

    @staticmethod
    def _check_embed(embed: Any, path: list[str | int]) -> int:
        """Check one embed's limits; return its character count."""
        if not isinstance(embed, dict):
            raise _invalid(path, "DICT_TYPE_CONVERT", "Only dictionaries may be used in a DictType")
        limits = {"title": 256, "description": 4096}
        total = 0
        for key, limit in limits.items():
            value = str(embed.get(key) or "")
            if len(value) > limit:
                raise _invalid([*path, key], "BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length.")
            total += len(value)
        fields = embed.get("fields") or []
        if len(fields) > 25:
            raise _invalid([*path, "fields"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
        for i, item in enumerate(fields):
            for key, limit in (("name", 256), ("value", 1024)):
                value = str(item.get(key) or "")
                if not value:
                    raise _invalid([*path, "fields", i, key], "BASE_TYPE_REQUIRED", "This field is required")
                if len(value) > limit:
                    raise _invalid(
                        [*path, "fields", i, key], "BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length."
                    )
                total += len(value)
        for key, sub, limit in (("footer", "text", 2048), ("author", "name", 256)):
            part = embed.get(key)
            if isinstance(part, dict):
                value = str(part.get(sub) or "")
                if len(value) > limit:
                    raise _invalid([*path, key, sub], "BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length.")
                total += len(value)
        return total

    @staticmethod
    def _check_components(components: list[Any], flags: int, path: list[str | int]) -> None:
        """Check the legacy component rules: at most 5 rows, 5 buttons or 1 select a row, unique custom ids."""
        if not isinstance(components, list):
            raise _invalid(path, "LIST_TYPE_CONVERT", "Only iterables may be used in a ListType")
        seen: set[str] = set()

        def walk(items: list[Any], where: list[str | int]) -> None:
            for i, item in enumerate(items):
                if not isinstance(item, dict) or "type" not in item:
                    raise _invalid([*where, i, "type"], "BASE_TYPE_REQUIRED", "This field is required")
                custom_id = item.get("custom_id")
                if custom_id is not None:
                    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 100:
                        raise _invalid(
                            [*where, i, "custom_id"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length."
                        )
                    if custom_id in seen:
                        raise _invalid(
                            [*where, i, "custom_id"],
                            "COMPONENT_CUSTOM_ID_DUPLICATED",
                            "Component custom id cannot be duplicated",
                        )
                    seen.add(custom_id)
                if item["type"] == 2:
                    style = item.get("style")
                    if style == 5 and not item.get("url"):
                        raise _invalid([*where, i, "url"], "BASE_TYPE_REQUIRED", "This field is required")
                    if style not in (5, 6) and custom_id is None:
                        raise _invalid([*where, i, "custom_id"], "BASE_TYPE_REQUIRED", "This field is required")
                    if len(str(item.get("label") or "")) > 80:
                        raise _invalid([*where, i, "label"], "BASE_TYPE_MAX_LENGTH", "Must be 80 or fewer in length.")
                children = item.get("components")
                if isinstance(children, list):
                    walk(children, [*where, i, "components"])
                accessory = item.get("accessory")
                if isinstance(accessory, dict):
                    walk([accessory], [*where, i, "accessory"])

        if not flags & IS_COMPONENTS_V2:
            if len(components) > 5:
                raise _invalid(path, "BASE_TYPE_MAX_LENGTH", "Must be 5 or fewer in length.")
            for i, row in enumerate(components):
                if not isinstance(row, dict) or row.get("type") != 1:
                    raise _invalid([*path, i], "UNION_TYPE_CHOICES", 'Value of field "type" must be one of (1,).')
                children = row.get("components") or []
                if not children:
                    raise _invalid([*path, i, "components"], "BASE_TYPE_MIN_LENGTH", "Must be 1 or more in length.")
                selects = sum(1 for c in children if isinstance(c, dict) and c.get("type") in _SELECT_TYPES)
                if len(children) > 5 or (selects and len(children) > 1):
                    raise _invalid(
                        [*path, i, "components"],
                        "COMPONENT_LAYOUT_WIDTH_EXCEEDED",
                        "The specified component exceeds the maximum width",
                    )
        walk(components, path)

    # internals: building messages from bot requests

    def _edit(self, message: dict[str, Any], call: _Call) -> dict[str, Any]:
        """Apply an edit's JSON body to a stored message in place (checked, mentions recomputed); the body."""
        body = call.body if isinstance(call.body, dict) else {}
        updated = self._apply_body(message, body, call.uploads, editing=True)
        self._check_message(updated, bool(updated["attachments"]))
        updated["edited_timestamp"] = _now()
        updated["mentions"] = self._mentions(updated, updated.get("allowed_mentions"), None)
        message.clear()
        message.update(updated)
        return body

    def _apply_body(
        self, message: dict[str, Any], body: dict[str, Any], uploads: list[_Upload], *, editing: bool
    ) -> dict[str, Any]:
        """A copy of message with the fields of a create/edit body applied (and uploads attached)."""
        updated = copy.deepcopy(message)
        if "content" in body:
            updated["content"] = body["content"] or ""
        for key in ("embeds", "components"):
            if key in body:
                updated[key] = copy.deepcopy(body[key] or [])
        if body.get("poll"):
            updated["poll"] = copy.deepcopy(body["poll"])
        if "tts" in body and not editing:
            updated["tts"] = bool(body["tts"])
        if "flags" in body and body["flags"] is not None:
            keep = updated.get("flags", 0) & EPHEMERAL if editing else 0
            updated["flags"] = keep | (int(body["flags"]) & ~LOADING)
        if editing:
            updated["flags"] = int(updated.get("flags", 0)) & ~LOADING
        if "allowed_mentions" in body:
            updated["allowed_mentions"] = copy.deepcopy(body["allowed_mentions"])
        by_index = {u.index: u for u in uploads}
        if "attachments" in body or uploads:
            existing = {a["id"]: a for a in updated.get("attachments", [])}
            attachments: list[dict[str, Any]] = [] if "attachments" in body else list(existing.values())
            used: set[int] = set()
            for item in body.get("attachments") or []:
                item_id = str(item.get("id"))
                if item_id in existing:
                    attachments.append(existing[item_id])
                    continue
                try:
                    upload = by_index[int(item_id)]
                except (KeyError, ValueError):
                    raise _invalid(["attachments"], "ATTACHMENT_NOT_FOUND", "Unknown attachment") from None
                used.add(upload.index)
                extra = {k: v for k, v in item.items() if k in ("description", "title", "duration_secs", "waveform")}
                attachments.append(
                    self._attachment(
                        updated["channel_id"],
                        str(item.get("filename") or upload.filename),
                        upload.data,
                        upload.content_type,
                        extra,
                    )
                )
            for upload in uploads:
                if upload.index not in used:
                    attachments.append(
                        self._attachment(updated["channel_id"], upload.filename, upload.data, upload.content_type)
                    )
            updated["attachments"] = attachments
        return updated

    def _bot_message(self, channel: dict[str, Any], body: dict[str, Any], uploads: list[_Upload]) -> dict[str, Any]:
        """Validate a create body and build the bot's message (not yet stored)."""
        if not isinstance(body, dict):
            raise _ApiError(400, 50109, "The request body contains invalid JSON.")
        self._check_message(body, bool(uploads))
        message = self._apply_body(self._new_message(channel, self.bot_user, ""), body, uploads, editing=False)
        reference = body.get("message_reference")
        replied: dict[str, Any] | None = None
        if isinstance(reference, dict) and reference.get("type", 0) == 0:
            replied = self._messages.get(str(reference.get("message_id")))
            if replied is None or (
                reference.get("channel_id") and str(reference["channel_id"]) != replied["channel_id"]
            ):
                if reference.get("fail_if_not_exists", True):
                    raise _invalid(["message_reference"], "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "Unknown message")
                replied = None
            if replied is not None:
                extra = {k: v for k, v in reference.items() if k not in ("message_id", "channel_id", "guild_id")}
                self._set_reference(message, replied, extra)
        message["mentions"] = self._mentions(message, body.get("allowed_mentions"), replied)
        if body.get("nonce") is not None:
            message["nonce"] = body["nonce"]
        return message

    # internals: gateway

    def _visible(self, event: str, data: Any, intents: int) -> Any:
        """The payload a session with these intents receives (None when the intents filter it out)."""
        if event.startswith("MESSAGE_") and isinstance(data, dict):
            guild = bool(data.get("guild_id"))
            if not intents & (INTENT_GUILD_MESSAGES if guild else INTENT_DIRECT_MESSAGES):
                return None
            if event in ("MESSAGE_CREATE", "MESSAGE_UPDATE") and guild and not intents & INTENT_MESSAGE_CONTENT:
                author_id = str((data.get("author") or {}).get("id"))
                mentioned = any(str(m.get("id")) == self.bot_user["id"] for m in data.get("mentions") or [])
                if author_id != self.bot_user["id"] and not mentioned:
                    data = {**data, "content": "", "embeds": [], "attachments": [], "components": []}
                    data.pop("poll", None)
        return data

    def _append(self, session: _Session, event: str, data: Any) -> None:
        """Add a dispatch to a session's history (a JSON snapshot, filtered by its intents)."""
        visible = self._visible(event, data, session.intents)
        if visible is not None:
            session.history.append((event, json.loads(json.dumps(visible))))

    async def _dispatch(self, event: str, data: Any) -> None:
        """Dispatch an event to its shard: sent now when a connection is live, else kept for the resume or next
        identify."""
        slot = self._slots.setdefault(self.shard_of(data.get("guild_id") if isinstance(data, dict) else None), _Slot())
        if slot.session is None:
            slot.pending.append((event, json.loads(json.dumps(data))))
        else:
            self._append(slot.session, event, data)
        self._notify()
        await self._flush()

    async def _send(self, conn: _Connection, frame: dict[str, Any]) -> bool:
        """Write one frame as a text message; False when the socket is gone."""
        if conn.ws.closed:
            return False
        try:
            await conn.ws.send_str(json.dumps(frame))
        except (ConnectionError, RuntimeError):
            return False
        return True

    async def _flush(self) -> None:
        """Send each shard's current connection every history entry it has not had yet, in order."""
        async with self._send_lock:
            for slot in list(self._slots.values()):
                await self._flush_slot(slot)

    async def _flush_slot(self, slot: _Slot) -> None:
        """One shard's part of _flush (the send lock held)."""
        conn = slot.conn
        while conn is not None and conn is slot.conn and conn.live and conn.session is not None:
            session = conn.session
            if conn.cursor >= len(session.history):
                break
            event, data = session.history[conn.cursor]
            conn.cursor += 1
            if not await self._send(conn, {"op": 0, "t": event, "s": conn.cursor, "d": data}):
                conn.live = False
                conn.cursor -= 1
                break
            session.delivered = max(session.delivered, conn.cursor)

    def _take_connection(self) -> _Connection:
        """Detach the current connection (it no longer receives dispatches)."""
        conn = self._conn
        if conn is None:
            raise RuntimeError("no gateway connection")
        conn.live = False
        self._conn = None
        self._notify()
        return conn

    async def _close(self, conn: _Connection, code: int, reason: str) -> None:
        """Close a connection with a gateway close code."""
        conn.live = False
        self._detach(conn)
        self.gateway_closes.append(code)
        self._notify()
        await conn.ws.close(code=code, message=reason.encode())

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        """One gateway websocket: HELLO, then identify/resume, heartbeats and dispatches."""
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        conn = _Connection(ws=ws, path=request.path)
        self.gateway_connections.append(request.path)
        self._sockets.add(ws)
        self._notify()
        try:
            async with self._send_lock:
                await self._send(
                    conn, {"op": 10, "d": {"heartbeat_interval": HEARTBEAT_INTERVAL_MS}, "s": None, "t": None}
                )
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    continue
                try:
                    frame = json.loads(msg.data)
                except ValueError:
                    await self._close(conn, 4002, "Error while decoding payload.")
                    break
                if not isinstance(frame, dict):
                    await self._close(conn, 4002, "Error while decoding payload.")
                    break
                await self._on_frame(conn, frame)
        finally:
            conn.live = False
            self._detach(conn)
            self._sockets.discard(ws)
            self._notify()
        return ws

    def _detach(self, conn: _Connection) -> None:
        """A connection that ended is no longer its shard's current one."""
        slot = self._slots.get(conn.shard)
        if slot is not None and slot.conn is conn:
            slot.conn = None

    def _attach(self, conn: _Connection, shard: int) -> _Slot:
        """Make a connection that identified or resumed its shard's current one (an older one stops receiving)."""
        slot = self._slots.setdefault(shard, _Slot())
        if slot.conn is not None and slot.conn is not conn:
            slot.conn.live = False
        conn.shard, slot.conn = shard, conn
        return slot

    async def _on_frame(self, conn: _Connection, frame: dict[str, Any]) -> None:
        """Handle one client gateway payload."""
        op = frame.get("op")
        data = frame.get("d")
        if op == 1:
            self.heartbeats += 1
            async with self._send_lock:
                await self._send(conn, {"op": 11, "d": None, "s": None, "t": None})
        elif op == 2:
            await self._identify(conn, data)
        elif op == 6:
            await self._resume(conn, data)
        elif op in (3, 4, 8):
            if conn.session is None:
                await self._close(conn, 4003, "Not authenticated.")
            elif op == 3:
                self.presence_updates.append(data)
            elif op == 8 and isinstance(data, dict):
                await self._request_members(data)
        else:
            await self._close(conn, 4001, "Unknown opcode.")

    async def _identify(self, conn: _Connection, data: Any) -> None:
        """IDENTIFY: start a new session (READY, GUILD_CREATE, then anything never delivered)."""
        if conn.session is not None:
            await self._close(conn, 4005, "Already authenticated.")
            return
        if not isinstance(data, dict) or data.get("token") != self.token:
            await self._close(conn, 4004, "Authentication failed.")
            return
        intents = data.get("intents")
        if not isinstance(intents, int) or intents < 0 or intents >= 1 << 26:
            await self._close(conn, 4013, "Invalid intent(s).")
            return
        if intents & PRIVILEGED_INTENTS & ~self.enabled_intents:
            await self._close(conn, 4014, "Disallowed intent(s).")
            return
        shard = data.get("shard")
        if shard is not None:
            valid = isinstance(shard, list) and len(shard) == 2 and all(type(x) is int for x in shard)
            if not valid or not 0 <= shard[0] < shard[1]:
                await self._close(conn, 4010, "Invalid shard.")
                return
            self.shard_count = shard[1]
        elif self.shard_count != 1:  # an unsharded client after sharded ones: everything goes to it again
            self.shard_count = 1
        self.identified_shards.append(shard)
        slot = self._attach(conn, shard[0] if shard is not None else 0)
        carry = list(slot.pending)
        slot.pending.clear()
        old = slot.session
        if old is not None:
            carry = [(t, d) for t, d in old.history[old.delivered :] if t not in _EVENT_ONLY] + carry
        session = _Session(id=secrets.token_hex(16), intents=intents)
        slot.session = session
        self.identify_count += 1
        has_guild = self.shard_of(self.guild_id) == conn.shard
        self._append(session, "READY", self._ready(session, shard, has_guild))
        if has_guild:
            self._append(session, "GUILD_CREATE", self._guild_create(intents))
        for event, payload in carry:
            self._append(session, event, payload)
        conn.session = session
        conn.cursor = 0
        conn.live = True
        self._notify()
        await self._flush()

    async def _resume(self, conn: _Connection, data: Any) -> None:
        """RESUME: replay what the client missed, then RESUMED (op 9 when the session is unknown)."""
        if not isinstance(data, dict) or data.get("token") != self.token:
            await self._close(conn, 4004, "Authentication failed.")
            return
        shard = next((k for k, v in self._slots.items() if v.session and v.session.id == data.get("session_id")), 0)
        session = self._slots[shard].session
        seq = data.get("seq") or 0
        if session is None or data.get("session_id") != session.id or not isinstance(seq, int):
            invalid = True
        else:
            invalid = not 0 <= seq <= len(session.history)
        if invalid or session is None:
            async with self._send_lock:
                await self._send(conn, {"op": 9, "d": False, "s": None, "t": None})
            return
        self._attach(conn, shard)
        conn.session = session
        conn.cursor = seq
        self._append(session, "RESUMED", {"_trace": ["fake-discord"]})
        self.resume_count += 1
        conn.live = True
        self._notify()
        await self._flush()

    async def _request_members(self, data: dict[str, Any]) -> None:
        """REQUEST_GUILD_MEMBERS: one GUILD_MEMBERS_CHUNK."""
        members = list(self.members.values())
        user_ids = data.get("user_ids")
        not_found: list[str] = []
        if user_ids:
            wanted = [str(u) for u in (user_ids if isinstance(user_ids, list) else [user_ids])]
            not_found = [u for u in wanted if u not in self.members]
            members = [m for m in members if m["user"]["id"] in wanted]
        elif data.get("query"):
            query = str(data["query"]).lower()
            members = [m for m in members if m["user"]["username"].lower().startswith(query)]
        limit = int(data.get("limit") or 0)
        if limit:
            members = members[:limit]
        chunk: dict[str, Any] = {
            "guild_id": str(data.get("guild_id")),
            "members": copy.deepcopy(members),
            "chunk_index": 0,
            "chunk_count": 1,
            "not_found": not_found,
        }
        if data.get("nonce"):
            chunk["nonce"] = data["nonce"]
        if data.get("presences"):
            chunk["presences"] = []
        await self._dispatch("GUILD_MEMBERS_CHUNK", chunk)

    # internals: interactions

    def _find_command(self, name: str, dm: bool) -> dict[str, Any] | None:
        """A registered chat-input command by name (guild commands first, not in DMs)."""
        pools = [self.commands] if dm else [self.guild_commands.get(self.guild_id, []), self.commands]
        for pool in pools:
            for command in pool:
                if command["name"] == name and command.get("type", 1) == 1:
                    return command
        return None

    def _build_options(
        self, name: str, definitions: list[dict[str, Any]], values: dict[str, Any], channel: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Interaction options (typed per the command's definitions) and their resolved objects."""
        known = {o["name"]: o for o in definitions}
        for option in definitions:
            if option.get("required") and option["name"] not in values:
                raise ValueError(f"{name!r}: required option {option['name']!r} is missing")
        built: list[dict[str, Any]] = []
        resolved: dict[str, Any] = {}
        for key, raw in values.items():
            definition = known.get(key)
            if definition is None:
                raise ValueError(f"{name!r} has no option {key!r} (has {sorted(known)})")
            kind = int(definition.get("type", 3))
            value: Any = raw
            if kind == 4:
                value = int(raw)
            elif kind == 10:
                value = float(raw)
            elif kind == 5:
                value = raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes")
            elif kind in _SNOWFLAKE_OPTION_TYPES:
                value = str(raw)
            else:
                value = str(raw)
            choices = definition.get("choices")
            if choices and value not in [c.get("value") for c in choices]:
                raise ValueError(f"{name!r}: {value!r} is not a choice of {key!r}")
            if kind in (6, 9) and value in self._users:
                resolved.setdefault("users", {})[value] = copy.deepcopy(self._users[value])
                if channel.get("guild_id") and value in self.members:
                    member = self._member_of(self._users[value])
                    member["permissions"] = str(DEFAULT_PERMISSIONS)
                    resolved.setdefault("members", {})[value] = member
            if kind in (7, 9) and value in self._channels:
                target = self._channels[value]
                resolved.setdefault("channels", {})[value] = {
                    k: target[k] for k in ("id", "type", "name", "parent_id", "thread_metadata") if k in target
                } | {"permissions": str(DEFAULT_PERMISSIONS)}
            built.append({"name": key, "type": kind, "value": value})
        return built, resolved

    async def _interact(
        self,
        kind: int,
        data: dict[str, Any],
        user: dict[str, Any],
        channel: dict[str, Any],
        message: dict[str, Any] | None,
        *,
        owners: dict[str, str] | None = None,
        locale: str = "en-US",
    ) -> FakeInteraction:
        """Build, remember and dispatch an INTERACTION_CREATE (`owners`: authorizing_integration_owners, by default
        the server install, or the user's install in a group DM)."""
        payload: dict[str, Any] = {
            "id": self._snowflake(),
            "application_id": self.application_id,
            "type": kind,
            "data": data,
            "token": "aW50ZXJhY3Rpb246" + secrets.token_urlsafe(48),
            "version": 1,
            "locale": locale,
            "app_permissions": str(DEFAULT_PERMISSIONS),
            "entitlements": [],
            "entitlement_sku_ids": [],
            "attachment_size_limit": ATTACHMENT_SIZE_LIMIT,
            "channel_id": channel["id"],
        }
        guild_id = channel.get("guild_id")
        if guild_id:
            member = {**self._member_of(user), "user": copy.deepcopy(user), "permissions": str(DEFAULT_PERMISSIONS)}
            payload.update(
                guild_id=guild_id,
                guild={"id": guild_id, "locale": "en-US", "features": []},
                guild_locale="en-US",
                member=member,
                channel={**copy.deepcopy(channel), "permissions": str(DEFAULT_PERMISSIONS)},
                context=0,
                authorizing_integration_owners=owners or {"0": guild_id},
            )
        else:
            context = _context_of(channel)
            payload.update(
                user=copy.deepcopy(user),
                channel=copy.deepcopy(channel),
                context=context,
                authorizing_integration_owners=owners or ({"1": str(user["id"])} if context == 2 else {"0": "0"}),
            )
        if message is not None:
            payload["message"] = self._wire(message)
        interaction = FakeInteraction(self, payload)
        interaction.clicked = message
        self.interactions.append(interaction)
        self._interactions[interaction.id] = interaction
        self._interactions[interaction.token] = interaction
        await self._dispatch("INTERACTION_CREATE", payload)
        return interaction

    def _interaction_message(
        self, it: FakeInteraction, body: dict[str, Any], uploads: list[_Upload], *, original: bool
    ) -> dict[str, Any]:
        """A message the bot sends through an interaction (response or followup), not yet stored."""
        channel = self._channels[it.payload["channel_id"]]
        if not isinstance(body, dict):
            raise _ApiError(400, 50109, "The request body contains invalid JSON.")
        message = self._apply_body(self._new_message(channel, self.bot_user, ""), body, uploads, editing=False)
        message["type"] = 20 if it.type == _APPLICATION_COMMAND and original else 0
        message["webhook_id"] = self.application_id
        message["application_id"] = self.application_id
        user = it.payload.get("user") or it.payload["member"]["user"]
        metadata: dict[str, Any] = {
            "id": it.id,
            "type": it.type,
            "user": copy.deepcopy(user),
            "authorizing_integration_owners": it.payload["authorizing_integration_owners"],
        }
        if it.type == _APPLICATION_COMMAND:
            metadata["name"] = it.payload["data"]["name"]
            metadata["command_type"] = it.payload["data"].get("type", 1)
        elif it.clicked is not None:
            metadata["interacted_message_id"] = it.clicked["id"]
        if not original and it.message is not None:
            metadata["original_response_message_id"] = it.message["id"]
        message["interaction_metadata"] = metadata
        message["mentions"] = self._mentions(message, body.get("allowed_mentions"), None)
        return message

    async def _publish(self, message: dict[str, Any], event: str) -> None:
        """Dispatch a bot message event unless the message is ephemeral."""
        if not int(message.get("flags") or 0) & EPHEMERAL:
            await self._dispatch(event, message)

    def _interaction_for(self, call: _Call) -> FakeInteraction:
        """The interaction a webhook route addresses (404 Unknown Webhook otherwise)."""
        if call.params.get("app_id") != self.application_id:
            raise _not_found(10015, "Webhook")
        it = self._interactions.get(call.params["token"])
        if it is None or not it.responded:
            raise _not_found(10015, "Webhook")
        return it

    def _webhook_message(self, it: FakeInteraction, message_id: str) -> dict[str, Any]:
        """@original or a followup of an interaction (404 Unknown Message otherwise)."""
        if message_id == "@original":
            message = it.message
        else:
            message = it._messages.get(message_id)
        if message is None:
            raise _not_found(10008, "Message")
        return message

    # REST routes

    def _install_routes(self) -> None:
        """The REST routes: (method, path regex, handler, needs bot authorization)."""
        snowflake = r"(?P<{}>\d+)"
        cid = snowflake.format("channel_id")
        mid = snowflake.format("message_id")
        gid = snowflake.format("guild_id")
        app = snowflake.format("app_id")
        cmd = snowflake.format("command_id")
        token = r"(?P<token>[^/]+)"
        webhook_message = r"(?P<message_id>@original|\d+)"
        table: list[tuple[str, str, RouteHandler, bool]] = [
            ("GET", r"/users/@me", self._r_get_me, True),
            ("GET", r"/users/" + snowflake.format("user_id"), self._r_get_user, True),
            ("POST", r"/users/@me/channels", self._r_create_dm, True),
            ("GET", r"/oauth2/applications/@me", self._r_app_info, True),
            ("GET", r"/applications/@me", self._r_app_info, True),
            ("GET", r"/gateway", self._r_gateway, False),
            ("GET", r"/gateway/bot", self._r_gateway, True),
            ("GET", rf"/channels/{cid}", self._r_get_channel, True),
            ("GET", rf"/channels/{cid}/messages", self._r_list_messages, True),
            ("POST", rf"/channels/{cid}/messages", self._r_create_message, True),
            ("GET", rf"/channels/{cid}/messages/{mid}", self._r_get_message, True),
            ("PATCH", rf"/channels/{cid}/messages/{mid}", self._r_edit_message, True),
            ("DELETE", rf"/channels/{cid}/messages/{mid}", self._r_delete_message, True),
            ("PUT", rf"/channels/{cid}/messages/{mid}/reactions/(?P<emoji>[^/]+)/@me", self._r_react, True),
            ("DELETE", rf"/channels/{cid}/messages/{mid}/reactions/(?P<emoji>[^/]+)/@me", self._r_unreact, True),
            ("POST", rf"/channels/{cid}/typing", self._r_typing, True),
            ("GET", rf"/guilds/{gid}", self._r_get_guild, True),
            ("GET", rf"/guilds/{gid}/channels", self._r_guild_channels, True),
            ("GET", rf"/guilds/{gid}/members/" + snowflake.format("user_id"), self._r_get_member, True),
            ("GET", rf"/applications/{app}/commands", self._r_get_commands, True),
            ("PUT", rf"/applications/{app}/commands", self._r_put_commands, True),
            ("POST", rf"/applications/{app}/commands", self._r_post_command, True),
            ("GET", rf"/applications/{app}/commands/{cmd}", self._r_get_command, True),
            ("PATCH", rf"/applications/{app}/commands/{cmd}", self._r_patch_command, True),
            ("DELETE", rf"/applications/{app}/commands/{cmd}", self._r_delete_command, True),
            ("GET", rf"/applications/{app}/guilds/{gid}/commands", self._r_get_commands, True),
            ("PUT", rf"/applications/{app}/guilds/{gid}/commands", self._r_put_commands, True),
            ("POST", rf"/applications/{app}/guilds/{gid}/commands", self._r_post_command, True),
            ("GET", rf"/applications/{app}/guilds/{gid}/commands/{cmd}", self._r_get_command, True),
            ("PATCH", rf"/applications/{app}/guilds/{gid}/commands/{cmd}", self._r_patch_command, True),
            ("DELETE", rf"/applications/{app}/guilds/{gid}/commands/{cmd}", self._r_delete_command, True),
            ("POST", r"/interactions/(?P<interaction_id>\d+)/" + token + "/callback", self._r_callback, False),
            ("POST", rf"/webhooks/{app}/{token}", self._r_followup, False),
            ("GET", rf"/webhooks/{app}/{token}/messages/{webhook_message}", self._r_get_webhook_message, False),
            ("PATCH", rf"/webhooks/{app}/{token}/messages/{webhook_message}", self._r_edit_webhook_message, False),
            ("DELETE", rf"/webhooks/{app}/{token}/messages/{webhook_message}", self._r_delete_webhook_message, False),
        ]
        self._routes = [(method, re.compile(pattern), handler, auth) for method, pattern, handler, auth in table]

    async def _r_get_me(self, call: _Call) -> Any:
        """GET /users/@me."""
        return {**self.bot_user, "verified": True, "mfa_enabled": False, "locale": "en-US", "flags": 0, "email": None}

    async def _r_get_user(self, call: _Call) -> Any:
        """GET /users/{id}."""
        user = self._users.get(call.params["user_id"])
        if user is None:
            raise _not_found(10013, "User")
        return user

    async def _r_app_info(self, call: _Call) -> Any:
        """GET /oauth2/applications/@me."""
        return {
            "id": self.application_id,
            "name": self.bot_user["username"],
            "icon": None,
            "description": "",
            "summary": "",
            "type": None,
            "hook": True,
            "bot_public": False,
            "bot_require_code_grant": False,
            "verify_key": "0" * 64,
            "flags": self._application_flags(),
            "owner": self.owner,
            "team": None,
            "bot": self.bot_user,
            "rpc_origins": [],
            "redirect_uris": [],
            "tags": [],
            "interactions_endpoint_url": None,  # set, it would make discord.py warn that it gets no interactions
            "role_connections_verification_url": None,
            "approximate_guild_count": 1,
            "integration_types_config": {"0": {}},
        }

    async def _r_gateway(self, call: _Call) -> Any:
        """GET /gateway and /gateway/bot."""
        body: dict[str, Any] = {"url": self.gateway_url.rstrip("/")}
        if call.path.endswith("/bot"):
            body["shards"] = 1
            body["session_start_limit"] = {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}
        return body

    async def _r_create_dm(self, call: _Call) -> Any:
        """POST /users/@me/channels {recipient_id}."""
        recipient = call.body.get("recipient_id") if isinstance(call.body, dict) else None
        if recipient is None:
            raise _invalid(["recipient_id"], "BASE_TYPE_REQUIRED", "This field is required")
        return self._channels[self.dm_channel_id(recipient)]

    def _channel(self, call: _Call) -> dict[str, Any]:
        """The channel of a route (404 Unknown Channel otherwise)."""
        channel = self._channels.get(call.params["channel_id"])
        if channel is None:
            raise _not_found(10003, "Channel")
        return channel

    def _channel_message(self, call: _Call) -> dict[str, Any]:
        """The message of a route (404 Unknown Channel / Unknown Message otherwise)."""
        channel = self._channel(call)
        message = self._messages.get(call.params["message_id"])
        if message is None or message["channel_id"] != channel["id"] or int(message.get("flags") or 0) & EPHEMERAL:
            raise _not_found(10008, "Message")
        return message

    async def _r_get_channel(self, call: _Call) -> Any:
        """GET /channels/{id}."""
        return self._channel(call)

    async def _r_list_messages(self, call: _Call) -> Any:
        """GET /channels/{id}/messages (newest first; before/after/around-less paging)."""
        channel = self._channel(call)
        messages = [m for m in self.messages_in(channel["id"]) if not int(m.get("flags") or 0) & EPHEMERAL]
        if "before" in call.query:
            messages = [m for m in messages if int(m["id"]) < int(call.query["before"])]
        if "after" in call.query:
            messages = [m for m in messages if int(m["id"]) > int(call.query["after"])]
        limit = max(1, min(int(call.query.get("limit", "50")), 100))
        if "after" in call.query:
            messages = messages[:limit]
        else:
            messages = messages[-limit:]
        return [self._wire(m) for m in reversed(messages)]

    async def _r_create_message(self, call: _Call) -> Any:
        """POST /channels/{id}/messages: store, record in `sent`, dispatch MESSAGE_CREATE, answer the message."""
        channel = self._channel(call)
        body = call.body if call.body is not None else {}
        if isinstance(body, dict) and body.get("enforce_nonce") and body.get("nonce") is not None:
            earlier = self._nonces.get(str(body["nonce"]))
            if earlier is not None:
                return self._wire(earlier)
        message = self._bot_message(channel, body, call.uploads)
        self._store(message)
        if isinstance(body, dict) and body.get("enforce_nonce") and body.get("nonce") is not None:
            self._nonces[str(body["nonce"])] = message
        self.sent.append(message)
        await self._dispatch("MESSAGE_CREATE", message)
        return self._wire(message)

    async def _r_get_message(self, call: _Call) -> Any:
        """GET /channels/{cid}/messages/{mid}."""
        return self._wire(self._channel_message(call))

    async def _r_edit_message(self, call: _Call) -> Any:
        """PATCH /channels/{cid}/messages/{mid}: only the bot's own messages."""
        message = self._channel_message(call)
        if message["author"]["id"] != self.bot_user["id"]:
            raise _ApiError(403, 50005, "Cannot edit a message authored by another user")
        body = self._edit(message, call)
        self.edits.append({**copy.deepcopy(body), "message_id": message["id"]})
        await self._dispatch("MESSAGE_UPDATE", message)
        return self._wire(message)

    async def _r_delete_message(self, call: _Call) -> Any:
        """DELETE /channels/{cid}/messages/{mid}."""
        message = self._channel_message(call)
        del self._messages[message["id"]]
        message["deleted"] = True
        self.deleted.append(message["id"])
        await self._dispatch("MESSAGE_DELETE", self._delete_event(message))
        return None

    async def _r_react(self, call: _Call) -> Any:
        """PUT .../reactions/{emoji}/@me."""
        message = self._channel_message(call)
        self.reactions.append((message["id"], call.params["emoji"]))
        return None

    async def _r_unreact(self, call: _Call) -> Any:
        """DELETE .../reactions/{emoji}/@me."""
        message = self._channel_message(call)
        key = (message["id"], call.params["emoji"])
        if key in self.reactions:
            self.reactions.remove(key)
        return None

    async def _r_typing(self, call: _Call) -> Any:
        """POST /channels/{id}/typing."""
        self.typing.append(self._channel(call)["id"])
        return None

    def _guild(self, call: _Call) -> dict[str, Any]:
        """The guild of a route (404 Unknown Guild otherwise)."""
        if call.params["guild_id"] != self.guild_id:
            raise _not_found(10004, "Guild")
        return self.guild

    async def _r_get_guild(self, call: _Call) -> Any:
        """GET /guilds/{id}."""
        guild = self._guild(call)
        return {**guild, "approximate_member_count": len(self.members), "approximate_presence_count": 0}

    async def _r_guild_channels(self, call: _Call) -> Any:
        """GET /guilds/{id}/channels."""
        self._guild(call)
        return [c for c in self._channels.values() if c.get("guild_id") == self.guild_id and c["type"] not in (11, 12)]

    async def _r_get_member(self, call: _Call) -> Any:
        """GET /guilds/{gid}/members/{uid}."""
        self._guild(call)
        member = self.members.get(call.params["user_id"])
        if member is None:
            raise _not_found(10007, "Member")
        return member

    def _command_pool(self, call: _Call) -> list[dict[str, Any]]:
        """The global or guild command list a route addresses."""
        if call.params["app_id"] != self.application_id:
            raise _not_found(10002, "Application")
        guild_id = call.params.get("guild_id")
        if guild_id is None:
            return self.commands
        if guild_id != self.guild_id:
            raise _ApiError(403, 50001, "Missing Access")
        return self.guild_commands.setdefault(guild_id, [])

    def _check_command(self, command: Any, index: int | None) -> None:
        """Discord's rules for an application command definition."""
        where: list[str | int] = [] if index is None else [index]
        if not isinstance(command, dict):
            raise _invalid(where, "DICT_TYPE_CONVERT", "Only dictionaries may be used in a DictType")
        kind = command.get("type", 1)
        name = command.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= 32:
            raise _invalid([*where, "name"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 32 in length.")
        description = command.get("description") or ""
        if kind == 1:
            if not _NAME_RE.fullmatch(name) or name != name.lower():
                raise _invalid([*where, "name"], "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid")
            if not 1 <= len(description) <= 100:
                raise _invalid([*where, "description"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
        elif description:
            raise _invalid(
                [*where, "description"],
                "APPLICATION_COMMAND_CONTEXT_MENU_DESCRIPTION",
                "Context menu commands cannot have description",
            )
        self._check_options(command.get("options") or [], [*where, "options"], depth=0)

    def _check_options(self, options: list[Any], where: list[str | int], depth: int) -> None:
        """Option rules: at most 25, valid names, required before optional, nesting of subcommands."""
        if len(options) > 25:
            raise _invalid(where, "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
        seen_optional = False
        names: set[str] = set()
        for i, option in enumerate(options):
            name = str(option.get("name", ""))
            if not _NAME_RE.fullmatch(name) or name != name.lower():
                raise _invalid([*where, i, "name"], "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid")
            if name in names:
                raise _invalid(
                    [*where, i, "name"], "APPLICATION_COMMAND_OPTIONS_NAME_ALREADY_EXISTS", "Option name already exists"
                )
            names.add(name)
            if not 1 <= len(str(option.get("description") or "")) <= 100:
                raise _invalid(
                    [*where, i, "description"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length."
                )
            kind = option.get("type")
            if kind in (1, 2):
                if depth >= (1 if kind == 2 else 2):
                    raise _invalid([*where, i, "type"], "APPLICATION_COMMAND_OPTION_TYPE_INVALID", "Invalid nesting")
                self._check_options(option.get("options") or [], [*where, i, "options"], depth + 1)
                continue
            if option.get("required"):
                if seen_optional:
                    raise _invalid(
                        [*where, i, "required"],
                        "APPLICATION_COMMAND_OPTIONS_REQUIRED_INVALID",
                        "Required options must be placed before non-required options",
                    )
            else:
                seen_optional = True
            if len(option.get("choices") or []) > 25:
                raise _invalid([*where, i, "choices"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")

    def _stored_command(
        self, command: dict[str, Any], guild_id: str | None, old: dict[str, Any] | None
    ) -> dict[str, Any]:
        """A command as Discord stores it (keeping the id of an existing command with the same name and type)."""
        stored: dict[str, Any] = {
            "id": old["id"] if old is not None else self._snowflake(),
            "application_id": self.application_id,
            "version": self._snowflake(),
            "type": command.get("type", 1),
            "name": command["name"],
            "name_localizations": command.get("name_localizations"),
            "description": command.get("description") or "",
            "description_localizations": command.get("description_localizations"),
            "default_member_permissions": command.get("default_member_permissions"),
            "nsfw": bool(command.get("nsfw", False)),
            "contexts": command.get("contexts"),
            "integration_types": command.get("integration_types") or [0],
        }
        if command.get("options"):
            stored["options"] = copy.deepcopy(command["options"])
        if guild_id is not None:
            stored["guild_id"] = guild_id
        else:
            stored["dm_permission"] = command.get("dm_permission", True) is not False
        return stored

    async def _r_get_commands(self, call: _Call) -> Any:
        """GET application commands."""
        return self._command_pool(call)

    async def _r_put_commands(self, call: _Call) -> Any:
        """PUT application commands (bulk overwrite)."""
        pool = self._command_pool(call)
        body = call.body
        if not isinstance(body, list):
            raise _ApiError(
                400,
                50035,
                "Invalid Form Body",
                {"_errors": [{"code": "LIST_TYPE_CONVERT", "message": "Only iterables may be used in a ListType"}]},
            )
        if len(body) > 100:
            raise _ApiError(400, 30032, "Maximum number of application commands reached (100)")
        keys: set[tuple[str, int]] = set()
        for i, command in enumerate(body):
            self._check_command(command, i)
            key = (command["name"], int(command.get("type", 1)))
            if key in keys:
                raise _invalid(
                    [i, "name"], "APPLICATION_COMMANDS_DUPLICATE_NAME", "Application command names must be unique"
                )
            keys.add(key)
        old = {(c["name"], c["type"]): c for c in pool}
        guild_id = call.params.get("guild_id")
        pool[:] = [self._stored_command(c, guild_id, old.get((c["name"], int(c.get("type", 1))))) for c in body]
        self.command_puts += 1
        return pool

    async def _r_post_command(self, call: _Call) -> Any:
        """POST one application command (create or overwrite by name)."""
        pool = self._command_pool(call)
        self._check_command(call.body, None)
        key = (call.body["name"], int(call.body.get("type", 1)))
        old = next((c for c in pool if (c["name"], c["type"]) == key), None)
        stored = self._stored_command(call.body, call.params.get("guild_id"), old)
        if old is not None:
            pool[pool.index(old)] = stored
        else:
            pool.append(stored)
        return stored

    def _command(self, call: _Call) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The pool and command a route addresses."""
        pool = self._command_pool(call)
        command = next((c for c in pool if c["id"] == call.params["command_id"]), None)
        if command is None:
            raise _not_found(10063, "application command")
        return pool, command

    async def _r_get_command(self, call: _Call) -> Any:
        """GET one application command."""
        return self._command(call)[1]

    async def _r_patch_command(self, call: _Call) -> Any:
        """PATCH one application command."""
        pool, command = self._command(call)
        merged = {**command, **(call.body if isinstance(call.body, dict) else {})}
        self._check_command(merged, None)
        stored = self._stored_command(merged, call.params.get("guild_id"), command)
        pool[pool.index(command)] = stored
        return stored

    async def _r_delete_command(self, call: _Call) -> Any:
        """DELETE one application command."""
        pool, command = self._command(call)
        pool.remove(command)
        return None

    async def _r_callback(self, call: _Call) -> Any:
        """POST /interactions/{id}/{token}/callback (with_response: the InteractionCallbackResponse)."""
        it = self._interactions.get(call.params["interaction_id"])
        if it is None or it.token != call.params["token"]:
            raise _not_found(10062, "interaction")
        if it.responded:
            raise _ApiError(400, 40060, "Interaction has already been acknowledged.")
        body = call.body
        if not isinstance(body, dict) or not isinstance(body.get("type"), int):
            raise _invalid(["type"], "BASE_TYPE_REQUIRED", "This field is required")
        kind: int = body["type"]
        raw_data = body.get("data")
        data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
        allowed = {
            _APPLICATION_COMMAND: (_CHANNEL_MESSAGE, _DEFERRED_CHANNEL_MESSAGE, _MODAL),
            _MESSAGE_COMPONENT: (
                _CHANNEL_MESSAGE,
                _DEFERRED_CHANNEL_MESSAGE,
                _DEFERRED_UPDATE_MESSAGE,
                _UPDATE_MESSAGE,
                _MODAL,
            ),
            _MODAL_SUBMIT: (_CHANNEL_MESSAGE, _DEFERRED_CHANNEL_MESSAGE)
            + ((_DEFERRED_UPDATE_MESSAGE, _UPDATE_MESSAGE) if it.clicked is not None else ()),
        }.get(it.type, (_AUTOCOMPLETE_RESULT,))
        if kind not in allowed:
            raise _ApiError(400, 40043, "Interaction callback type is not valid for this interaction type")
        resource_message: dict[str, Any] | None = None
        if kind == _CHANNEL_MESSAGE:
            self._check_message(data, bool(call.uploads), ["data"])
            message = self._interaction_message(it, data, call.uploads, original=True)
            resource_message = message
        elif kind == _DEFERRED_CHANNEL_MESSAGE:
            message = self._interaction_message(
                it, {"flags": int(data.get("flags") or 0) & EPHEMERAL}, [], original=True
            )
            message["flags"] |= LOADING
            resource_message = message
        elif kind in (_DEFERRED_UPDATE_MESSAGE, _UPDATE_MESSAGE):
            assert it.clicked is not None
            message = self._messages.get(it.clicked["id"], it.clicked)
            if kind == _UPDATE_MESSAGE:
                updated = self._apply_body(message, data, call.uploads, editing=True)
                self._check_message(updated, bool(updated["attachments"]), ["data"])
                updated["edited_timestamp"] = _now()
                message.clear()
                message.update(updated)
                resource_message = message
        else:
            message = None
        # record before anything is dispatched, so a waiting test sees the answer with its message
        it.responses.append(copy.deepcopy(body))
        if kind in (_CHANNEL_MESSAGE, _UPDATE_MESSAGE) and isinstance(data.get("content"), str):
            it._texts.append(data["content"])
        if message is not None:
            it.message = message
            it._messages[message["id"]] = message
        if kind in (_CHANNEL_MESSAGE, _DEFERRED_CHANNEL_MESSAGE) and message is not None:
            self._store(message)
            await self._publish(message, "MESSAGE_CREATE")
        elif kind == _UPDATE_MESSAGE and message is not None:
            await self._publish(message, "MESSAGE_UPDATE")
        self._notify()
        if call.query.get("with_response") not in ("1", "true", "True"):
            return None
        response: dict[str, Any] = {"interaction": {"id": it.id, "type": it.type}}
        if resource_message is not None:
            flags = int(resource_message.get("flags") or 0)
            response["interaction"].update(
                response_message_id=resource_message["id"],
                response_message_loading=bool(flags & LOADING),
                response_message_ephemeral=bool(flags & EPHEMERAL),
            )
            response["resource"] = {"type": kind, "message": self._wire(resource_message)}
        elif kind != _DEFERRED_UPDATE_MESSAGE:
            response["resource"] = {"type": kind}
        return response

    async def _r_followup(self, call: _Call) -> Any:
        """POST /webhooks/{app}/{token}: a followup (the first one after a thinking deferral fills the original)."""
        it = self._interaction_for(call)
        body = call.body if isinstance(call.body, dict) else {}
        self._check_message(body, bool(call.uploads))
        original = it.message
        if original is not None and int(original.get("flags") or 0) & LOADING:
            updated = self._apply_body(original, body, call.uploads, editing=True)
            updated["flags"] = int(original["flags"]) & ~LOADING
            updated["mentions"] = self._mentions(updated, body.get("allowed_mentions"), None)
            original.clear()
            original.update(updated)
            message = original
            event = "MESSAGE_UPDATE"
        else:
            message = self._interaction_message(it, body, call.uploads, original=False)
            self._store(message)
            it._messages[message["id"]] = message
            event = "MESSAGE_CREATE"
        it.followups.append(message)
        if isinstance(body.get("content"), str):
            it._texts.append(body["content"])
        await self._publish(message, event)
        self._notify()
        if call.query.get("wait") in ("1", "true", "True"):
            return self._wire(message)
        return None

    async def _r_get_webhook_message(self, call: _Call) -> Any:
        """GET /webhooks/{app}/{token}/messages/{id|@original}."""
        return self._wire(self._webhook_message(self._interaction_for(call), call.params["message_id"]))

    async def _r_edit_webhook_message(self, call: _Call) -> Any:
        """PATCH /webhooks/{app}/{token}/messages/{id|@original}."""
        it = self._interaction_for(call)
        message = self._webhook_message(it, call.params["message_id"])
        body = self._edit(message, call)
        it.edits.append({**copy.deepcopy(body), "message_id": message["id"]})
        if isinstance(body.get("content"), str):
            it._texts.append(body["content"])
        await self._publish(message, "MESSAGE_UPDATE")
        self._notify()
        return self._wire(message)

    async def _r_delete_webhook_message(self, call: _Call) -> Any:
        """DELETE /webhooks/{app}/{token}/messages/{id|@original}."""
        it = self._interaction_for(call)
        message = self._webhook_message(it, call.params["message_id"])
        self._messages.pop(message["id"], None)
        message["deleted"] = True
        self.deleted.append(message["id"])
        await self._publish(message, "MESSAGE_DELETE")
        return None

    # HTTP plumbing

    async def _read_call(self, request: web.Request, path: str, params: dict[str, str]) -> _Call:
        """Decode a REST request: JSON body, or multipart with payload_json and files[n]."""
        body: Any = None
        uploads: list[_Upload] = []
        if request.body_exists:
            if request.content_type.startswith("multipart/"):
                reader = await request.multipart()
                while True:
                    part = await reader.next()
                    if part is None:
                        break
                    if not isinstance(part, BodyPartReader):
                        continue
                    if part.name == "payload_json":
                        body = json.loads(await part.text())
                    elif part.name and part.filename is not None:
                        m = re.fullmatch(r"files\[(\d+)\]", part.name)
                        index = int(m[1]) if m else len(uploads)
                        data = bytes(await part.read())
                        content_type = part.headers.get("Content-Type", "application/octet-stream")
                        uploads.append(_Upload(index, part.filename, content_type, data))
            else:
                raw = await request.read()
                if raw:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        raise _ApiError(400, 50109, "The request body contains invalid JSON.") from None
        return _Call(request.method, path, params, dict(request.query), body, uploads)

    @staticmethod
    def _bucket(method: str, path: str) -> str:
        """A rate limit bucket hash for a route (ids masked, except the major parameter)."""
        template = re.sub(r"(?<=/)(?!channels/|guilds/|webhooks/)\d+", "{id}", path)
        return hashlib.md5(f"{method} {template}".encode()).hexdigest()

    def _rate_limit_headers(self, method: str, path: str, remaining: int, reset_after: float) -> dict[str, str]:
        """X-RateLimit-* headers as Discord sends them."""
        return {
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": f"{time.time() + reset_after:.3f}",
            "X-RateLimit-Reset-After": f"{reset_after:.3f}",
            "X-RateLimit-Bucket": self._bucket(method, path),
        }

    def _scripted_429(self, method: str, path: str) -> web.Response | None:
        """The scripted 429 for this request, if one matches."""
        key = f"{method} {path}"
        for i, (needle, retry_after, global_) in enumerate(self._rate_limits):
            if needle in key:
                del self._rate_limits[i]
                self.rate_limited.append(key)
                headers = self._rate_limit_headers(method, path, 0, retry_after)
                headers.update({"Via": "1.1 google", "Retry-After": str(max(1, math.ceil(retry_after)))})
                headers["X-RateLimit-Scope"] = "global" if global_ else "user"
                if global_:
                    headers["X-RateLimit-Global"] = "true"
                body = {"message": "You are being rate limited.", "retry_after": retry_after, "global": global_}
                return _json(body, 429, headers)
        return None

    def _scripted_failure(self, method: str, path: str) -> web.Response | None:
        """The scripted error answer for this request, if one matches."""
        key = f"{method} {path}"
        for i, (needle, status, code, message, after) in enumerate(self._failures):
            if needle in key and after > 0:
                self._failures[i] = (needle, status, code, message, after - 1)
                return None
            if needle in key:
                del self._failures[i]
                self.failed.append(key)
                return _json(_ApiError(status, code, message).body(), status)
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        """Route websocket upgrades to the gateway, /api/v10/* to REST, /attachments/* to the fake CDN."""
        if request.path in ("/", "/resume") and request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._gateway(request)
        if request.method == "GET" and request.path.startswith("/attachments/"):
            found = self._files.get(request.path.split("/")[3]) if request.path.count("/") >= 4 else None
            if found is None:
                return web.Response(status=404, text="Not Found")
            self.downloads.append(request.path.split("/")[3])
            return web.Response(body=found[1], content_type=found[0])
        prefix = f"/api/v{API_VERSION}"
        path = request.path[len(prefix) :] if request.path.startswith(prefix + "/") else None
        try:
            return await self._rest(request, path)
        finally:
            self._notify()

    async def _rest(self, request: web.Request, path: str | None) -> web.StreamResponse:
        """Dispatch one REST request to its route handler."""
        method = request.method
        for route_method, pattern, handler, needs_auth in self._routes:
            match = pattern.fullmatch(path) if path is not None and route_method == method else None
            if match is None or path is None:
                continue
            try:
                call = await self._read_call(request, path, {k: v for k, v in match.groupdict().items() if v})
            except _ApiError as e:
                return _json(e.body(), e.status)
            self.requests.append((method, path, call.body))
            if needs_auth and request.headers.get("Authorization") != f"Bot {self.token}":
                return _json({"message": "401: Unauthorized", "code": 0}, 401)
            limited = self._scripted_429(method, path) or self._scripted_failure(method, path)
            if limited is not None:
                return limited
            try:
                result = await handler(call)
            except _ApiError as e:
                return _json(e.body(), e.status, self._rate_limit_headers(method, path, 4, 1.0))
            headers = self._rate_limit_headers(method, path, 4, 1.0)
            if result is None:
                return web.Response(status=204, headers=headers)
            return _json(result, 200, headers)
        where = f"{method} {path if path is not None else request.path}"
        self.unknown_requests.append(where)
        self.requests.append((method, path or request.path, None))
        return _json({"message": "404: Not Found", "code": 0}, 404)
