"""Signing in to the web chat page without a password (sql/027): `/web` in a private chat answers with a one-time link
(WEB_LINK_TTL, single use); opening it (`redeem`) makes a web sign-in whose secret goes into the browser's cookie once.
A sign-in speaks as the identity that asked for the link (admin rights stay per identity) for that identity's account
at the time of use, like an API token. Only sha256 hashes of codes and secrets are stored; the CSRF token is kept as
is (it is worth nothing without the cookie, and the page can be given it again on every load)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

from core.constants import (
    WEB_KEEP,
    WEB_LINK_BYTES,
    WEB_LINK_LIVE,
    WEB_LINK_TTL,
    WEB_LOGIN_BYTES,
    WEB_LOGIN_MAX_LIVE,
    WEB_LOGIN_TTL,
)
from core.storage.db import Pool
from core.types import Bearer, UserRef

SIGNIN_PATH = "/signin"  # the page that redeems a link: <base>/signin?code=<code>
WEB_NAME = "web"  # a web sign-in's Bearer.name (its token_id is 0)
_CODE = re.compile(rf"[A-Za-z0-9_-]{{{len(secrets.token_urlsafe(WEB_LINK_BYTES))}}}")
_SECRET = re.compile(rf"[A-Za-z0-9_-]{{{len(secrets.token_urlsafe(WEB_LOGIN_BYTES))}}}")

# the link as a Markdown autolink, so no `_` of the code is read as emphasis
LINK_TEXT = (
    "Your sign-in link for the web chat:\n<{url}>\nIt expires in {minutes} minutes and works once: keep it to yourself."
)
NO_BASE_URL = "The web chat has no public address yet: the bot's operator must set PUBLIC_BASE_URL."
SIGNIN_LINE = "The web page, signed in as you (this link works once, within {minutes} minutes): {url}"
NOT_SERVED = (  # the terminal's /web while this process serves no web page
    "No web page is served here: run `uv run bot serve` (it prints a sign-in link), or start the terminal chat with "
    "PORT set (e.g. `PORT=8080 uv run bot`) and send /web again."
)

# The link is used by exactly one redeem (a concurrent one finds used_at set and gets nothing) and makes the sign-in
# in the same statement.
_REDEEM_SQL = """
WITH used AS (
    UPDATE web_links SET used_at = $2
    WHERE code_hash = $1 AND used_at IS NULL AND expires_at > $2
    RETURNING identity_id
)
INSERT INTO web_signins (secret_hash, identity_id, csrf, created_at, expires_at)
SELECT $3, identity_id, $4, $2, $5 FROM used
RETURNING identity_id
"""
# The sign-in's identity and that identity's account now.
_AUTHENTICATE_SQL = """
SELECT s.csrf, u.id AS identity_id, u.account_id, u.platform, u.platform_user_id, u.display_name
FROM web_signins s JOIN users u ON u.id = s.identity_id
WHERE s.secret_hash = $1 AND s.signed_out_at IS NULL AND s.expires_at > $2
"""
# Beyond WEB_LOGIN_MAX_LIVE live sign-ins of one identity, the oldest end.
_END_OLDEST_SQL = """
UPDATE web_signins SET signed_out_at = $2 WHERE id IN (
    SELECT id FROM web_signins WHERE identity_id = $1 AND signed_out_at IS NULL AND expires_at > $2
    ORDER BY created_at DESC, id DESC OFFSET $3)
