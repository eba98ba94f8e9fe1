"""Linking identities into one account (sql/021): one-time codes (`/link`), the link when another identity sends one
(`/link CODE`; the merge itself is core/accounts/merge.py), the identities of an account, and `/unlink`. Admin rights
and allow-listing are not here: they stay with identities (`ADMINS`, `ALLOWED_USERS`), whatever account an identity
belongs to.

Lock order, the same for everything that links or unlinks: the trying identity's `link_tries` row, the identities of
the account that is merged away (or split), then account rows in id order, then the rows that move. A turn's start
takes its identity's row before anything of the account, so it either started before a link (which then sees it
running and says to try again when it is done) or starts after it, in the merged account."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from core.accounts.merge import Merged, merge
from core.constants import (
    LINK_CODE_ALPHABET,
    LINK_CODE_CHARS,
    LINK_CODE_TTL,
    LINK_KEEP,
    LINK_LIVE_CODES,
    LINK_LOCK,
    LINK_MAX_WRONG,
    LINK_NOTICE_TIMEOUT_S,
    LINK_RETRIES,
)
from core.memory.blocks import plural
from core.reminders.engine import Outbox
from core.reminders.messages import ReminderMessage
from core.storage.db import Conn, Pool, affected
from core.timeutil import zone
from core.types import ChatRef, UserRef

log = logging.getLogger(__name__)

NOT_A_CODE = (
    "That does not look like a link code: a code has 8 letters and digits, like K7QX-M2PA. "
    "Send /link alone in a private chat to get one."
)
OWN_CODE = "That is your own code: send it to me from your other account (another platform) to link the two."
ALREADY = "You are already linked with that account: /link lists the identities linked to yours."
WRONG = "That code is wrong, expired or already used. {left} more wrong {tries} lock linking for an hour."
LOCKED_NOW = "That code is wrong, expired or already used — too many wrong codes: linking is locked until {until}."
LOCKED = "Too many wrong codes: linking is locked until {until}. Then ask for a new code with /link."
BUSY = (
    "An answer of yours is still being written in another chat ({where}); when it is done, send /link {code} again "
    "(the code stays valid until {until})."
)
CHANGED = "Your accounts changed while I was linking them; please send /link with the code again."
ONLY_IN_PRIVATE = "Send {command} to me in a private chat."
RETIRED = " That code was shown here, so it no longer works: ask for a new one with /link in a private chat."
UNLINK_USAGE = "Use /unlink platform:id with an identity that /link lists, e.g. /unlink discord:123456."
NOT_LINKED = "`{key}` is not linked to your account; /link lists the identities that are."
ONLY_ONE = "`{key}` is the only identity of your account: there is nothing to separate it from."
REHOMED = " The reminders of {tasks} made in {whose} chats {where} from now on."
UNLINK_BUSY = (
    "An answer for `{key}` is still being written ({where}): its tools act for this account until it is done. "
    "Send /unlink {key} again then."
)

_LOCK_TRIES_SQL = """
INSERT INTO link_tries (user_id) VALUES ($1)
ON CONFLICT (user_id) DO UPDATE SET user_id = EXCLUDED.user_id
RETURNING wrong, first_wrong_at, locked_until
"""
_FIND_CODE_SQL = """
SELECT c.account_id, c.issued_by, c.used_at, c.expires_at, (SELECT u.account_id FROM users u WHERE u.id = $2) AS mine
FROM link_codes c WHERE c.code_sha256 = $1
"""
_USE_CODE_SQL = """
UPDATE link_codes SET used_at = $2, used_by = $3
WHERE code_sha256 = $1 AND used_at IS NULL AND expires_at > $2 AND account_id = $4
RETURNING issued_by, chat_id
"""
_RUNNING_SQL = """
SELECT c.platform FROM turns t JOIN users u ON u.id = t.user_id JOIN chats c ON c.id = t.chat_id
WHERE u.account_id = $1 AND t.status = 'running' AND t.started_at > now() - $2::interval
LIMIT 1
"""
_RUNNING_ONE_SQL = """
SELECT c.platform FROM turns t JOIN chats c ON c.id = t.chat_id
WHERE t.user_id = $1 AND t.status = 'running' AND t.started_at > now() - $2::interval
LIMIT 1
"""
_LOCK_MERGED = "SELECT timezone FROM accounts WHERE id = $1 FOR UPDATE"  # deleted at the end
_LOCK_KEPT = "SELECT timezone FROM accounts WHERE id = $1 FOR NO KEY UPDATE"  # others' key checks may go on
_IDENTITY_SQL = "SELECT id, platform, platform_user_id, display_name FROM users WHERE id = $1"
# /unlink: the account's open tasks that remind in a private chat of the identity separated ($2: where it spoke, whose
# chat id is its own, as Telegram's are, or $4, where it sent /unlink itself), or in a chat of a platform the account
# has no identity on any more, remind in its private chat $3 from now on: never the separated identity's (someone
# else's, maybe), never as an identity of another platform. Run once $2 has left account $1.
_REHOME_SQL = """
UPDATE tasks t SET chat_id = $3, updated_at = now()
FROM chats c
WHERE t.user_id = $1 AND c.id = t.chat_id AND c.id <> $3 AND t.status IN ('pending', 'in_progress')
  AND (c.id = $4
       OR (c.kind = 'private' AND (EXISTS (SELECT 1 FROM turns x WHERE x.chat_id = c.id AND x.user_id = $2)
                                   OR EXISTS (SELECT 1 FROM users s WHERE s.id = $2 AND s.platform = c.platform
                                              AND s.platform_user_id = c.platform_chat_id)))
       OR NOT EXISTS (SELECT 1 FROM users u WHERE u.account_id = $1 AND u.platform = c.platform))
