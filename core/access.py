"""Who may use the bot and with what powers: ALLOWED_USERS and ADMINS, the refusal (once per chat per hour), whose
words a group's context holds, and the per-person and per-chat message rates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.constants import REFUSAL_EVERY_S
from core.settings import Settings
from core.storage import refusals
from core.storage.db import Pool
from core.types import JOB_MESSAGE_PREFIX, Error, Incoming

FLOOD_USER = (
    "You're sending messages faster than I can take them (at most {n} a minute). I'll skip the ones that arrive in "
    "the next moments; they stay saved. Send your next message in a minute."
)
FLOOD_CHAT = (
    "This chat is sending more messages than I can take (at most {n} a minute). I'll skip the ones that arrive in "
    "the next moments; they stay saved."
)


class Access:
    """The access policy, from the settings (and the database, for when a refusal was last told)."""

    def __init__(self, settings: Settings, pool: Pool) -> None:
        """Read ADMINS, ALLOWED_USERS and the rate limits from `settings`."""
        self.pool = pool
        self.admins, self.allowed = settings.admins, settings.allowed_users
        self.per_user, self.per_chat = settings.USER_MESSAGES_PER_MINUTE, settings.CHAT_MESSAGES_PER_MINUTE

    def is_admin(self, inc: Incoming) -> bool:
        """Admins come from ADMINS; the local terminal user is always one (over the HTTP API only when ADMINS names it:
        a leaked token must not carry the operator's powers by default)."""
        return (inc.platform == "console" and not inc.via) or inc.user_key in self.admins

    def is_allowed(self, inc: Incoming) -> bool:
        """ALLOWED_USERS (or `*`) plus the admins, and the terminal's user wherever it speaks (its identity is the
        machine's own: only someone at it makes a `bot token` or a sign-in link for it)."""
        return inc.platform == "console" or self.is_admin(inc) or "*" in self.allowed or inc.user_key in self.allowed

    async def refusal(self, inc: Incoming) -> Error | None:
        """The refusal for a user who may not use the bot (at most once per chat per hour, across all processes)."""
        if not await refusals.claim_refusal_notice(self.pool, inc.chat_key, REFUSAL_EVERY_S):
            return None
        return Error("not_allowed", refusal_text(inc))

    def admins_only(self, platform: str, rows: Sequence[Mapping[str, Any]]) -> bool:
        """Whether every replayed message of a group comes from an admin's turn (else admin tools stay off:
        a member must not plant instructions that an admin's turn executes).

        A scheduled job's prompt does not count as the admin's: it may have been written by a turn that
        read other members' text, and it runs (and is replayed) with nobody watching.
        """
        return platform == "console" or all(
            r["author_id"] is not None
            and f"{platform}:{r['author_id']}" in self.admins
            and not (r["platform_message_id"] or "").startswith(JOB_MESSAGE_PREFIX)
            for r in rows
        )

    def flood(self, inc: Incoming, user_recent: int, chat_recent: int) -> str | None:
        """None when the message may be answered; past a rate limit the note to send once (then "": stay silent).
        Scheduled jobs are limited by JOB_MIN_INTERVAL_MINUTES instead."""
        if (inc.message_id or "").startswith(JOB_MESSAGE_PREFIX):
            return None
        if user_recent >= self.per_user:
            return FLOOD_USER.format(n=self.per_user) if user_recent == self.per_user else ""
        if chat_recent >= self.per_chat:
            return FLOOD_CHAT.format(n=self.per_chat) if chat_recent == self.per_chat else ""
        return None


def all_by(inc: Incoming, rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every replayed user message of a group is the speaker's own (not a scheduled job's prompt)."""
    return all(
        r["author_id"] == inc.user_id and not (r["platform_message_id"] or "").startswith(JOB_MESSAGE_PREFIX)
        for r in rows
        if r["role"] == "user"
    )


def refusal_text(inc: Incoming) -> str:
    """The polite refusal that shows the user their id."""
    return (
        f"Sorry, this assistant is private. Your {inc.platform} id is {inc.user_id} — ask the owner to "
        f"add {inc.user_key} to ALLOWED_USERS."
    )
