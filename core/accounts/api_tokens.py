"""Per-account bearer tokens (sql/025): `/token` in a private chat lists, makes and revokes them; `bot token` makes one
for the terminal user. A token speaks as the identity that made it (admin rights stay per identity) for that
identity's account at the time of use, so after /unlink it follows the identity. Only a sha256 of the secret is
stored: the secret is shown once, and a token is found by its hash (no comparison of secrets)."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.constants import (
    API_TOKEN_BYTES,
    API_TOKEN_MAX_LIVE,
    API_TOKEN_NAME_CHARS,
    API_TOKEN_PREFIX,
    API_TOKEN_TOUCH_EVERY,
)
from core.storage.db import Pool
from core.timeutil import fmt_local, zone
from core.types import Bearer as Bearer  # re-exported: it lived here first
from core.types import UserRef

SECRET_CHARS = len(API_TOKEN_PREFIX) + len(secrets.token_urlsafe(API_TOKEN_BYTES))  # every secret is this long
NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{API_TOKEN_NAME_CHARS}}}")

USAGE = "Use /token to list your tokens, /token new <name> to make one, /token revoke <name> to revoke one."
NAME_RULE = f"A token's name is 1 to {API_TOKEN_NAME_CHARS} letters, digits, `.`, `_` or `-`, e.g. /token new laptop."
NAME_TAKEN = "You already have a token named `{name}`: pick another name, or /token revoke {name} first."
TOO_MANY = f"You have {API_TOKEN_MAX_LIVE} tokens, the most an account may hold: /token revoke one first."
MADE = (
    "Your new token **{name}**:\n```\n{secret}\n```\nCopy it now: I show it only this once (I keep only a hash of "
    "it). It acts as you, with your tasks, memory and budget: keep it secret, and send /token revoke {name} if it "
    "leaks."
)
REVOKED = "Revoked **{name}**: it no longer works."
NOT_FOUND = "You have no token named `{name}`; /token lists yours."
NONE_YET = "You have no tokens. /token new <name> makes one, e.g. /token new laptop."
HOW = "/token new <name> makes one more, /token revoke <name> revokes one."

_CREATE_SQL = """
INSERT INTO api_tokens (account_id, identity_id, name, token_hash, created_at)
SELECT u.account_id, u.id, $2, $3, $4 FROM users u
WHERE u.id = $1 AND (SELECT count(*) FROM api_tokens t WHERE t.account_id = u.account_id AND t.revoked_at IS NULL) < $5
ON CONFLICT DO NOTHING
RETURNING id
"""
# The token's identity and that identity's account now; last_used_at written only when older than a minute. The API
# joins the session a request names to it (core/api/sessions.py: one round trip).
AUTHENTICATE_SQL = """
WITH found AS (
    SELECT t.id, t.name, t.last_used_at, u.id AS identity_id, u.account_id, u.platform, u.platform_user_id,
           u.display_name
    FROM api_tokens t JOIN users u ON u.id = t.identity_id
    WHERE t.token_hash = $1 AND t.revoked_at IS NULL
), touched AS (
    UPDATE api_tokens t SET last_used_at = $2 FROM found f
    WHERE t.id = f.id AND (t.last_used_at IS NULL OR t.last_used_at <= $3)
)
SELECT * FROM found f"""


@dataclass(frozen=True)
class Token:
    """A live token as /token lists it (never its secret)."""

    name: str
    created_at: datetime
    last_used_at: datetime | None


class TokenRefused(Exception):
    """A token could not be made; the message is the one line to show."""


def secret_hash(secret: str) -> bytes:
    """What the table stores of a secret."""
    return hashlib.sha256(secret.encode()).digest()


async def create(pool: Pool, user: UserRef, name: str, now: datetime) -> str:
    """A new token named `name` for the identity `user` (its account's tokens: at most API_TOKEN_MAX_LIVE, names
    unique); returns the secret, which is never stored. Raises TokenRefused."""
    if not NAME.fullmatch(name):
        raise TokenRefused(NAME_RULE)
    secret = API_TOKEN_PREFIX + secrets.token_urlsafe(API_TOKEN_BYTES)
    made = await pool.fetchval(_CREATE_SQL, user.id, name, secret_hash(secret), now, API_TOKEN_MAX_LIVE)
    if made is not None:
        return secret
    taken = await pool.fetchval(
        "SELECT 1 FROM api_tokens t JOIN users u ON u.account_id = t.account_id"
        " WHERE u.id = $1 AND t.name = $2 AND t.revoked_at IS NULL",
        user.id,
        name,
    )
    raise TokenRefused(NAME_TAKEN.format(name=name) if taken else TOO_MANY)


async def live_tokens(pool: Pool, account_id: int) -> list[Token]:
    """The account's tokens that work, oldest first."""
    rows = await pool.fetch(
        "SELECT name, created_at, last_used_at FROM api_tokens WHERE account_id = $1 AND revoked_at IS NULL"
        " ORDER BY created_at, id",
        account_id,
    )
    return [Token(r["name"], r["created_at"], r["last_used_at"]) for r in rows]


