"""The Telegram settings checked before anything starts (no python-telegram-bot import: a bad token fails fast)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from core import Settings

DEFAULT_API_HOST = "api.telegram.org"
DEFAULT_BASE_URL = f"https://{DEFAULT_API_HOST}/bot"  # PTB's default: the token follows
TOKEN_SHAPE = re.compile(r"[0-9]{1,20}:[A-Za-z0-9_-]{30,64}")  # what @BotFather gives: <bot id>:<secret>


def config_problem(settings: Settings) -> str | None:
    """One line naming what is wrong with the Telegram settings' shape, or None (also when Telegram is off)."""
    token = settings.TELEGRAM_BOT_TOKEN
    if token is not None and TOKEN_SHAPE.fullmatch(token.get_secret_value()) is None:
        return (
            "TELEGRAM_BOT_TOKEN does not look like a bot token: expected <digits>:<about 35 letters, digits, - or _>, "
            "as @BotFather gives it"
        )
    return None


def api_host(base_url: str | None) -> str:
    """The host (and port) of the Bot API URL, for error messages."""
    if not base_url:
        return DEFAULT_API_HOST
    parts = urlsplit(base_url if "://" in base_url else f"https://{base_url}")
    try:
        port = parts.port
    except ValueError:  # not a number: aiohttp will say so when connecting
        port = None
    host = parts.hostname or "the TELEGRAM_API_BASE_URL host"
    return f"{host}:{port}" if port else host