"""
# /unlink: the new account starts with a copy of the usage of this month (and a day more: any zone's month) of the
# account it leaves, so a person cannot spend a budget again by unlinking (and linking again, and unlinking again).
_COPY_USAGE_SQL = """
INSERT INTO token_usage (account_id, day, model, prompt_tokens, completion_tokens, cached_tokens, calls)
SELECT $2, day, model, prompt_tokens, completion_tokens, cached_tokens, calls FROM token_usage
WHERE account_id = $1 AND day >= ($3::timestamptz AT TIME ZONE 'UTC')::date - 32
"""
# The private chat an account (once the identity separating itself has left it) used last, as the reminder fallback
# picks one (core/reminders/queries.py); one it never spoke in when its chat id is an identity's own (Telegram's).
_HOME_SQL = """
SELECT chat FROM (
    SELECT x.chat_id AS chat, max(x.started_at) AS at FROM users u JOIN turns x ON x.user_id = u.id
    JOIN chats c ON c.id = x.chat_id WHERE u.account_id = $1 AND c.kind = 'private' GROUP BY x.chat_id
    UNION ALL
    SELECT c.id, NULL FROM users u JOIN chats c ON c.platform = u.platform AND c.platform_chat_id = u.platform_user_id
    WHERE u.account_id = $1 AND c.kind = 'private'
) h ORDER BY at DESC NULLS LAST, chat LIMIT 1
"""


class _Moved(Exception):
    """An account changed while the link waited for it: start over."""


@dataclass(frozen=True)
class Identity:
    """One platform identity of an account."""

    id: int
    platform: str
    platform_user_id: str
    display_name: str

    @property
    def key(self) -> str:
        """`platform:id`, as /unlink takes it (and ADMINS names it)."""
        return f"{self.platform}:{self.platform_user_id}"

    def shown(self) -> str:
        """`` `discord:456` (ann#0) ``."""
        name = " ".join(self.display_name.split())
        return f"`{self.key}`" + (f" ({name})" if name else "")


@dataclass(frozen=True)
class Code:
    """A code just made: as shown (K7QX-M2PA) and until when it works."""

    text: str
    expires_at: datetime


@dataclass(frozen=True)
class Where:
    """A chat to tell something in."""

    platform: str
    chat_id: str
    thread_id: str


@dataclass(frozen=True)
class Linked:
    """A link made: who issued the code (and where), who sent it, and what was merged."""

    issuer: Identity
    redeemer: Identity
    told_in: Where | None
    merged: Merged
    account_id: int

    def answer(self, block_words: int) -> str:
        """What the identity that sent the code is told."""
        return (
            f"🔗 Linked with {self.issuer.shown()}: you are one account now — "
            f"{self.merged.summary(block_words)} /link lists the linked identities, /unlink separates one again."
        )

    def notice(self, block_words: int) -> str:
        """What the identity that issued the code is told, in the chat where it asked for the code."""
        return (
            f"🔗 {self.redeemer.shown()} used your link code: you are one account now — "
            f"{self.merged.summary(block_words)} /link lists the linked identities, /unlink separates one again."
        )


def normalise(raw: str) -> str | None:
    """The code in `raw` (any case, with or without the dash or spaces), or None when it cannot be one."""
    text = "".join(raw.split()).replace("-", "").upper()
    if len(text) != LINK_CODE_CHARS or any(c not in LINK_CODE_ALPHABET for c in text):
        return None
    return text


def _digest(code: str) -> bytes:
    """What is stored of a (normalised) code."""
    return hashlib.sha256(code.encode()).digest()


def _shown(code: str) -> str:
    """`K7QXM2PA` → `K7QX-M2PA`."""
    half = len(code) // 2
    return f"{code[:half]}-{code[half:]}"


def _at(when: datetime, tz_name: str) -> str:
    """`10:10 CET` in the person's zone."""
    return when.astimezone(zone(tz_name)).strftime("%H:%M %Z")


async def issue(pool: Pool, user: UserRef, chat: ChatRef, now: datetime) -> Code:
    """A new one-time code joining into the speaker's account (the identity keeps at most LINK_LIVE_CODES unused
    ones: older ones stop working); codes expired more than LINK_KEEP ago are deleted on the way."""
    while True:
        code = "".join(secrets.choice(LINK_CODE_ALPHABET) for _ in range(LINK_CODE_CHARS))
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("DELETE FROM link_codes WHERE expires_at < $1", now - LINK_KEEP)
            await conn.execute(
                "DELETE FROM link_codes WHERE code_sha256 IN (SELECT code_sha256 FROM link_codes"
                " WHERE issued_by = $1 AND used_at IS NULL ORDER BY created_at DESC OFFSET $2)",
                user.id,
                LINK_LIVE_CODES - 1,
            )
            expires = await conn.fetchval(
                "INSERT INTO link_codes (code_sha256, account_id, issued_by, chat_id, created_at, expires_at)"
                " SELECT $1, u.account_id, u.id, $3, $4, $5 FROM users u WHERE u.id = $2"
                " ON CONFLICT (code_sha256) DO NOTHING RETURNING expires_at",
                _digest(code),
                user.id,
                chat.id,
                now,
                now + LINK_CODE_TTL,
            )
        if expires is not None:  # else the one in 2^40 that exists already: another
            return Code(_shown(code), expires)


async def retire(pool: Pool, raw: str) -> bool:
    """A code shown in a group stops working at once (anyone there could send it): whether there was such a code."""
    code = normalise(raw)
    if code is None:
        return False
    gone = await pool.execute("DELETE FROM link_codes WHERE code_sha256 = $1 AND used_at IS NULL", _digest(code))
    return affected(gone) > 0


async def identities(pool: Pool | Conn, account_id: int) -> list[Identity]:
    """The identities of an account, oldest first."""
    rows = await pool.fetch(
        "SELECT id, platform, platform_user_id, display_name FROM users WHERE account_id = $1 ORDER BY id", account_id
    )
    return [Identity(r["id"], r["platform"], r["platform_user_id"], r["display_name"]) for r in rows]


def code_text(code: Code, linked: Sequence[Identity], user: UserRef) -> str:
    """The answer to /link: the code, how to use it, and the identities linked now."""
    lines = [
        f"Your link code: **{code.text}** — it works once, until {_at(code.expires_at, user.timezone)}.",
        f"Send `/link {code.text}` (on Discord: `/link code:{code.text}`) to me from your other account (on another "
        "platform, or the terminal) to make the "
        "two one account: its tasks, memory and notes join this one, and this one's time zone stays. "
        "Whoever sends this code joins your account: never give it to anyone else.",
        "",
        "Linked to this account now:",
    ]
    lines += [f"- {i.shown()}" + (" — this one" if i.id == user.id else "") for i in linked]
    return "\n".join(lines)


async def redeem(
    pool: Pool, user: UserRef, raw: str, now: datetime, *, block_words: int, busy_within: timedelta
) -> Linked | str:
    """`/link CODE` from `user`: merge their account into the code's (or the one line saying why not). A wrong,
    expired or used code is a wrong try; LINK_MAX_WRONG of them within LINK_LOCK lock linking for this identity."""
    code = normalise(raw)
    if code is None:
        return NOT_A_CODE
    for _ in range(LINK_RETRIES):
        try:
            async with pool.acquire() as conn, conn.transaction():
                return await _redeem(conn, user, code, now, block_words, busy_within)
        except _Moved:
            continue
    return CHANGED


async def _redeem(
    conn: Conn, user: UserRef, code: str, now: datetime, block_words: int, busy_within: timedelta
) -> Linked | str:
    """One attempt, in a transaction."""
    tries = await conn.fetchrow(_LOCK_TRIES_SQL, user.id)  # this identity's tries, one at a time
    assert tries is not None
    if tries["locked_until"] is not None and tries["locked_until"] > now:
        return LOCKED.format(until=_at(tries["locked_until"], user.timezone))
    digest = _digest(code)
    found = await conn.fetchrow(_FIND_CODE_SQL, digest, user.id)
    if found is not None and found["issued_by"] == user.id:
        return OWN_CODE
    if found is not None and found["account_id"] == found["mine"]:
        return ALREADY
    if found is None or found["used_at"] is not None or found["expires_at"] <= now:
        return await _wrong(conn, user, tries, now)
    kept, merged = found["account_id"], found["mine"]
    await conn.execute("SELECT 1 FROM users WHERE account_id = $1 ORDER BY id FOR NO KEY UPDATE", merged)
    if await conn.fetchval("SELECT account_id FROM users WHERE id = $1", user.id) != merged:
        raise _Moved
    zones: dict[int, str | None] = {}
    for account in sorted((kept, merged)):
        row = await conn.fetchrow(_LOCK_MERGED if account == merged else _LOCK_KEPT, account)
        if row is None:
            raise _Moved
        zones[account] = row["timezone"]
    running = await conn.fetchval(_RUNNING_SQL, merged, busy_within)
    if running is not None:  # its tools would write to the account merged away: let it finish first
        return BUSY.format(where=running, code=_shown(code), until=_at(found["expires_at"], user.timezone))
    used = await conn.fetchrow(_USE_CODE_SQL, digest, now, user.id, kept)
    if used is None:
        again = await conn.fetchrow("SELECT used_at, expires_at FROM link_codes WHERE code_sha256 = $1", digest)
        if again is not None and again["used_at"] is None and again["expires_at"] > now:
            raise _Moved  # its account was merged into another meanwhile
        return await _wrong(conn, user, tries, now)  # someone else used it first
    await conn.execute("UPDATE link_tries SET wrong = 0, first_wrong_at = NULL WHERE user_id = $1", user.id)
    result = await merge(conn, kept, merged, zones, now, block_words)
    issuer, redeemer = await _identity(conn, used["issued_by"]), await _identity(conn, user.id)
    where = None
    if used["chat_id"] is not None:
        chat = await conn.fetchrow(
            "SELECT platform, platform_chat_id, thread_id FROM chats WHERE id = $1", used["chat_id"]
        )
        if chat is not None:
            where = Where(chat["platform"], chat["platform_chat_id"], chat["thread_id"])
    return Linked(issuer, redeemer, where, result, kept)


async def _identity(conn: Conn, identity_id: int) -> Identity:
    """One identity by its id."""
    row = await conn.fetchrow(_IDENTITY_SQL, identity_id)
    assert row is not None
    return Identity(row["id"], row["platform"], row["platform_user_id"], row["display_name"])


async def _wrong(conn: Conn, user: UserRef, tries: asyncpg.Record, now: datetime) -> str:
    """Count a wrong code for `user` (its row is locked); the LINK_MAX_WRONG-th within LINK_LOCK locks linking."""
    fresh = tries["first_wrong_at"] is None or tries["first_wrong_at"] <= now - LINK_LOCK
    wrong = 1 if fresh else tries["wrong"] + 1
    if wrong >= LINK_MAX_WRONG:
        until = now + LINK_LOCK
        await conn.execute(
            "UPDATE link_tries SET wrong = 0, first_wrong_at = NULL, locked_until = $2 WHERE user_id = $1",
            user.id,
            until,
        )
        log.warning("linking locked for %s:%s after %d wrong codes", user.platform, user.platform_user_id, wrong)
        return LOCKED_NOW.format(until=_at(until, user.timezone))
    await conn.execute(
        "UPDATE link_tries SET wrong = $2, first_wrong_at = $3 WHERE user_id = $1",
        user.id,
        wrong,
        now if fresh else tries["first_wrong_at"],
    )
    left = LINK_MAX_WRONG - wrong
    return WRONG.format(left=left, tries="try" if left == 1 else "tries")


async def tell(outboxes: Mapping[str, Outbox], where: Where | None, owner: Identity, text: str, now: datetime) -> bool:
    """Push `text` into a private chat through its platform's outbox (the reminders' path, without buttons); a
    failure is logged, never raised (the link it tells of stands)."""
    outbox = outboxes.get(where.platform) if where is not None else None
    if where is None or outbox is None:
        log.warning("link made, but %s cannot be told: no way to its chat from this process", owner.key)
        return False
    msg = ReminderMessage(
        task_id=0,
        scheduled_at=now,
        platform=where.platform,
        chat_id=where.chat_id,
        thread_id=where.thread_id,
        chat_kind="private",
        owner_id=owner.platform_user_id,
        owner_name=owner.display_name,
        text=text,
        buttons=(),
    )
    try:
        async with asyncio.timeout(LINK_NOTICE_TIMEOUT_S):
            await outbox.send_reminder(msg)
    except Exception as e:
        log.warning("link made, but telling %s failed (%s: %s)", owner.key, type(e).__name__, e)
        return False
    return True


async def unlink(pool: Pool, user: UserRef, raw: str, *, here: int, now: datetime, busy_within: timedelta) -> str:
    """`/unlink platform:id` sent in the private chat `here`: that identity of the speaker's account gets a new empty
    account of its own (with the time zone, an admin's budget and a copy of this month's usage, so separating never
    lifts a budget); everything made so far stays with this account, and so do the reminders of its tasks (those made
    in the separated identity's chats remind in one of its own). Not while an answer for that identity is still being
    written (`busy_within`: how long one may run): its tools act for this account until it ends."""
    key = raw.strip().strip("`").strip()
    platform, _, pid = key.partition(":")
    if not platform or not pid:
        return UNLINK_USAGE
    async with pool.acquire() as conn, conn.transaction():
        account = await conn.fetchval("SELECT account_id FROM users WHERE id = $1", user.id)
        rows = await conn.fetch(
            "SELECT id, platform, platform_user_id, display_name FROM users WHERE account_id = $1 ORDER BY id"
            " FOR NO KEY UPDATE",
            account,
        )
        kept = await conn.fetchrow(
            "SELECT timezone, daily_tokens FROM accounts WHERE id = $1 FOR NO KEY UPDATE", account
        )
        ids = [Identity(r["id"], r["platform"], r["platform_user_id"], r["display_name"]) for r in rows]
        target = next((i for i in ids if i.platform == platform.lower() and i.platform_user_id == pid), None)
        if target is None or kept is None or user.id not in {i.id for i in ids}:
            return NOT_LINKED.format(key=key[:80])
        if len(ids) == 1:
            return ONLY_ONE.format(key=target.key)
        running = await conn.fetchval(_RUNNING_ONE_SQL, target.id, busy_within)
        if running is not None:
            return UNLINK_BUSY.format(key=target.key, where=running)
        tz = kept["timezone"]  # and an admin's budget for the person, so separating never lifts it
        new = await conn.fetchval(
            "INSERT INTO accounts (timezone, daily_tokens) VALUES ($1, $2) RETURNING id", tz, kept["daily_tokens"]
        )
        await conn.execute("UPDATE users SET account_id = $2 WHERE id = $1", target.id, new)
        await conn.execute(_COPY_USAGE_SQL, account, new, now)
        await conn.execute("DELETE FROM link_codes WHERE issued_by = $1 AND used_at IS NULL", target.id)
        home = here if target.id != user.id else await conn.fetchval(_HOME_SQL, account)
        moved = 0 if home is None else affected(await conn.execute(_REHOME_SQL, account, target.id, home, here))
    zone_note = f"time zone {tz}" if tz else "no time zone set yet"
    rest = ", ".join(i.shown() for i in ids if i.id != target.id)
    if target.id == user.id:
        return (
            f"Separated {target.shown()} — this one: from now on it has an empty account of its own ({zone_note}). "
            f"Tasks, reminders, memory and usage made until now stay with the account of {rest}."
            + (
                REHOMED.format(
                    tasks=plural(moved, "task"), whose="this identity's", where="go to a private chat of theirs"
                )
                if moved
                else ""
            )
        )
    return (
        f"Separated {target.shown()}: it starts again with an empty account of its own ({zone_note}). "
        "Tasks, reminders, memory and usage made until now stay with this account."
        + (REHOMED.format(tasks=plural(moved, "task"), whose="its", where="come here") if moved else "")
    )