"""


@dataclass(frozen=True)
class WebLogin:
    """A new web sign-in: the cookie's secret (shown to the browser once, stored hashed), the CSRF token the page
    sends back with every change, and when the sign-in ends."""

    secret: str
    csrf: str
    expires_at: datetime


def _hash(secret: str) -> bytes:
    """What the tables store of a code or a secret."""
    return hashlib.sha256(secret.encode()).digest()


def link_url(base_url: str, code: str) -> str:
    """The link `/web` shows: the sign-in page with the code."""
    return f"{base_url}{SIGNIN_PATH}?code={code}"


async def new_link(pool: Pool, user: UserRef, now: datetime) -> str:
    """A new one-time code signing in as the identity `user` (it keeps at most WEB_LINK_LIVE unused ones: older ones
    stop working); rows ended more than WEB_KEEP ago are deleted on the way."""
    code = secrets.token_urlsafe(WEB_LINK_BYTES)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("DELETE FROM web_links WHERE expires_at < $1", now - WEB_KEEP)
        await conn.execute(
            "DELETE FROM web_links WHERE id IN (SELECT id FROM web_links"
            " WHERE identity_id = $1 AND used_at IS NULL ORDER BY created_at DESC, id DESC OFFSET $2)",
            user.id,
            WEB_LINK_LIVE - 1,
        )
        await conn.execute(
            "INSERT INTO web_links (code_hash, identity_id, created_at, expires_at) VALUES ($1, $2, $3, $4)",
            _hash(code),
            user.id,
            now,
            now + WEB_LINK_TTL,
        )
    return code


async def redeem(pool: Pool, code: str, now: datetime) -> WebLogin | None:
    """The web sign-in a link's code makes, once (None: a wrong, expired or used code; of concurrent redeems only one
    wins)."""
    if not _CODE.fullmatch(code):
        return None
    secret, csrf = secrets.token_urlsafe(WEB_LOGIN_BYTES), secrets.token_urlsafe(WEB_LOGIN_BYTES)
    expires = now + WEB_LOGIN_TTL
    async with pool.acquire() as conn, conn.transaction():
        identity = await conn.fetchval(_REDEEM_SQL, _hash(code), now, _hash(secret), csrf, expires)
        if identity is None:
            return None
        await conn.execute(_END_OLDEST_SQL, identity, now, WEB_LOGIN_MAX_LIVE)
        await conn.execute(
            "DELETE FROM web_signins WHERE expires_at < $1 OR signed_out_at < $1", now - WEB_KEEP
        )  # ended a while ago: nothing can use them any more
    return WebLogin(secret, csrf, expires)


async def authenticate(pool: Pool, secret: str, now: datetime) -> tuple[Bearer, str] | None:
    """Whom a cookie's secret signs in as (its identity and that identity's account now), with the sign-in's CSRF
    token; None for an unknown, expired or signed-out one (found by its hash: no secret is compared)."""
    if not _SECRET.fullmatch(secret):
        return None
    row = await pool.fetchrow(_AUTHENTICATE_SQL, _hash(secret), now)
    if row is None:
        return None
    bearer = Bearer(
        0,
        WEB_NAME,
        row["identity_id"],
        row["account_id"],
        row["platform"],
        row["platform_user_id"],
        row["display_name"],
    )
    return bearer, row["csrf"]


def csrf_matches(expected: str, presented: str | None) -> bool:
    """Whether a request carries the sign-in's CSRF token (compared in constant time)."""
    return presented is not None and hmac.compare_digest(expected.encode(), presented.encode())


async def sign_out(pool: Pool, secret: str, now: datetime) -> None:
    """End the sign-in of this cookie's secret (nothing happens for an unknown or ended one)."""
    if _SECRET.fullmatch(secret):
        await pool.execute(
            "UPDATE web_signins SET signed_out_at = $2 WHERE secret_hash = $1 AND signed_out_at IS NULL",
            _hash(secret),
            now,
        )


async def answer(pool: Pool, user: UserRef, base_url: str | None, now: datetime) -> str:
    """What /web says in a private chat: a new one-time link, or that the operator has not set the address."""
    if base_url is None:
        return NO_BASE_URL
    code = await new_link(pool, user, now)
    return LINK_TEXT.format(url=link_url(base_url, code), minutes=WEB_LINK_TTL.seconds // 60)
