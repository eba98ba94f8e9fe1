"""What `/memory` needs: a person's memory shown with line numbers, one line deleted, everything wiped."""

from __future__ import annotations

from dataclasses import dataclass

from core.memory.blocks import (
    BLOCKS_JSON_SQL,
    Block,
    blocks_from_rows,
    line_index,
    load_blocks,
    lock_memory,
    pick,
    store,
)
from core.storage.db import Pool

_OVERVIEW_SQL = (
    f"SELECT {BLOCKS_JSON_SQL} AS blocks, (SELECT count(*) FROM archival_memory WHERE user_id = $1) AS archival,"
    " (SELECT count(*) FROM attachments WHERE account_id = $1) AS files,"
    " (SELECT coalesce(sum(size_bytes), 0) FROM attachments WHERE account_id = $1) AS file_bytes"
)


_RELEARN_SQL = """
SELECT count(memory_learn_words($1, m.content)) FROM messages m
WHERE m.role = 'user' AND m.user_id IN (SELECT u.id FROM users u WHERE u.account_id = $1) AND m.content IS NOT NULL
"""


@dataclass(frozen=True)
class Overview:
    """A person's memory: their blocks (human and persona always) and how many archival entries they have."""

    blocks: list[Block]
    archival: int
    files: int = 0  # the files they sent that are kept (core/media/store.py), and what they take
    file_bytes: int = 0

    def text(self, limit: int) -> str:
        """The blocks with numbered lines, then the archival count (no LLM involved)."""
        out: list[str] = []
        for block in self.blocks:
            out += [block.header(limit), *block.numbered()]
        out.append(f"Archival memory: {self.archival} {'entry' if self.archival == 1 else 'entries'}")
        if self.files:
            out.append(f"Files you sent: {self.files} ({self.file_bytes / 1_000_000:.1f} MB)")
        return "\n".join(out)


async def memory_overview(pool: Pool, user_id: int) -> Overview:
    """A person's blocks and archival count, in one round trip."""
    row = await pool.fetchrow(_OVERVIEW_SQL, user_id)
    assert row is not None
    return Overview(blocks_from_rows(row["blocks"]), int(row["archival"]), int(row["files"]), int(row["file_bytes"]))


async def delete_memory_line(pool: Pool, user_id: int, block: str, line_number: int) -> str:
    """Delete one line (1-based) of a block; raises ToolError (one readable line) for a wrong block or line."""
    async with pool.acquire() as conn, conn.transaction():
        found = pick(await load_blocks(conn, user_id, lock=True), block)
        i = line_index(found, line_number)
        await store(conn, user_id, Block(found.name, found.lines[:i] + found.lines[i + 1 :]))
    return found.lines[i]


@dataclass(frozen=True)
class Wiped:
    """How much a wipe removed."""

    lines: int
    archival: int
    files: int = 0


async def wipe_memory(pool: Pool, user_id: int) -> Wiped:
    """Remove every block and archival entry of a person, and the files they sent (conversation history is /reset's
    business: a file's mark left in it names nothing any more).

    The words their search learned go too, and are learned again from their conversation alone.
    """
    async with pool.acquire() as conn, conn.transaction():
        await lock_memory(conn, user_id)  # an append in flight finishes first, or starts after the wipe
        row = await conn.fetchrow(
            "WITH bl AS (DELETE FROM memory_blocks WHERE user_id = $1 RETURNING cardinality(lines) AS n),"
            " ar AS (DELETE FROM archival_memory WHERE user_id = $1 RETURNING 1),"
            " sw AS (DELETE FROM memory_search_words WHERE user_id = $1),"
            " fi AS (DELETE FROM attachments WHERE account_id = $1 RETURNING 1)"
            " SELECT (SELECT coalesce(sum(n), 0) FROM bl) AS lines, (SELECT count(*) FROM ar) AS archival,"
            " (SELECT count(*) FROM fi) AS files",
            user_id,
        )
        await conn.execute(_RELEARN_SQL, user_id)
    assert row is not None
    return Wiped(int(row["lines"]), int(row["archival"]), int(row["files"]))
