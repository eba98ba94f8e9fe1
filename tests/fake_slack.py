"""A fake Slack on 127.0.0.1 for the real slack_sdk: the Web API methods the bot uses (under /api/), Socket Mode
(apps.connections.open hands out ws://127.0.0.1:PORT/socket, where envelopes are pushed and acked by envelope_id),
the Events API (signed posts to the bot's own endpoint), response_url answers (under /response/), and 429s with
Retry-After on demand. It records what the bot sent; tests wait on it with `wait_for` (never a sleep)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from tests.loopback import LoopbackServer

TEAM = "T0FAKE01"
BOT_USER = "UBOT0001"
BOT_ID = "BBOT0001"
GROUP = "C0GROUP1"  # the shared channel the bot is in
BOT_TOKEN = "xoxb-fake-bot-token"
APP_TOKEN = "xapp-1-fake-app-token"
SIGNING_SECRET = "fake-signing-secret"


@dataclass
class Interaction:
    """A slash command or a button press pushed to the bot: its ack and what came to its response_url."""

    envelope_id: str
    payload: dict[str, Any]
    acked: bool = False
    ack_payload: dict[str, Any] | None = None
    responses: list[dict[str, Any]] = field(default_factory=list)  # posts to its response_url, in order


@dataclass
class Person:
    """A member of the workspace."""

    id: str
    name: str
    tz: str = "Europe/Berlin"


class FakeSlack(LoopbackServer):
    """Slack's Web API, Socket Mode and Events API as far as the bot uses them."""

    def __init__(self) -> None:
        """No messages, no socket yet."""
        super().__init__()
        self.token, self.app_token, self.signing_secret = BOT_TOKEN, APP_TOKEN, SIGNING_SECRET
        self.people: dict[str, Person] = {}
        self.messages: list[dict[str, Any]] = []  # every message in a channel (the people's and the bot's), by time
        self.sent: list[dict[str, Any]] = []  # the bot's messages into channels (chat.postMessage), oldest first
        self.ephemeral: list[dict[str, Any]] = []  # chat.postEphemeral
        self.calls: list[tuple[str, dict[str, Any]]] = []  # (method, arguments) of every Web API call
        self.views: dict[str, dict[str, Any]] = {}  # the Home tab published per user
        self.interactions: dict[str, Interaction] = {}  # by envelope id
        self.envelopes: dict[str, dict[str, Any]] = {}  # every envelope pushed, by id
        self.acks: dict[str, dict[str, Any]] = {}  # the acks the bot sent, by envelope id
        self.sockets: list[web.WebSocketResponse] = []
        self.rate_limit: dict[str, list[int]] = {}  # method → Retry-After seconds of the 429s still to answer
        self.events_url: str | None = None  # the bot's Events API endpoint (HTTP mode)
        self.event_answers: list[int] = []  # the HTTP statuses the bot answered posted events with
        self.uploads: dict[str, dict[str, Any]] = {}  # files the bot uploaded, by file id
        self.files: dict[str, bytes] = {}  # files people shared, by file id (served under /files/)
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self._http: aiohttp.ClientSession | None = None
        self._app.router.add_route("*", "/api/{method}", self._api)
        self._app.router.add_get("/socket", self._socket)
        self._app.router.add_post("/response/{id}", self._response)
        self._app.router.add_post("/upload/{id}", self._upload)
        self._app.router.add_get("/files/{id}", self._file)

    async def stop(self) -> None:
        """Close the sockets and the server."""
        for ws in list(self.sockets):
            await ws.close()
        if self._http is not None:
            await self._http.close()
        await super().stop()

    # ---- the workspace ------------------------------------------------------------------------------

    @property
    def api_base(self) -> str:
        """The Web API's base URL (what AsyncWebClient(base_url=…) takes)."""
        return f"{self.origin}/api/"

    def person(self, user_id: str, name: str, tz: str = "Europe/Berlin") -> Person:
        """Add a member."""
        self.people[user_id] = Person(user_id, name, tz)
        return self.people[user_id]

    @staticmethod
    def dm_of(user_id: str) -> str:
        """The id of a person's DM with the bot."""
        return f"D{user_id[1:]}"

    def next_ts(self) -> str:
        """A new message timestamp, increasing."""
        return f"{1_700_000_000 + next(self._clock)}.000100"

    def message(self, channel: str, ts: str) -> dict[str, Any]:
        """A message as it reads now."""
        return next(m for m in self.messages if m["channel"] == channel and m["ts"] == ts)

    # ---- people act (Socket Mode) -------------------------------------------------------------------

    async def push(self, kind: str, payload: dict[str, Any], *, retry_attempt: int = 0, envelope_id: str = "") -> str:
        """Push an envelope over the open socket (waits for the bot to be connected); its id."""
        await self.wait_for(lambda: bool(self.sockets), what="the bot's socket")
        envelope_id = envelope_id or f"env-{next(self._ids)}"
        envelope = {
            "envelope_id": envelope_id,
            "type": kind,
            "payload": payload,
            "accepts_response_payload": kind != "events_api",
            "retry_attempt": retry_attempt,
            "retry_reason": "timeout" if retry_attempt else "",
        }
        self.envelopes[envelope_id] = envelope
        await self.sockets[-1].send_str(json.dumps(envelope))
        return envelope_id

    async def redeliver(self, envelope_id: str) -> None:
        """Slack sends an envelope again (un-acked in time), with its retry_attempt counted up."""
        envelope = self.envelopes[envelope_id]
        attempt = int(envelope["retry_attempt"]) + 1
        await self.push(envelope["type"], envelope["payload"], retry_attempt=attempt, envelope_id=envelope_id)

    def event(self, event: dict[str, Any]) -> dict[str, Any]:
        """An events_api payload around one event."""
        return {
            "token": "verification",
            "team_id": TEAM,
            "api_app_id": "A0FAKE01",
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{next(self._ids):08d}",
            "event_time": int(time.time()),
            "authorizations": [{"team_id": TEAM, "user_id": BOT_USER, "is_bot": True}],
        }

    def post(
        self,
        user: str,
        text: str,
        *,
        channel: str,
        thread_ts: str | None = None,
        files: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A person's message, kept in the channel: the event Slack would send for it (message, or app_mention when it
        mentions the bot in a channel)."""
        im = channel.startswith("D")
        msg: dict[str, Any] = {"type": "message", "user": user, "text": text, "ts": self.next_ts(), "channel": channel}
        if thread_ts:
            msg["thread_ts"] = thread_ts
            root = next((m for m in self.messages if m["channel"] == channel and m["ts"] == thread_ts), None)
            if root is not None:
                msg["parent_user_id"] = root["user"]
        if files:
            msg["files"] = files
        self.messages.append(msg)
        event = {**msg, "team": TEAM, "channel_type": "im" if im else "channel", "event_ts": msg["ts"]}
        if not im and f"<@{BOT_USER}>" in text:
            event = {**event, "type": "app_mention"}
        self._notify()
        return self.event(event)

    def shared_file(self, name: str, data: bytes, mime: str) -> dict[str, Any]:
        """A file a person shares, downloadable with the bot token."""
        file_id = f"F{next(self._ids):08d}"
        self.files[file_id] = data
        url = f"{self.origin}/files/{file_id}"
        return {"id": file_id, "name": name, "mimetype": mime, "size": len(data), "url_private_download": url}

    def command(self, user: str, channel: str, command: str, text: str) -> dict[str, Any]:
        """A slash command's payload."""
        rid = str(next(self._ids))
        return {
            "token": "verification",
            "team_id": TEAM,
            "channel_id": channel,
            "channel_name": "directmessage" if channel.startswith("D") else "general",
            "user_id": user,
            "user_name": self.people[user].name,
            "command": command,
            "text": text,
            "response_url": f"{self.origin}/response/{rid}",
            "trigger_id": f"trigger-{rid}",
        }

    def block_action(self, user: str, message: dict[str, Any], action_id: str) -> dict[str, Any]:
        """A button press's payload (block_actions) on a message (also an ephemeral one)."""
        rid = str(next(self._ids))
        [button] = [
            e for b in message.get("blocks") or [] for e in b.get("elements") or [] if e.get("action_id") == action_id
        ]
        channel = message["channel"]
        return {
            "type": "block_actions",
            "team": {"id": TEAM},
            "user": {"id": user, "name": self.people[user].name, "team_id": TEAM},
            "channel": {"id": channel},
            "container": {
                "type": "message",
                "message_ts": message["ts"],
                "channel_id": channel,
                "is_ephemeral": bool(message.get("ephemeral")),
            },
            "message": {k: v for k, v in message.items() if k != "ephemeral"},
            "response_url": f"{self.origin}/response/{rid}",
            "trigger_id": f"trigger-{rid}",
            "actions": [{**button, "block_id": "b", "action_ts": self.next_ts()}],
        }

    async def interact(self, kind: str, payload: dict[str, Any]) -> Interaction:
        """Push a slash command or a block action; its record (answers arrive on it)."""
        envelope_id = f"env-{next(self._ids)}"
        it = Interaction(envelope_id, payload)
        self.interactions[envelope_id] = it
        await self.push(kind, payload, envelope_id=envelope_id)
        return it

    async def wait_answered(self, it: Interaction, timeout: float) -> Interaction:
        """Wait until an interaction is acked and has its answer (an ack payload or a response_url post)."""
        await self.wait_for(
            lambda: it.acked and (bool(it.responses) or bool(it.ack_payload)), timeout, what="an answer"
        )
        return it

    # ---- people act (Events API) --------------------------------------------------------------------

    def sign(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        """The headers Slack signs a request with: v0 HMAC-SHA256 over `v0:{ts}:{body}`."""
        ts = str(timestamp if timestamp is not None else int(time.time()))
        digest = hmac.new(self.signing_secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
        return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}"}

    async def deliver(self, payload: dict[str, Any], *, retry: int = 0, headers: dict[str, str] | None = None) -> int:
        """Post an event to the bot's endpoint as Slack does (signed, maybe a retry); the status it answered."""
        assert self.events_url is not None, "no Events API endpoint set"
        body = json.dumps(payload).encode()
        sent = {"Content-Type": "application/json", **self.sign(body), **(headers or {})}
        if retry:
            sent |= {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"}
        if self._http is None:
            self._http = aiohttp.ClientSession()
        async with self._http.post(self.events_url, data=body, headers=sent) as resp:
            await resp.read()
            self.event_answers.append(resp.status)
            return resp.status

    async def deliver_form(self, kind: str, payload: dict[str, Any]) -> int:
        """Post a slash command (its fields) or a press (`payload=` JSON) to the bot's endpoint, signed; the status."""
        assert self.events_url is not None, "no Events API endpoint set"
        fields = {"payload": json.dumps(payload)} if kind == "interactive" else payload
        body = urlencode(fields).encode()
        it = Interaction(f"http-{next(self._ids)}", payload, acked=True)
        self.interactions[it.envelope_id] = it
        headers = {"Content-Type": "application/x-www-form-urlencoded", **self.sign(body)}
        if self._http is None:
            self._http = aiohttp.ClientSession()
        async with self._http.post(self.events_url, data=body, headers=headers) as resp:
            await resp.read()
            self.event_answers.append(resp.status)
            return resp.status

    # ---- the server ---------------------------------------------------------------------------------

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        """Socket Mode: hello, then envelopes out and acks in."""
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self.sockets.append(ws)
        await ws.send_str(json.dumps({"type": "hello", "num_connections": len(self.sockets)}))
        self._notify()
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    self._acked(json.loads(msg.data))
        finally:
            self.sockets.remove(ws)
            self._notify()
        return ws

    def _acked(self, ack: dict[str, Any]) -> None:
        """The bot acknowledged an envelope (maybe with a response payload)."""
        envelope_id = str(ack.get("envelope_id"))
        self.acks[envelope_id] = ack
        it = self.interactions.get(envelope_id)
        if it is not None:
            it.acked = True
            payload = ack.get("payload")
            if payload:
                it.ack_payload = payload
        self._notify()

    async def _response(self, request: web.Request) -> web.Response:
        """A post to a response_url, kept on its interaction: replace_original edits the pressed message; otherwise a
        new message in the channel (in_channel) or one only the person sees (ephemeral)."""
        body = await request.json()
        rid = request.match_info["id"]
        it = next(i for i in self.interactions.values() if i.payload.get("response_url", "").endswith(f"/{rid}"))
        if body.get("replace_original") and "message" in it.payload:
            pressed = it.payload["message"]
            for m in [*self.messages, *self.ephemeral]:
                if m["ts"] == pressed["ts"] and m["channel"] == pressed["channel"]:
                    m.update({"text": body.get("text", ""), "blocks": body.get("blocks") or [], "edited": True})
        else:
            payload = it.payload
            channel = payload["channel"]["id"] if isinstance(payload.get("channel"), dict) else payload["channel_id"]
            user = payload["user"]["id"] if isinstance(payload.get("user"), dict) else payload["user_id"]
            msg = self._bot_message({"channel": channel, "text": body.get("text"), "blocks": body.get("blocks")})
            if body.get("response_type") == "in_channel":
                self.messages.append(msg)
            else:
                msg |= {"ephemeral": True, "to": user}
                self.ephemeral.append(msg)
            body["_message"] = msg
        it.responses.append(body)
        self._notify()
        return web.Response(text="ok")

    async def _api(self, request: web.Request) -> web.StreamResponse:
        """One Web API method: its arguments from the query, a form or JSON; 429 while one is scripted."""
        method = request.match_info["method"]
        args: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            args |= await request.json()
        elif request.can_read_body:
            args |= dict(await request.post())
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.calls.append((method, args))
        pending = self.rate_limit.get(method)
        if pending:
            retry_after = pending.pop(0)
            self._notify()
            return web.json_response(
                {"ok": False, "error": "ratelimited"}, status=429, headers={"Retry-After": str(retry_after)}
            )
        wanted = self.app_token if method == "apps.connections.open" else self.token
        if token != wanted:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        handler: Callable[[dict[str, Any]], dict[str, Any]] | None = getattr(
            self, "_m_" + method.replace(".", "_"), None
        )
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"})
        result = handler(args)
        self._notify()
        return web.json_response(result)

    def _m_auth_test(self, _: dict[str, Any]) -> dict[str, Any]:
        """Who the token is."""
        return {"ok": True, "url": "https://fake.slack.com/", "team": "Fake", "user": "assistant", "team_id": TEAM,
                "user_id": BOT_USER, "bot_id": BOT_ID}  # fmt: skip

    def _m_apps_connections_open(self, _: dict[str, Any]) -> dict[str, Any]:
        """Where the socket is."""
        return {"ok": True, "url": f"ws://127.0.0.1:{self._port}/socket"}

    def _m_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        """A bot message, kept."""
        msg = self._bot_message(args)
        self.messages.append(msg)
        self.sent.append(msg)
        return {"ok": True, "channel": msg["channel"], "ts": msg["ts"], "message": msg}

    def _m_chat_postEphemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        """A bot message only one person sees."""
        msg = {**self._bot_message(args), "ephemeral": True, "to": args["user"]}
        self.ephemeral.append(msg)
        return {"ok": True, "message_ts": msg["ts"]}

    def _m_chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        """A bot message edited."""
        msg = self.message(args["channel"], args["ts"])
        msg.update({"text": args.get("text", ""), "blocks": _blocks(args.get("blocks")), "edited": True})
        return {"ok": True, "channel": msg["channel"], "ts": msg["ts"]}

    def _m_conversations_open(self, args: dict[str, Any]) -> dict[str, Any]:
        """A person's DM channel."""
        return {"ok": True, "channel": {"id": self.dm_of(str(args["users"]))}}

    def _m_conversations_replies(self, args: dict[str, Any]) -> dict[str, Any]:
        """A thread's messages (its root first)."""
        root = str(args["ts"])
        found = [m for m in self.messages if m["channel"] == args["channel"] and root in (m["ts"], m.get("thread_ts"))]
        return {"ok": True, "messages": found, "has_more": False}

    def _m_users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        """A member's profile (their time zone)."""
        p = self.people.get(str(args["user"]))
        if p is None:
            return {"ok": False, "error": "user_not_found"}
        return {"ok": True, "user": {"id": p.id, "name": p.name, "real_name": p.name, "tz": p.tz,
                                     "profile": {"display_name": p.name, "real_name": p.name}}}  # fmt: skip

    def _m_views_publish(self, args: dict[str, Any]) -> dict[str, Any]:
        """The Home tab of a user."""
        view = args["view"] if isinstance(args["view"], dict) else json.loads(args["view"])
        self.views[str(args["user_id"])] = view
        return {"ok": True, "view": view}

    def _m_files_getUploadURLExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        """Where to upload a file's bytes."""
        file_id = f"F{next(self._ids):08d}"
        self.uploads[file_id] = {"name": args.get("filename"), "data": b""}
        return {"ok": True, "upload_url": f"{self.origin}/upload/{file_id}", "file_id": file_id}

    def _m_files_completeUploadExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        """Share uploaded files into a channel, as a message with them."""
        files = args["files"] if isinstance(args["files"], list) else json.loads(args["files"])
        shared = [{"id": f["id"], "name": self.uploads[f["id"]]["name"]} for f in files]
        msg = self._bot_message({"channel": args.get("channel_id"), "text": args.get("initial_comment", "")})
        msg["files"] = shared
        if args.get("thread_ts"):
            msg["thread_ts"] = args["thread_ts"]
        self.messages.append(msg)
        self.sent.append(msg)
        return {"ok": True, "files": shared}

    async def _upload(self, request: web.Request) -> web.Response:
        """A file's bytes."""
        file_id = request.match_info["id"]
        data = await request.read()
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            field_ = next(iter(form.values()))
            data = field_.file.read() if hasattr(field_, "file") else str(field_).encode()
        self.uploads[file_id]["data"] = data
        return web.Response(text="OK")

    async def _file(self, request: web.Request) -> web.Response:
        """A shared file's bytes, for the bot's token only."""
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.Response(status=403)
        return web.Response(body=self.files[request.match_info["id"]])

    def _bot_message(self, args: dict[str, Any]) -> dict[str, Any]:
        """A message the bot posts, as kept."""
        msg: dict[str, Any] = {
            "type": "message",
            "user": BOT_USER,
            "bot_id": BOT_ID,
            "channel": str(args["channel"]),
            "ts": self.next_ts(),
            "text": str(args.get("text") or ""),
            "blocks": _blocks(args.get("blocks")),
        }
        if args.get("thread_ts"):
            msg["thread_ts"] = str(args["thread_ts"])
        return msg

    def _recent(self) -> str:
        """The last calls, for timeout messages."""
        return f"last calls: {[m for m, _ in self.calls[-8:]]}; acks: {list(self.acks)[-5:]}"


def _blocks(blocks: Any) -> list[dict[str, Any]]:
    """Blocks as sent (JSON text in a form, a list in JSON)."""
    if not blocks:
        return []
    return list(json.loads(blocks) if isinstance(blocks, str) else blocks)
