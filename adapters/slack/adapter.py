"""The Slack adapter (slack_sdk, async): start and stop, events in (through the inbox) over Socket Mode or the HTTP
Events API, slash commands and button presses answered directly, reminders out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from adapters.base import Limits, RunningAnswers
from adapters.slack import buttons, commands
from adapters.slack.buttons import reminder_buttons
from adapters.slack.files import lazy
from adapters.slack.home import publish_home
from adapters.slack.incoming import StoredMessage, clean_text, from_a_person, is_dm, mentions, received
from adapters.slack.limits import (
    SLACK_BUTTON_LABEL,
    SLACK_CONNECT_TIMEOUT_S,
    SLACK_CUT_NOTE_S,
    SLACK_NAMES_KEPT,
    SLACK_TEXT_LIMIT,
    SLACK_THREADS_KEPT,
    SLACK_UPLOAD_BYTES,
)
from adapters.slack.render import render_parts
from adapters.slack.reply import ThreadReply
from adapters.slack.send import deliver_reminder, note, patiently, post_parts
from core import (
    CUT_SHORT,
    EXIT_UNREACHABLE,
    FAILED,
    RESTARTING,
    Core,
    Delivery,
    ReminderMessage,
    Settings,
    StartupError,
)

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

log = logging.getLogger(__name__)

SLACK_LIMITS = Limits(message_chars=SLACK_TEXT_LIMIT, upload_bytes=SLACK_UPLOAD_BYTES, button_label=SLACK_BUTTON_LABEL)
EVENTS_PATH = "/slack/events"  # the Events API's endpoint on the bot's web server (events, commands, presses)
KINDS = {"events_api", "slash_commands", "interactive"}  # what the adapter takes of Slack's envelopes


class SlackAdapter:
    """Runs the bot on Slack inside the caller's event loop.

    A message the bot answers is stored in the core's inbox before Slack is told it arrived (Socket Mode: the ack
    is sent after the store; the Events API: 200 after the store): a process dying mid-turn loses nothing, another
    one (or the restarted one) answers it after its lease, and a redelivery (Slack's retries, the message's
    `message` and `app_mention` events) is stored once. Slash commands and presses must be acked within 3 s: acked
    at once, then answered through their response_url by this process."""

    platform = "slack"
    limits = SLACK_LIMITS

    def __init__(self, core: Core, settings: Settings) -> None:
        """Prepare the clients (nothing connected yet)."""
        assert settings.SLACK_BOT_TOKEN is not None
        self.core, self.settings = core, settings
        self.token = settings.SLACK_BOT_TOKEN.get_secret_value().strip()
        self.base_url = settings.SLACK_API_BASE_URL or AsyncWebClient.BASE_URL
        self.web = AsyncWebClient(token=self.token, base_url=self.base_url)
        app = settings.SLACK_APP_TOKEN
        self.app_token = app.get_secret_value().strip() if app is not None else None
        secret = settings.SLACK_SIGNING_SECRET
        self.verifier = SignatureVerifier(secret.get_secret_value()) if secret is not None else None
        self.team, self.bot_user = "", ""
        self.socket: SocketModeClient | None = None
        self.running = RunningAnswers("Slack", settings.SHUTDOWN_GRACE_SECONDS, SLACK_CUT_NOTE_S)
        self._threads: OrderedDict[tuple[str, str], None] = OrderedDict()  # threads the bot spoke in
        self._names: OrderedDict[str, str] = OrderedDict()  # people's display names by user id
        self._zones: dict[str, str] = {}  # their profiles' time zones, kept with the names

    @property
    def source(self) -> str:
        """The inbox key of this workspace's messages."""
        return f"slack:{self.team}"

    @property
    def webhook_path(self) -> str | None:
        """Where the Events API posts (None in Socket Mode)."""
        return EVENTS_PATH if self.app_token is None else None

    # ---- start and stop ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the token (auth.test), serve the stored messages, then open Socket Mode (when an app token is set);
        a failure is one StartupError line."""
        self.running.restart()
        self.web.session = aiohttp.ClientSession()  # one connection pool for every Web API call (else one per call)
        try:
            auth = await self.web.auth_test()
        except (SlackApiError, OSError) as e:
            await self.web.session.close()
            if isinstance(e, SlackApiError):
                raise StartupError(f"SLACK_BOT_TOKEN was refused by Slack ({e.response.get('error')})") from None
            raise StartupError(f"cannot reach Slack at {self.base_url} ({e})", exit_code=EXIT_UNREACHABLE) from None
        self.team, self.bot_user = str(auth["team_id"]), str(auth["user_id"])
        self.core.serve(self.source, StoredMessage.from_payload, self._on_stored)
        if self.app_token is not None:
            try:
                await self._open_socket(self.app_token)
            except BaseException:
                self.core.unserve(self.source)
                await self.web.session.close()
                raise
        self.core.report_state(self.platform, f"team {self.team} ({'Socket Mode' if self.socket else 'Events API'})")

    async def _open_socket(self, app_token: str) -> None:
        """Socket Mode: a wss URL from apps.connections.open (a refused token is a StartupError), then connect."""
        opener = AsyncWebClient(base_url=self.base_url, session=self.web.session)
        try:
            opened = await patiently(lambda: opener.apps_connections_open(app_token=app_token))
        except (SlackApiError, OSError) as e:
            detail = e.response.get("error") if isinstance(e, SlackApiError) else e
            raise StartupError(f"SLACK_APP_TOKEN could not open Socket Mode ({detail})") from None
        client = SocketModeClient(app_token, web_client=AsyncWebClient(base_url=self.base_url), logger=log)
        client.socket_mode_request_listeners.append(self._on_request)
        client.wss_uri = str(opened["url"])
        try:
            async with asyncio.timeout(SLACK_CONNECT_TIMEOUT_S):  # slack_sdk would try again forever
                await client.connect()  # type: ignore[no-untyped-call]
        except BaseException as e:
            await client.close()  # type: ignore[no-untyped-call]
            if isinstance(e, TimeoutError):
                why = f"Socket Mode's websocket did not open within {SLACK_CONNECT_TIMEOUT_S:g} s"
                raise StartupError(why, exit_code=EXIT_UNREACHABLE) from None
            raise
        self.socket = client

    async def stop(self) -> None:
        """Stop taking messages, let running answers finish (at most SHUTDOWN_GRACE_SECONDS; later ones are cut with
        a short note), then disconnect."""
        self.running.stopping = True
        self.core.unserve(self.source)
        if self.socket is not None:
            self.socket.socket_mode_request_listeners.clear()
        await self.running.drain()
        if self.socket is not None:
            await self.socket.close()  # type: ignore[no-untyped-call]
            self.socket = None
        if self.web.session is not None:
            await self.web.session.close()
        self.core.report_state(self.platform, None)

    # ---- in: Socket Mode and the Events API ---------------------------------------------------------

    async def _on_request(self, client: Any, request: SocketModeRequest) -> None:
        """One envelope: a message is acked only once stored (unacked, Slack sends it again); a command or a press
        is acked at once and answered through its response_url."""
        if request.type not in KINDS:
            await client.send_socket_mode_response(SocketModeResponse(request.envelope_id))
            return
        if request.type == "events_api":
            with self.running.tracked():
                try:
                    await self.on_event(request.payload)
                except Exception:
                    log.exception("a Slack event could not be stored; Slack sends it again")
                    return
            await client.send_socket_mode_response(SocketModeResponse(request.envelope_id))
            return
        await client.send_socket_mode_response(SocketModeResponse(request.envelope_id))
        await self.on_interaction(request.type, request.payload)

    async def on_webhook(self, request: Request) -> Response:
        """The Events API's POST (events, slash commands, presses): 401 without a valid signature (checked in
        constant time, at most 5 minutes old); an event is answered 200 only once stored (500 while the database is
        away: Slack retries, and the retry is stored once)."""
        from starlette.responses import JSONResponse, PlainTextResponse

        body = await request.body()
        assert self.verifier is not None
        if not self.verifier.is_valid_request(body, dict(request.headers)):
            return PlainTextResponse("invalid signature", 401)
        try:
            payload, kind = _posted(body, request.headers.get("content-type", ""))
        except (ValueError, KeyError):
            return PlainTextResponse("not an event, command or press", 400)
        if kind == "events_api":
            if payload.get("type") == "url_verification":
                return JSONResponse({"challenge": payload.get("challenge", "")})
            try:
                await self.on_event(payload)
            except Exception:
                log.exception("a Slack event could not be stored; Slack sends it again")
                return PlainTextResponse("not stored", 500)
            return PlainTextResponse("")
        self._spawn(self.on_interaction(kind, payload))
        return PlainTextResponse("")

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run work after the answer to Slack, as running work for stop(); a failure is logged."""

        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("Slack work after the ack failed")

        self.running.add(asyncio.create_task(run()))

    async def on_event(self, payload: dict[str, Any]) -> None:
        """An event_callback: a person's message for the bot stored in the inbox (raises when it cannot be: Slack is
        then not told, and sends it again), also while stopping (another process, or the next start, answers it);
        what needs no turn (a refusal) is answered here."""
        event = payload.get("event") or {}
        if event.get("type") == "app_home_opened" and event.get("tab") == "home" and not self.running.stopping:
            self._spawn(publish_home(self.core, self.web, self.team, event))  # no turn: not stored
            return
        if not from_a_person(event, self.bot_user) or not await self._addressed(event):
            return
        name = await self._name(str(event["user"]))
        text = clean_text(str(event.get("text", "")), self.bot_user, dict(self._names))
        stored = received(self.team, event, text, name, self._zones.get(str(event["user"]), ""))
        inc = stored.incoming
        if not self.core.is_allowed(inc):
            refusal = await self.core.refusal(inc)
            if refusal is not None:
                await post_parts(self.web, stored.channel, render_parts(refusal.message), thread_ts=stored.thread_ts)
        elif inc.text or stored.files:
            await self.core.receive(self.source, stored.update_id, inc.chat_key, stored.payload(), stored)

    async def _addressed(self, event: dict[str, Any]) -> bool:
        """DMs always; in a channel an @mention, or a message in a thread the bot is part of."""
        if is_dm(event) or mentions(event, self.bot_user):
            return True
        thread = event.get("thread_ts")
        if event.get("parent_user_id") == self.bot_user:  # a thread under the bot's own message
            return True
        return bool(thread) and await self._in_thread(str(event["channel"]), str(thread))

    async def _in_thread(self, channel: str, thread_ts: str) -> bool:
        """Whether the bot spoke in a thread (known here, else asked of conversations.replies)."""
        if (channel, thread_ts) in self._threads:
            return True
        replies = await patiently(lambda: self.web.conversations_replies(channel=channel, ts=thread_ts, limit=200))
        if any(m.get("user") == self.bot_user for m in replies.get("messages") or []):
            self._spoke(channel, thread_ts)
            return True
        return False

    def _spoke(self, channel: str, thread_ts: str) -> None:
        """Remember that the bot spoke in a thread."""
        self._threads[(channel, thread_ts)] = None
        self._threads.move_to_end((channel, thread_ts))
        while len(self._threads) > SLACK_THREADS_KEPT:
            self._threads.popitem(last=False)

    async def _name(self, user: str) -> str:
        """A person's display name (users.info, kept); their id when Slack will not say."""
        if user not in self._names:
            try:
                info = await patiently(lambda: self.web.users_info(user=user))
                profile = info["user"].get("profile") or {}
                self._names[user] = str(
                    profile.get("display_name") or profile.get("real_name") or info["user"].get("name") or user
                )
                self._zones[user] = str(info["user"].get("tz") or "")
            except SlackApiError:
                return user
            while len(self._names) > SLACK_NAMES_KEPT:
                self._zones.pop(self._names.popitem(last=False)[0], None)
        return self._names[user]

    async def _zone(self, user: str) -> str:
        """A person's time zone from their Slack profile ("" when Slack will not say)."""
        await self._name(user)
        return self._zones.get(user, "")

    async def on_interaction(self, kind: str, payload: dict[str, Any]) -> None:
        """A slash command or a button press, answered through its response_url."""
        if kind == "slash_commands":
            work = self._command(payload)
        elif payload.get("type") == "block_actions":
            work = buttons.press(self.core, self.team, payload)
        else:
            return
        await self._guard(str(payload.get("response_url", "")), work)

    async def _command(self, payload: dict[str, Any]) -> None:
        """A slash command, with its person's time zone from their Slack profile (kept after the first lookup)."""
        zone = await self._zone(str(payload.get("user_id")))
        await commands.run(self.core, self.web, self.team, payload, zone)

    async def _guard(self, url: str, work: Coroutine[Any, Any, None]) -> None:
        """Run an interaction's work as running work for stop(); a failure is logged and told briefly."""
        if self.running.stopping:
            work.close()
            await note(url, RESTARTING)
            return
        with self.running.tracked():
            try:
                await work
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(SLACK_CUT_NOTE_S):
                        await note(url, CUT_SHORT)
                raise
            except Exception:
                log.exception("a Slack command or press failed")
                with contextlib.suppress(Exception):
                    await note(url, FAILED)

    # ---- answers out -------------------------------------------------------------------------------

    async def _on_stored(self, delivery: Delivery) -> None:
        """A stored message's turn, in the process that received it or another one."""
        stored: StoredMessage = delivery.update
        if self.running.stopping:  # declined: the inbox hands it back at once for another process (or the next start)
            raise asyncio.CancelledError
        inc = stored.incoming
        if stored.files:
            inc = replace(inc, uploads=tuple(lazy(self.token, f) for f in stored.files))
        budget = self.settings.AGENT_TOTAL_TIMEOUT  # as Telegram's: an answer arrives late rather than never
        reply = ThreadReply(self.web, stored.channel, stored.thread_ts, self._spoke, budget)
        with self.running.tracked():
            try:
                await self.core.answer(inc, reply, delivery=delivery)
            except asyncio.CancelledError:
                if self.running.cutting:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(SLACK_CUT_NOTE_S):
                            await post_parts(self.web, stored.channel, [CUT_SHORT], thread_ts=stored.thread_ts)
                raise
            except Exception:
                log.exception("a Slack answer failed")
                with contextlib.suppress(Exception):
                    await post_parts(self.web, stored.channel, [FAILED], thread_ts=stored.thread_ts)

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Push a reminder into its DM or channel with Done / Snooze (see send.deliver_reminder); a command it names
        (/link's note: "/unlink separates one again") as typed on Slack."""
        said = replace(msg, text=commands.on_slack(msg.text))
        return await deliver_reminder(self.web, said, reminder_buttons(msg.buttons, msg.task_id))


def _posted(body: bytes, content_type: str) -> tuple[dict[str, Any], str]:
    """What the Events API posted and its kind: an event (JSON), a press (a form's `payload=` JSON) or a slash
    command (a form); ValueError or KeyError when it is none of them."""
    if content_type.startswith("application/json"):
        payload = json.loads(body)
        if not isinstance(payload, dict):
            raise ValueError("not a JSON object")
        return payload, "events_api"
    form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
    if "payload" in form:
        pressed = json.loads(form["payload"])
        if not isinstance(pressed, dict):
            raise ValueError("not a JSON object")
        return pressed, "interactive"
    if "command" not in form:  # a slash command's form names it
        raise KeyError("command")
    return form, "slash_commands"
