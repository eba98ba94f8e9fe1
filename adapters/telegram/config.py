"""The Telegram settings checked before anything starts (no python-telegram-bot import: a bad token fails fast), the
Bot API URL python-telegram-bot is given, and the bot's own id (the key of its updates and messages)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from core import Settings

DEFAULT_API_HOST = "api.telegram.org"
DEFAULT_BASE_URL = f"https://{DEFAULT_API_HOST}/bot"  # PTB's default: the token follows
TOKEN_SHAPE = re.compile(r"[0-9]{1,20}:[A-Za-z0-9_-]{30,64}")  # what @BotFather gives: <bot id>:<secret>
LEGACY_SOURCE = "telegram"  # the inbox key of updates stored before it named the bot (see TelegramAdapter._start)


def config_problem(settings: Settings) -> str | None:
    """One line naming what is wrong with the Telegram settings' shape, or None (also when Telegram is off)."""
    token = settings.TELEGRAM_BOT_TOKEN
    if token is None:
        return None
    if TOKEN_SHAPE.fullmatch(token.get_secret_value()) is None:
        return (
            "TELEGRAM_BOT_TOKEN: does not look like a bot token (expected <digits>:<about 35 letters, digits, - or _>, "
            "as @BotFather gives it)"
        )
    base_url = settings.TELEGRAM_API_BASE_URL or ""
    why = base_url_problem(base_url)
    if why is not None:
        return (
            f"TELEGRAM_API_BASE_URL: {why} (got {base_url!r}; use a Bot API server's URL such as "
            "http://localhost:8081, or leave it unset for api.telegram.org)"
        )
    return None


def base_url_problem(base_url: str) -> str | None:
    """Why a TELEGRAM_API_BASE_URL cannot be a Bot API server's URL, or None (also when it is empty: unset)."""
    if not base_url:
        return None
    if any(c.isspace() for c in base_url):
        return "has spaces"
    try:
        parts = urlsplit(base_url)
    except ValueError as e:  # e.g. an unclosed [IPv6 address
        return f"is not a URL ({str(e).lower()})"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "has no host"
    try:
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number from 0 to 65535)
    except ValueError:
        return "its port is not a number from 0 to 65535"
    if parts.query or parts.fragment or "{" in base_url:
        return "cannot have a ?query, a #fragment or a {placeholder} (the token goes after it)"
    return None


def bot_api_url(base_url: str | None) -> str:
    """What PTB puts the token after (…/bot): TELEGRAM_API_BASE_URL with or without its /bot (a local Bot API
    server's address as its docs give it, e.g. http://localhost:8081, or PTB's http://localhost:8081/bot)."""
    if not base_url:
        return DEFAULT_BASE_URL
    url = base_url.rstrip("/")
    return url if url.endswith("/bot") else f"{url}/bot"


def bot_file_url(base_url: str | None) -> str:
    """What PTB puts the token after to download a file (…/file/bot, then /<file_path>): the same Bot API server as
    every other call (without it PTB would fetch files from api.telegram.org even with TELEGRAM_API_BASE_URL set)."""
    return bot_api_url(base_url).removesuffix("/bot") + "/file/bot"


def bot_id(token: str) -> str:
    """The bot's own id: the digits before the token's colon (the id getMe gives)."""
    return token.partition(":")[0]


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
