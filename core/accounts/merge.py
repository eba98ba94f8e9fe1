"""The merge of two accounts when an identity sends another's link code (core/accounts/linking.py): everything of
the account merged away moves into the code's account in one transaction (rows as they are, memory lines that fit,
archival notes it does not have yet), the code's account keeping its own settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from core.constants import MEMORY_MAX_BLOCKS
from core.memory.blocks import Block, load_blocks, plural, store
from core.storage.db import Conn, affected

# Rows of the account that is merged away ($2) that move to the code's account ($1) as they are. Tasks keep their
# chat and their maker (tasks.created_by), so reminders still arrive where they were made. A later per-account table
# adds its statement here (the merge runs them in this order, in one transaction).
MOVES: tuple[tuple[str, str], ...] = (
    ("identities", "UPDATE users SET account_id = $1 WHERE account_id = $2"),
    ("tasks", "UPDATE tasks SET user_id = $1 WHERE user_id = $2"),
    ("codes", "UPDATE link_codes SET account_id = $1 WHERE account_id = $2"),
    ("usage", "UPDATE token_usage SET account_id = $1 WHERE account_id = $2"),  # sql/022: summed by every reader
    ("reservations", "UPDATE token_reservations SET account_id = $1 WHERE account_id = $2"),  # calls in flight
    ("attachments", "UPDATE attachments SET account_id = $1 WHERE account_id = $2"),  # sql/028: files sent
    (  # sql/033: accounts connected at MCP servers; where both have one, the code's account keeps its own
        "mcp credentials",
        "UPDATE mcp_credentials m SET account_id = $1 WHERE m.account_id = $2"
        " AND NOT EXISTS (SELECT 1 FROM mcp_credentials k WHERE k.account_id = $1 AND k.server = m.server)",
    ),
    (
        "search words",
        "INSERT INTO memory_search_words (user_id, word) SELECT $1, word FROM memory_search_words WHERE user_id = $2"
        " ORDER BY word ON CONFLICT DO NOTHING",  # one order: concurrent learners cannot deadlock with it
    ),
    # the code's account keeps its settings; one it has not set comes from the account merged away (so an admin's
    # budget for either person stays: a link never lifts it)
    (
        "settings",
        "UPDATE accounts k SET timezone = coalesce(k.timezone, m.timezone), model = coalesce(k.model, m.model),"
        " daily_tokens = coalesce(k.daily_tokens, m.daily_tokens) FROM accounts m WHERE k.id = $1 AND m.id = $2",
    ),
)
# Archival notes the code's account does not have yet (same sha256) move over, numbered after its highest; the
# duplicates go with the merged account.
_MOVE_ARCHIVAL_SQL = """
WITH top AS (SELECT coalesce(max(number), 0) AS n FROM archival_memory WHERE user_id = $1),
new AS (
    SELECT x.id, row_number() OVER (ORDER BY x.number, x.id) AS k FROM archival_memory x
    WHERE x.user_id = $2
      AND NOT EXISTS (SELECT 1 FROM archival_memory w WHERE w.user_id = $1 AND w.sha256 = x.sha256)
)
UPDATE archival_memory a SET user_id = $1, number = top.n + new.k FROM new, top WHERE a.id = new.id
"""
_ADD_NOTES_SQL = """
INSERT INTO archival_memory (user_id, content, sha256, created_at)
SELECT $1, c, sha256(convert_to(c, 'UTF8')), $3 FROM unnest($2::text[]) WITH ORDINALITY AS u(c, n) ORDER BY n
ON CONFLICT (user_id, sha256) DO NOTHING
"""


@dataclass
class Merged:
    """What a merge moved into the code's account."""

    lines: int = 0  # memory lines added to its blocks
    same_lines: int = 0  # lines its blocks already had
    overflow: list[str] = field(default_factory=list)  # lines that did not fit: kept as archival notes
    notes: int = 0  # archival notes moved
    same_notes: int = 0  # notes it already had (same sha256)
    tasks: int = 0
    timezone: str | None = None  # the merged account's time zone (None: none set, DEFAULT_TIMEZONE)
    timezone_taken: bool = False  # it came from the account merged away (the code's had none)

    def summary(self, block_words: int) -> str:
        """`merged 3 memory lines, 2 archival notes and 4 tasks; time zone Europe/Berlin kept.` (and what was not)."""
        counts = [(self.lines, "memory line"), (self.notes, "archival note"), (self.tasks, "task")]
        moved = [plural(n, noun) for n, noun in counts if n]
        text = "merged " + _and(moved) if moved else "there was nothing to merge"
        same = self.same_lines + self.same_notes
        if same:
            text += f" ({plural(same, 'duplicate')} left out)"
        if self.timezone is not None:
            text += f"; time zone {self.timezone} " + (
                "taken over from the joining account" if self.timezone_taken else "kept"
            )
        text += "."
        if self.overflow:
            n = len(self.overflow)
            kept = "it was kept as an archival note" if n == 1 else "they were kept as archival notes"
            text += f" {plural(n, 'memory line')} did not fit in {block_words} words of a block: {kept}."
        return text


def _and(items: Sequence[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


async def merge(
    conn: Conn, kept: int, merged: int, zones: Mapping[int, str | None], now: datetime, block_words: int
) -> Merged:
    """Move everything of account `merged` into account `kept` and delete `merged` (both rows locked by the caller,
    in a transaction): the rows of MOVES as they are, with the settings of `kept` winning (time zone, model, budget:
    the other's only where `kept` has none); memory lines that `kept` does not have (as many as fit in each block; the
    rest become archival notes) and archival notes it does not have."""
    result = Merged()
    for name, sql in MOVES:
        status = await conn.execute(sql, kept, merged)
        if name == "tasks":
            result.tasks = affected(status)
    await _merge_blocks(conn, kept, merged, block_words, result)
    before = await conn.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", merged)
    result.notes = affected(await conn.execute(_MOVE_ARCHIVAL_SQL, kept, merged))
    result.same_notes = before - result.notes
    if result.overflow:
        await conn.execute(_ADD_NOTES_SQL, kept, result.overflow, now)
        await conn.execute("SELECT count(memory_learn_words($1, c)) FROM unnest($2::text[]) c", kept, result.overflow)
    result.timezone, result.timezone_taken = zones[kept] or zones[merged], zones[kept] is None and bool(zones[merged])
    await conn.execute("DELETE FROM accounts WHERE id = $1", merged)  # what is left of it: duplicates
    return result


def _same(line: str) -> str:
    """A line as compared for duplicates: case and spacing aside."""
    return " ".join(line.split()).casefold()


async def _merge_blocks(conn: Conn, kept: int, merged: int, limit: int, result: Merged) -> None:
    """Add the memory lines of `merged` that `kept` does not have to its blocks of the same name, while they fit."""
    ours = {b.name: b for b in await load_blocks(conn, kept)}
    for block in await load_blocks(conn, merged):
        target = ours.get(block.name)
        if target is None and len(ours) >= MEMORY_MAX_BLOCKS:  # no room for another block
            result.overflow += [f"[{block.name}] {line}" for line in block.lines]
            continue
        lines = list(target.lines if target is not None else ())
        seen = {_same(line) for line in lines}
        for line in block.lines:
            if _same(line) in seen:
                result.same_lines += 1
            elif Block(block.name, (*lines, line)).words > limit:
                result.overflow.append(f"[{block.name}] {line}")
            else:
                lines.append(line)
                seen.add(_same(line))
                result.lines += 1
        if target is None or len(lines) > len(target.lines):
            ours[block.name] = Block(block.name, tuple(lines))
            if lines:
                await store(conn, kept, ours[block.name])
