"""A fake Matrix homeserver on 127.0.0.1 for the real mautrix client: the client-server API the bot uses (versions,
password login → access token, whoami, /sync long-poll with since/next_batch, room send idempotent per txnId,
redact, createRoom, join/leave (with a reason), profile display names) and the media repository (upload,
authenticated and legacy download). People also react (m.reaction), send files and have an event delivered again.

One event log holds every room's events in order; a sync token is a position in it (`s<N>`), so a client that
syncs again from an old `since` gets the same events again, as after a sync whose answer never arrived
(`drop_syncs`). People act with `invite`, `direct`, `say` and `join`; what the bot sent is in `sent`, and tests
wait on it with `wait_for` (never a sleep)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.loopback import LoopbackServer

SERVER = "fake.test"
BOT = f"@assistant:{SERVER}"
BOT_NAME = "Assistant"
PASSWORD = "fake-password"
TOKEN = "syt_fake_access_token"
DEVICE = "FAKEDEVICE"
VERSIONS = ["v1.1", "v1.5", "v1.11"]  # from v1.11 on, mautrix downloads media through the authenticated endpoint


@dataclass
class Room:
    """A room: who is in it, who is invited, whether it is a direct chat or encrypted."""

    id: str
    creator: str
    direct: bool = False
    encrypted: bool = False
    members: set[str] = field(default_factory=set)
    invited: set[str] = field(default_factory=set)
    names: dict[str, str] = field(default_factory=dict)  # display names, by user id


@dataclass
class Logged:
    """One event in the log: its position (the sync token after it is `s<position>`) and its room."""

    position: int
    room_id: str
    event: dict[str, Any]


def _error(status: int, errcode: str, message: str) -> web.Response:
    """A Matrix error answer."""
    return web.json_response({"errcode": errcode, "error": message}, status=status)


def _membership(event: object, user: str) -> str:
    """The membership an m.room.member event gives `user` ("": another event, or a malformed one)."""
    if not isinstance(event, dict) or event.get("type") != "m.room.member" or event.get("state_key") != user:
        return ""
    content = event.get("content")
    return str(content.get("membership", "")) if isinstance(content, dict) else ""


class FakeMatrix(LoopbackServer):
    """A homeserver as far as the bot uses one."""

    handler_cancellation = True  # a long-polled /sync the client gave up on ends with its connection

    def __init__(self) -> None:
        """One account (the bot's), no rooms yet."""
        super().__init__()
        self.passwords: dict[str, str] = {BOT: PASSWORD}
        self.tokens: dict[str, str] = {TOKEN: BOT}  # access token → user id
        self.display_names: dict[str, str] = {BOT: BOT_NAME}
        self.rooms: dict[str, Room] = {}
        self.log: list[Logged] = []
        self.sent: list[dict[str, Any]] = []  # the bot's events (messages, reactions, edits), oldest first
        self.redactions: list[dict[str, Any]] = []  # what the bot redacted: room_id, redacts, reason
        self.txns: dict[tuple[str, str], str] = {}  # (token, txnId) → event id: a resent PUT answers the same
        self.media: dict[str, tuple[bytes, str, str]] = {}  # media id → (data, content type, filename)
        self.syncs: list[dict[str, str]] = []  # the query of every /sync, in order
        self.drop_syncs = 0  # the next this many /sync answers are lost (the connection closes instead)
        self.logins: list[dict[str, Any]] = []
        self.typing: list[tuple[str, bool]] = []  # (room id, typing) of every typing notice the bot sent
        # misbehaving: each /sync (send) answer is made by the next fault while any are left (given the real body)
        self.sync_faults: list[Callable[[dict[str, Any]], web.StreamResponse]] = []
        self.send_faults: list[Callable[[], web.Response]] = []
        self.send_times: list[float] = []  # when each send (PUT …/send/…) arrived, faulty ones too (monotonic)
        self.downloads: list[str] = []  # the media ids asked for, in order
        self.hold_downloads: asyncio.Event | None = None  # set: downloads wait for it (a media repository that hangs)
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        client, media = "/_matrix/client", "/_matrix/media"
        routes = [
            web.get(f"{client}/versions", self._versions),
            web.get(f"{client}/v3/login", self._login_flows),
            web.post(f"{client}/v3/login", self._login),
            web.get(f"{client}/v3/account/whoami", self._whoami),
            web.get(f"{client}/v3/sync", self._sync),
            web.put(f"{client}/v3/rooms/{{room}}/send/{{type}}/{{txn}}", self._send),
            web.put(f"{client}/v3/rooms/{{room}}/redact/{{event}}/{{txn}}", self._redact),
            web.get(f"{client}/v3/rooms/{{room}}/event/{{event}}", self._get_event),
            web.put(f"{client}/v3/rooms/{{room}}/typing/{{user}}", self._typing),
            web.post(f"{client}/v3/rooms/{{room}}/join", self._join),
            web.post(f"{client}/v3/join/{{room}}", self._join),
            web.post(f"{client}/v3/rooms/{{room}}/leave", self._leave),
            web.post(f"{client}/v3/createRoom", self._create_room),
            web.get(f"{client}/v3/profile/{{user}}/displayname", self._displayname),
            web.post(f"{media}/v3/upload", self._upload),
            web.get(f"{client}/v1/media/download/{{server}}/{{media}}", self._download),
            web.get(f"{client}/v1/media/download/{{server}}/{{media}}/{{filename}}", self._download),
            web.get(f"{media}/v3/download/{{server}}/{{media}}", self._download),
            web.get(f"{media}/v3/download/{{server}}/{{media}}/{{filename}}", self._download),
        ]
        self._app.add_routes(routes)

    # ---- the log ------------------------------------------------------------------------------------

    @property
    def next_batch(self) -> str:
        """The sync token at the end of the log."""
        return f"s{len(self.log)}"

    def _event_id(self) -> str:
        return f"${next(self._ids)}fake:{SERVER}"

    def _append(self, room_id: str, event: dict[str, Any]) -> dict[str, Any]:
        """Put an event at the end of the log (its id, timestamp and room filled in) and wake the long polls."""
        event = {"event_id": self._event_id(), "origin_server_ts": 1_700_000_000_000 + next(self._clock), **event}
        event["room_id"] = room_id
        self.log.append(Logged(len(self.log) + 1, room_id, event))
        self._notify()
        return event

    def event(self, event_id: str) -> dict[str, Any]:
        """An event by its id."""
        return next(e.event for e in self.log if e.event.get("event_id") == event_id)

    def text(self, event_id: str) -> str:
        """A message's body as it reads now: the last m.replace edit's new content, if any."""
        body = str(self.event(event_id)["content"].get("body", ""))
        for logged in self.log:
            content = logged.event.get("content", {})
            relates = content.get("m.relates_to", {})
            if relates.get("rel_type") == "m.replace" and relates.get("event_id") == event_id:
                body = str(content.get("m.new_content", {}).get("body", body))
        return body

    # ---- people act ---------------------------------------------------------------------------------

    def person(self, user_id: str, name: str) -> str:
        """Register a person with a display name; their user id."""
        self.display_names[user_id] = name
        return user_id

    def room(self, creator: str, *, direct: bool = False, encrypted: bool = False) -> Room:
        """A new room that `creator` is in."""
        room = Room(f"!{next(self._ids)}room:{SERVER}", creator, direct=direct, encrypted=encrypted)
        self.rooms[room.id] = room
        self._member(room, creator, "join")
        if encrypted:
            self.encrypt(room, creator)
        return room

    def encrypt(self, room: Room, sender: str) -> dict[str, Any]:
        """`sender` turns on end-to-end encryption in the room (m.room.encryption)."""
        room.encrypted = True
        content = {"algorithm": "m.megolm.v1.aes-sha2"}
        return self._append(
            room.id, {"type": "m.room.encryption", "sender": sender, "state_key": "", "content": content}
        )

    def invite(self, room: Room, sender: str, user_id: str = BOT) -> dict[str, Any]:
        """`sender` invites `user_id` (the bot by default) into the room."""
        room.invited.add(user_id)
        return self._member(room, user_id, "invite", sender=sender, is_direct=room.direct)

    def direct(self, sender: str) -> Room:
        """A person opens a direct chat with the bot: a new room, the bot invited with is_direct."""
        room = self.room(sender, direct=True)
        self.invite(room, sender)
        return room

    def join(self, room: Room, user_id: str) -> dict[str, Any]:
        """Someone joins the room."""
        room.invited.discard(user_id)
        return self._member(room, user_id, "join")

    def say(
        self,
        room: Room,
        sender: str,
        body: str,
        *,
        mentions: list[str] | None = None,
        reply_to: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """A person writes into the room (m.text); the event's id. `mentions` fills m.mentions.user_ids, `reply_to`
        makes it a reply (m.in_reply_to)."""
        if sender not in room.members:
            raise ValueError(f"{sender} is not in {room.id}")
        content: dict[str, Any] = {"msgtype": "m.text", "body": body}
        if mentions is not None:
            content["m.mentions"] = {"user_ids": mentions}
        if reply_to is not None:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
        content.update(extra or {})
        return str(self._append(room.id, {"type": "m.room.message", "sender": sender, "content": content})["event_id"])

    def react(self, room: Room, sender: str, event_id: str, key: str) -> str:
        """A person reacts to an event with `key` (an m.annotation); the reaction's id."""
        if sender not in room.members:
            raise ValueError(f"{sender} is not in {room.id}")
        relates = {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": key}}
        return str(self._append(room.id, {"type": "m.reaction", "sender": sender, "content": relates})["event_id"])

    def send_file(
        self, room: Room, sender: str, name: str, data: bytes, mime: str, caption: str = "", msgtype: str = "m.file"
    ) -> str:
        """A person uploads a file and sends it (m.file, m.image or m.audio; a caption as the body, Matrix 1.10)."""
        url = self.add_media(data, mime, name)
        extra = {"msgtype": msgtype, "filename": name, "url": url, "info": {"mimetype": mime, "size": len(data)}}
        return self.say(room, sender, caption or name, extra=extra)

    def raw(self, room: Room, event: dict[str, Any]) -> None:
        """Any event, however malformed, into the room's timeline exactly as given (no id or timestamp added)."""
        self.log.append(Logged(len(self.log) + 1, room.id, event))
        self._notify()

    def redeliver(self, event_id: str) -> None:
        """The same event once more, later in the log (as a sync that started from an older token sees it)."""
        logged = next(e for e in self.log if e.event.get("event_id") == event_id)
        self.log.append(Logged(len(self.log) + 1, logged.room_id, dict(logged.event)))
        self._notify()

    def edits(self, event_id: str) -> list[dict[str, Any]]:
        """The m.replace edits of an event, oldest first."""
        return [
            e.event
            for e in self.log
            if (e.event.get("content") or {}).get("m.relates_to", {}).get("rel_type") == "m.replace"
            and e.event["content"]["m.relates_to"].get("event_id") == event_id
        ]

    def reactions(self, event_id: str, sender: str = BOT) -> list[dict[str, Any]]:
        """The reactions of `sender` to an event that were not redacted."""
        redacted = {e.event.get("redacts") for e in self.log if e.event.get("type") == "m.room.redaction"}
        return [
            e.event
            for e in self.log
            if e.event.get("type") == "m.reaction"
            and e.event.get("sender") == sender
            and e.event["content"]["m.relates_to"]["event_id"] == event_id
            and e.event["event_id"] not in redacted
        ]

    def _member(
        self,
        room: Room,
        user_id: str,
        membership: str,
        *,
        sender: str = "",
        is_direct: bool = False,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """A membership change, kept in the room and logged as its m.room.member state event."""
        if membership == "join":
            room.members.add(user_id)
        elif membership == "leave":
            room.members.discard(user_id)
        content: dict[str, Any] = {"membership": membership, "displayname": self.display_names.get(user_id, user_id)}
        if is_direct:
            content["is_direct"] = True
        if reason:
            content["reason"] = reason
        return self._append(
            room.id, {"type": "m.room.member", "sender": sender or user_id, "state_key": user_id, "content": content}
        )

    # ---- the client-server API ----------------------------------------------------------------------

    def _user(self, request: web.Request) -> str | None:
        """The user the request's access token belongs to."""
        header = request.headers.get("Authorization", "")
        token = (
            header.removeprefix("Bearer ") if header.startswith("Bearer ") else request.query.get("access_token", "")
        )
        return self.tokens.get(token)

    async def _versions(self, request: web.Request) -> web.Response:
        return web.json_response({"versions": VERSIONS, "unstable_features": {}})

    async def _login_flows(self, request: web.Request) -> web.Response:
        return web.json_response({"flows": [{"type": "m.login.password"}]})

    async def _login(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.logins.append(body)
        identifier = body.get("identifier", {})
        user = identifier.get("user", "") or body.get("user", "")
        if not user.startswith("@"):
            user = f"@{user}:{SERVER}"
        if body.get("type") != "m.login.password" or self.passwords.get(user) != body.get("password"):
            return _error(403, "M_FORBIDDEN", "Invalid username or password")
        token = f"syt_login_{next(self._ids)}"
        self.tokens[token] = user
        device = body.get("device_id") or DEVICE
        return web.json_response({"user_id": user, "access_token": token, "device_id": device})

    async def _whoami(self, request: web.Request) -> web.Response:
        user = self._user(request)
        if user is None:
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        return web.json_response({"user_id": user, "device_id": DEVICE, "is_guest": False})

    def _since(self, since: str) -> int:
        return int(since[1:]) if since.startswith("s") and since[1:].isdigit() else 0

    async def _sync(self, request: web.Request) -> web.StreamResponse:
        user = self._user(request)
        if user is None:
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        self.syncs.append(dict(request.query))
        since = self._since(request.query.get("since", ""))
        timeout = int(request.query.get("timeout", "0")) / 1000
        try:
            await self.wait_for(lambda: len(self.log) > since, timeout, what="an event")
        except TimeoutError:
            pass
        if self.sync_faults:
            self._notify()
            return self.sync_faults.pop(0)(self._sync_body(user, since))
        if self.drop_syncs > 0:  # the answer is lost on its way: the client must sync from the same `since` again
            self.drop_syncs -= 1
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)
        return web.json_response(self._sync_body(user, since))

    def _sync_body(self, user: str, since: int) -> dict[str, Any]:
        """The events after position `since` that `user` sees: timelines of rooms they are in, invites to others."""
        join: dict[str, Any] = {}
        invite: dict[str, Any] = {}
        for logged in self.log[since:]:
            room, event = self.rooms[logged.room_id], logged.event
            if _membership(event, user) == "invite":
                if user in room.invited:
                    stripped = [self._stripped(e) for e in self._state(room.id, logged.position)]
                    invite[room.id] = {"invite_state": {"events": stripped}}
                continue
            if self._member_at(room.id, user, logged.position):
                timeline = join.setdefault(room.id, {"timeline": {"events": [], "limited": False}})
                shown = {k: v for k, v in event.items() if k != "room_id"} if isinstance(event, dict) else event
                timeline["timeline"]["events"].append(shown)
        return {"next_batch": self.next_batch, "rooms": {"join": join, "invite": invite, "leave": {}}}

    def _state(self, room_id: str, position: int) -> list[dict[str, Any]]:
        """The room's state events up to a position, the last per (type, state_key)."""
        state: dict[tuple[str, str], dict[str, Any]] = {}
        for logged in self.log[:position]:
            if logged.room_id == room_id and isinstance(logged.event, dict) and "state_key" in logged.event:
                state[(str(logged.event.get("type")), str(logged.event["state_key"]))] = logged.event
        return list(state.values())

    @staticmethod
    def _stripped(event: dict[str, Any]) -> dict[str, Any]:
        return {k: event[k] for k in ("type", "state_key", "sender", "content")}

    def _member_at(self, room_id: str, user: str, position: int) -> bool:
        """Whether `user` had joined the room by that position (their join event included)."""
        membership = ""
        for logged in self.log[:position]:
            if logged.room_id == room_id and _membership(logged.event, user):
                membership = _membership(logged.event, user)
        return membership == "join"

    async def _send(self, request: web.Request) -> web.Response:
        user = self._user(request)
        if user is None:
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        self.send_times.append(time.monotonic())
        if self.send_faults:
            self._notify()
            return self.send_faults.pop(0)()
        room = self.rooms.get(request.match_info["room"])
        if room is None or user not in room.members:
            return _error(403, "M_FORBIDDEN", "You are not in this room")
        key = (request.headers.get("Authorization", ""), request.match_info["txn"])
        if key in self.txns:  # a retried PUT with the same txnId: the same event, not a second one
            return web.json_response({"event_id": self.txns[key]})
        content = await request.json()
        event = self._append(room.id, {"type": request.match_info["type"], "sender": user, "content": content})
        self.txns[key] = event["event_id"]
        self.sent.append(event)
        return web.json_response({"event_id": event["event_id"]})

    async def _get_event(self, request: web.Request) -> web.Response:
        user = self._user(request)
        if user is None:
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        room = self.rooms.get(request.match_info["room"])
        found = [e.event for e in self.log if e.event.get("event_id") == request.match_info["event"]]
        if room is None or user not in room.members or not found or found[0]["room_id"] != room.id:
            return _error(404, "M_NOT_FOUND", "Event not found.")
        return web.json_response(found[0])

    async def _typing(self, request: web.Request) -> web.Response:
        user = self._user(request)
        if user is None or user != request.match_info["user"]:
            return _error(403, "M_FORBIDDEN", "Cannot set another user's typing state")
        body = await request.json()
        self.typing.append((request.match_info["room"], bool(body.get("typing"))))
        self._notify()
        return web.json_response({})

    async def _redact(self, request: web.Request) -> web.Response:
        user = self._user(request)
        if user is None:
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        room_id, redacts = request.match_info["room"], request.match_info["event"]
        body = await request.json() if request.can_read_body else {}
        event = self._append(room_id, {"type": "m.room.redaction", "sender": user, "redacts": redacts, "content": body})
        self.redactions.append({"room_id": room_id, "redacts": redacts, "reason": body.get("reason")})
        return web.json_response({"event_id": event["event_id"]})

    async def _join(self, request: web.Request) -> web.Response:
        user = self._user(request)
        if user is None:
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        room = self.rooms.get(request.match_info["room"])
        if room is None or (user not in room.invited and user not in room.members):
            return _error(403, "M_FORBIDDEN", "You are not invited to this room.")
        if user not in room.members:
            self.join(room, user)
        return web.json_response({"room_id": room.id})

    async def _leave(self, request: web.Request) -> web.Response:
        user = self._user(request)
        if user is None:
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        room = self.rooms.get(request.match_info["room"])
        if room is None:
            return _error(404, "M_NOT_FOUND", "Unknown room")
        body = await request.json() if request.can_read_body else {}
        room.invited.discard(user)
        self._member(room, user, "leave", reason=body.get("reason"))
        return web.json_response({})

    async def _create_room(self, request: web.Request) -> web.Response:
        user = self._user(request)
        if user is None:
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        body = await request.json()
        room = self.room(user, direct=bool(body.get("is_direct")))
        for invitee in body.get("invite") or []:
            self.invite(room, user, invitee)
        return web.json_response({"room_id": room.id})

    async def _displayname(self, request: web.Request) -> web.Response:
        name = self.display_names.get(request.match_info["user"])
        if name is None:
            return _error(404, "M_NOT_FOUND", "Profile not found")
        return web.json_response({"displayname": name})

    # ---- the media repository -----------------------------------------------------------------------

    def add_media(self, data: bytes, content_type: str = "application/octet-stream", filename: str = "") -> str:
        """A file a person uploaded; its mxc:// URI."""
        media_id = f"m{next(self._ids)}"
        self.media[media_id] = (data, content_type, filename)
        return f"mxc://{SERVER}/{media_id}"

    async def _upload(self, request: web.Request) -> web.Response:
        if self._user(request) is None:
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        data = await request.read()
        uri = self.add_media(data, request.content_type, request.query.get("filename", ""))
        self._notify()
        return web.json_response({"content_uri": uri})

    async def _download(self, request: web.Request) -> web.Response:
        if request.path.startswith("/_matrix/client/") and self._user(request) is None:
            return _error(401, "M_MISSING_TOKEN", "Missing access token.")
        self.downloads.append(request.match_info["media"])
        if self.hold_downloads is not None:
            await self.hold_downloads.wait()
        found = self.media.get(request.match_info["media"]) if request.match_info["server"] == SERVER else None
        if found is None:
            return _error(404, "M_NOT_FOUND", "Not found")
        data, content_type, _ = found
        return web.Response(body=data, content_type=content_type)

    def _recent(self) -> str:
        return "last events: " + json.dumps([e.event for e in self.log[-3:]])[:800]