async def revoke(pool: Pool, account_id: int, name: str, now: datetime) -> bool:
    """Revoke the account's live token of that name (False: it has none)."""
    status = await pool.execute(
        "UPDATE api_tokens SET revoked_at = $3 WHERE account_id = $1 AND name = $2 AND revoked_at IS NULL",
        account_id,
        name,
        now,
    )
    return status != "UPDATE 0"


def well_formed(secret: str) -> bool:
    """Whether a presented secret can be a token's at all (else the database is not asked)."""
    return len(secret) == SECRET_CHARS and secret.startswith(API_TOKEN_PREFIX)


async def authenticate(pool: Pool, secret: str, now: datetime) -> Bearer | None:
    """Whom a presented secret acts as, or None for a wrong or revoked one (found by its hash: no secret is compared
    character by character); notes the use at most once per API_TOKEN_TOUCH_EVERY."""
    if not well_formed(secret):
        return None
    row = await pool.fetchrow(AUTHENTICATE_SQL, secret_hash(secret), now, now - API_TOKEN_TOUCH_EVERY)
    return None if row is None else bearer_of(row)


def bearer_of(row: Any) -> Bearer:
    """Whom an authenticated row acts as."""
    return Bearer(
        row["id"],
        row["name"],
        row["identity_id"],
        row["account_id"],
        row["platform"],
        row["platform_user_id"],
        row["display_name"],
    )


def parse(text: str) -> dict[str, str]:
    """`/token`, `/token new <name>`, `/token revoke <name>` as options (else action "invalid")."""
    words = text.split()
    action = words[0].lower() if words else "list"
    if action in ("new", "revoke"):
        return {"action": action, "name": " ".join(words[1:])}
    return {"action": "list" if len(words) <= 1 and action == "list" else "invalid"}


async def answer(pool: Pool, user: UserRef, options: dict[str, str] | None, now: datetime) -> str:
    """What /token says in a private chat: the account's tokens, a new one's secret (once), or a revocation."""
    options = options or {}
    action, name = options.get("action") or "list", (options.get("name") or "").strip()
    if action == "new":
        try:
            return MADE.format(name=name, secret=await create(pool, user, name, now))
        except TokenRefused as e:
            return str(e)
    if action == "revoke":
        if not NAME.fullmatch(name):
            return NAME_RULE
        done = await revoke(pool, user.account_id, name, now)
        return (REVOKED if done else NOT_FOUND).format(name=name)
    if action != "list":
        return USAGE
    tokens = await live_tokens(pool, user.account_id)
    if not tokens:
        return NONE_YET
    tz = zone(user.timezone)
    lines = ["**Your tokens**:"]
    for t in tokens:
        used = fmt_local(t.last_used_at, tz, now) if t.last_used_at is not None else "never"
        lines.append(f"- `{t.name}` — made {fmt_local(t.created_at, tz, now)}, last used {used}")
    return "\n".join([*lines, HOW])
