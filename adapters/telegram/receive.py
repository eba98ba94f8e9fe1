"""Receiving Telegram updates by long polling or by webhook: each one is parsed once and stored in the core's inbox
before Telegram is told it arrived (the next getUpdates offset, or the webhook's 200)."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from typing import TYPE_CHECKING, Any

from telegram import Update

from adapters.telegram.limits import TELEGRAM_POLL_RETRY_MAX_S
from adapters.telegram.request import TelegramBot, one_line
from core import Core, clean_json

if TYPE_CHECKING:  # the web server's types: webhook mode only (polling never loads them)
    from starlette.requests import Request
    from starlette.responses import Response

log = logging.getLogger(__name__)

HANDLED_UPDATES = [Update.MESSAGE, Update.CALLBACK_QUERY]  # allowed_updates: what the routes take
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


class Receiver:
    """Brings updates from Telegram into the inbox, in order per chat."""

    def __init__(self, core: Core, bot: TelegramBot, source: str, poll_timeout: int, secret: str) -> None:
        """Store into `core` what `bot` receives, under `source` (the bot's own inbox key); `secret`: the webhook's
        secret token."""
        self.core, self.bot, self.source = core, bot, source
        self.poll_timeout = poll_timeout
        self._secret = secret.encode()

    def parse(self, payload: dict[str, Any]) -> Update:
        """A stored payload as PTB's Update (bound to the bot, so its shortcuts work)."""
        return Update.de_json(payload, self.bot)

    async def poll(self) -> None:
        """Long polling until cancelled: store each batch in the inbox, and only then confirm it (the next offset);
        trouble is retried with a growing pause (at once the first time), and never stops the bot."""
        offset, pause = 0, 0.0
        while True:
            try:
                for payload in await self.bot.updates_as_sent(offset, self.poll_timeout, HANDLED_UPDATES):
                    taken = await self._take(payload)
                    offset = max(offset, taken + 1) if taken is not None else offset
                pause = 0.0
            except Exception as e:
                log.warning("Telegram polling error (will retry in %g s): %s", pause, one_line(e))
                await asyncio.sleep(pause)
                pause = min(max(pause * 2, 1.0), TELEGRAM_POLL_RETRY_MAX_S)

    async def on_webhook(self, request: Request) -> Response:
        """Telegram's POST of one update: 403 without the right secret; 200 only once it is stored in the inbox, or
        kept as a dead letter when it cannot be (503 while the database is away: Telegram delivers it again later)."""
        from starlette.responses import PlainTextResponse

        given = request.headers.get(SECRET_HEADER, "").encode()
        if not hmac.compare_digest(given, self._secret):
            return PlainTextResponse("wrong or missing secret token", 403)
        body = await request.body()
        try:
            payload: Any = json.loads(body)
        except ValueError:
            payload = body.decode(errors="replace")
        try:
            await self._take(payload)
        except Exception as e:
            log.warning("could not store a Telegram update (%s); Telegram will deliver it again", one_line(e))
            return PlainTextResponse("try again later", 503)
        return PlainTextResponse("ok")

    async def _take(self, payload: Any) -> int | None:
        """Store one update as Telegram sent it, cleaned of what PostgreSQL cannot hold; one that cannot be parsed
        is kept as a dead letter instead (never retried for ever). Returns its update id (None: it had none)."""
        payload = clean_json(payload)
        given = payload.get("update_id") if isinstance(payload, dict) else None
        update_id = given if isinstance(given, int) and not isinstance(given, bool) else None
        try:
            if not isinstance(payload, dict):
                raise ValueError("not a JSON object")
            update = self.parse(payload)
        except Exception as e:
            await self.core.quarantine(self.source, update_id, f"not a Telegram update ({one_line(e)})", payload)
            return update_id
        await self._store(payload, update)
        return update.update_id

    async def _store(self, payload: dict[str, Any], update: Update) -> None:
        """Put an update in the inbox under its chat (a chat's updates are handled one at a time, in order); the
        parsed update goes along, so a process that takes it at once does not parse it again."""
        chat, user = update.effective_chat, update.effective_user
        key = f"telegram:{chat.id}" if chat else f"telegram:user:{user.id}" if user else "telegram:-"
        await self.core.receive(self.source, update.update_id, key, payload, update)
