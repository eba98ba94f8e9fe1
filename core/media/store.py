"""Attachments in PostgreSQL (sql/028): what the bot made of a file someone sent, kept for the account that sent it,
within the account's storage cap (MEDIA_ACCOUNT_MAX_BYTES)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from core.storage.db import Pool

Kind = Literal["voice", "audio", "photo", "document", "sticker"]

OVER_CAP = (
    "I can't keep this {kind}: your files here already take {used} of the {cap} I keep per person. Ask me to forget "
    "some of them, or send /memory wipe to start afresh."
)


class StorageFull(Exception):
    """The account's attachments would pass its storage cap; the message is the one line to show."""


@dataclass(frozen=True)
class Attachment:
    """A stored attachment (without its bytes)."""

    id: int
    kind: Kind
    name: str
    mime: str | None
    size_bytes: int
    total_pages: int | None
    created_at: datetime


def megabytes(n: int) -> str:
    """`3.2 MB`."""
    return f"{n / 1_000_000:.1f} MB"


# The insert happens only while the account stays within its cap. The account's row is locked first, in a statement
# of its own: the insert's snapshot is taken after the lock, so it sees what a file that held the lock just stored (two
# files arriving at once cannot both squeeze past the cap).
_LOCK_SQL = "SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE"
_SAVE_SQL = """
WITH used AS (SELECT coalesce(sum(size_bytes), 0) AS n FROM attachments WHERE account_id = $1),
ins AS (
    INSERT INTO attachments (account_id, identity_id, chat_id, turn_id, kind, name, mime, platform_ref, size_bytes,
                             data, pages, total_pages, created_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9::bigint, $10, $11, $12, $13 FROM used
    WHERE used.n + $9::bigint <= $14::bigint
    RETURNING id
)
SELECT (SELECT id FROM ins) AS id, (SELECT n FROM used) AS used
"""


async def save(
    pool: Pool,
    *,
    account_id: int,
    identity_id: int | None,
    chat_id: int | None,
    turn_id: int | None,
    kind: Kind,
    name: str,
    mime: str | None,
    platform_ref: str | None,
    data: bytes | None,
    pages: Sequence[str] | None,
    total_pages: int | None,
    now: datetime,
    cap_bytes: int,
) -> int:
    """Store an attachment of the account; its id. StorageFull when it would pass `cap_bytes`."""
    size = len(data or b"") + sum(len(p.encode()) for p in pages or ())
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(_LOCK_SQL, account_id)
        row = await conn.fetchrow(
            _SAVE_SQL,
            account_id,
            identity_id,
            chat_id,
            turn_id,
            kind,
            name,
            mime,
            platform_ref,
            size,
            data,
            list(pages) if pages is not None else None,
            total_pages,
            now,
            cap_bytes,
        )
    assert row is not None
    if row["id"] is None:
        used = int(row["used"] or 0)
        raise StorageFull(OVER_CAP.format(kind=kind, used=megabytes(used), cap=megabytes(cap_bytes)))
    return int(row["id"])


def _attachment(row: Any) -> Attachment:
    """An Attachment from a row."""
    return Attachment(
        row["id"], row["kind"], row["name"], row["mime"], row["size_bytes"], row["total_pages"], row["created_at"]
    )


_COLUMNS = "id, kind, name, mime, size_bytes, total_pages, created_at"


async def listed(pool: Pool, account_id: int, limit: int = 50) -> list[Attachment]:
    """The account's attachments, newest first."""
    rows = await pool.fetch(
        f"SELECT {_COLUMNS} FROM attachments WHERE account_id = $1 ORDER BY id DESC LIMIT $2", account_id, limit
    )
    return [_attachment(r) for r in rows]


async def page(
    pool: Pool, account_id: int, attachment_id: int, number: int, *, chat_id: int | None = None
) -> tuple[Attachment, str] | None:
    """Page `number` (from 1) of one of the account's attachments with text (with `chat_id`: only one sent in that
    chat); None when it is not theirs, has no text, or has no such page (another account's id is the same as none)."""
    row = await pool.fetchrow(
        f"SELECT {_COLUMNS}, pages[$3] AS text FROM attachments"
        " WHERE id = $2 AND account_id = $1 AND ($4::bigint IS NULL OR chat_id = $4)",
        account_id,
        attachment_id,
        number,
        chat_id,
    )
    if row is None or row["text"] is None:
        return None
    return _attachment(row), row["text"]


async def text_of(pool: Pool, account_id: int, attachment_id: int) -> tuple[str, list[str]] | None:
    """The name and pages of one of the account's attachments with text (None: not theirs, or no text)."""
    row = await pool.fetchrow(
        "SELECT name, pages FROM attachments WHERE id = $2 AND account_id = $1 AND pages IS NOT NULL",
        account_id,
        attachment_id,
    )
    return None if row is None else (row["name"], list(row["pages"]))


async def image(pool: Pool, account_id: int, attachment_id: int) -> bytes | None:
    """A stored photo's prepared bytes (None: not the account's, or no photo)."""
    data = await pool.fetchval(
        "SELECT data FROM attachments WHERE id = $2 AND account_id = $1 AND kind = 'photo'", account_id, attachment_id
    )
    return bytes(data) if data is not None else None


async def known(
    pool: Pool, account_id: int, chat_id: int, kind: Kind, platform_ref: str
) -> tuple[int, list[str]] | None:
    """The account's attachment of this platform file in this chat that was taken in before (its id and pages; a
    photo has none): the same file sent again, or an update handled again after a crash, is not taken in twice."""
    row = await pool.fetchrow(
        "SELECT id, pages FROM attachments WHERE account_id = $1 AND chat_id = $2 AND kind = $3 AND platform_ref = $4"
        " AND (pages IS NOT NULL OR data IS NOT NULL) ORDER BY id DESC LIMIT 1",
        account_id,
        chat_id,
        kind,
        platform_ref,
    )
    return None if row is None else (int(row["id"]), list(row["pages"] or ()))


async def used_bytes(pool: Pool, account_id: int) -> int:
    """What the account's attachments take."""
    n = await pool.fetchval("SELECT coalesce(sum(size_bytes), 0) FROM attachments WHERE account_id = $1", account_id)
    return int(n or 0)


async def link_turn(pool: Pool, attachment_ids: Sequence[int], turn_id: int) -> None:
    """Note the turn that answered these attachments (its "Show steps" then shows what a voice note was heard as)."""
    await pool.execute(
        "UPDATE attachments SET turn_id = $2 WHERE id = ANY($1::bigint[])", list(attachment_ids), turn_id
    )
