"""Core memory blocks: named lists of lines per user, word-limited, rendered into the system prompt."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import asyncpg

from core.constants import (
    MEMORY_LINE_CHARS,
    MEMORY_MAX_BLOCKS,
    MEMORY_NAME_SHOW_CHARS,
    MEMORY_WARN_SHARE,
    MEMORY_WORD_CHARS,
)
from core.quoting import truncate
from core.storage.db import Pool
from core.tools.framework import ToolError

HUMAN, PERSONA = "human", "persona"
DESCRIPTIONS = {HUMAN: "Facts about the user", PERSONA: "How you behave with this user"}
_ALIASES = {"user": HUMAN, "me": HUMAN, "assistant": PERSONA, "self": PERSONA, "you": PERSONA}
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

# The blocks of user $1 as JSON ([{"name", "lines"}], human and persona first), for a context query.
BLOCKS_JSON_SQL = "memory_blocks_json($1)"


@dataclass(frozen=True)
class Block:
    """One block of one user: its name and lines (1-based for people and the model)."""

    name: str
    lines: tuple[str, ...]

    @cached_property
    def words(self) -> int:
        """How many words the block holds (what the limit counts; counted once, every turn renders it)."""
        return count_words(" ".join(self.lines))  # lines are stripped: joining adds no word

    def header(self, limit: int) -> str:
        """`[human] Facts about the user (2 lines, 6/500 words)`."""
        what = DESCRIPTIONS.get(self.name, "Custom block")
        return f"[{self.name}] {what} ({plural(len(self.lines), 'line')}, {self.words}/{limit} words)"

    def numbered(self) -> list[str]:
        """`1: Name: Alice` lines."""
        return [f"{i}: {line}" for i, line in enumerate(self.lines, 1)]


def count_words(text: str) -> int:
    """Words as whitespace-separated pieces; a long piece counts one word per started MEMORY_WORD_CHARS characters,
    so text without spaces (Chinese, a pasted blob) cannot fill the prompt past what the limit means in tokens."""
    return sum(-(-len(piece) // MEMORY_WORD_CHARS) for piece in text.split())


def plural(n: int, word: str) -> str:
    """`1 line`, `2 lines`."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def normalise_name(raw: str) -> str:
    """Case, spaces and dashes → `_`; user/me → human, assistant/self/you → persona."""
    name = re.sub(r"[\s\-]+", "_", raw.strip().lower()).strip("_")
    return _ALIASES.get(name, name)


def blocks_from_rows(rows: Sequence[Mapping[str, Any]] | Sequence[asyncpg.Record]) -> list[Block]:
    """Blocks from stored rows (`name`, `lines`), with empty human and persona added where missing."""
    found = {r["name"]: Block(r["name"], tuple(r["lines"] or ())) for r in rows}
    fixed = [found.pop(n, Block(n, ())) for n in (HUMAN, PERSONA)]
    return fixed + list(found.values())


def near_limit(block: Block, limit: int) -> bool:
    """The block holds at least 80 % of the word limit."""
    return block.words >= MEMORY_WARN_SHARE * limit


def warning(block: Block, limit: int) -> str:
    """The ask to consolidate a block that is near its limit."""
    return (
        f"Warning: [{block.name}] is {block.words * 100 // limit}% full ({block.words}/{limit} words): "
        "consolidate its lines or move detail to archival memory."
    )


def render_prompt_section(rows: Sequence[Mapping[str, Any]] | Sequence[asyncpg.Record], limit: int) -> str:
    """The `<core_memory>` section of the system prompt from a user's block rows."""
    out = ["<core_memory>"]
    for block in blocks_from_rows(rows):
        out += [block.header(limit), *block.numbered()]
        if near_limit(block, limit):
            out.append(warning(block, limit))
    out.append("</core_memory>")
    return "\n".join(out)


Db = Pool | asyncpg.Connection | asyncpg.pool.PoolConnectionProxy  # a connection: inside a transaction


async def lock_memory(db: Db, user_id: int) -> None:
    """Hold the user's memory until the transaction ends: every change to it (read, check the limit, write; a
    wipe) takes this lock first, so a write cannot bring back what a concurrent wipe removed."""
    await db.execute("SELECT 1 FROM accounts WHERE id = $1 FOR NO KEY UPDATE", user_id)


async def load_blocks(db: Db, user_id: int, *, lock: bool = False) -> list[Block]:
    """All blocks of a user (human and persona always); `lock` holds the user's blocks until the transaction ends."""
    if lock:
        await lock_memory(db, user_id)
    rows = await db.fetch(
        "SELECT name, lines FROM memory_blocks WHERE user_id = $1"
        " ORDER BY name <> 'human', name <> 'persona', created_at, name",
        user_id,
    )
    return blocks_from_rows(rows)


def _names(blocks: Sequence[Block]) -> str:
    """`human, persona, projects` for error messages."""
    return ", ".join(b.name for b in blocks)


def pick(blocks: Sequence[Block], raw: str, *, may_create: bool = False) -> Block:
    """The block a (normalised) name means; a new custom block only when `may_create`."""
    name = normalise_name(raw)
    for b in blocks:
        if b.name == name:
            return b
    if not _NAME_RE.match(name):
        shown = truncate(raw, MEMORY_NAME_SHOW_CHARS, one_line=True)
        raise ToolError(
            f"invalid block name {shown!r}; blocks: {_names(blocks)} (a new block name uses letters, digits and _)",
            code="invalid_args",
        )
    if not may_create:
        raise ToolError(
            f"no block [{name}]; blocks: {_names(blocks)} (appending to a new name creates one)", code="invalid_args"
        )
    if len(blocks) >= MEMORY_MAX_BLOCKS:
        raise ToolError(
            f"at most {MEMORY_MAX_BLOCKS} blocks; blocks: {_names(blocks)}; use an existing one or archival memory",
            code="invalid_args",
        )
    return Block(name, ())


def line_index(block: Block, line_number: int) -> int:
    """The 0-based index of a 1-based line number, or an error saying the valid range."""
    if not block.lines:
        raise ToolError(f"[{block.name}] has no lines", code="invalid_args")
    if not 1 <= line_number <= len(block.lines):
        raise ToolError(
            f"line {line_number} does not exist in [{block.name}]; valid lines: 1-{len(block.lines)}",
            code="invalid_args",
        )
    return line_number - 1


def clean_line(content: str) -> str:
    """One line of content, stripped; empty or multi-line content is refused (nothing is cut)."""
    line = content.strip()
    if not line:
        raise ToolError("content is empty", code="invalid_args")
    if "\n" in line or "\r" in line:
        raise ToolError("content must be one line; store each fact as its own line", code="invalid_args")
    if len(line) > MEMORY_LINE_CHARS:  # words are what the limit counts; this bounds a line without spaces too
        raise ToolError(
            f"content is {len(line)} characters; a line holds at most {MEMORY_LINE_CHARS}"
            " (details go to archival memory)",
            code="invalid_args",
        )
    return line


def check_room(block: Block, new_lines: Sequence[str], limit: int, action: str) -> Block:
    """The block with `new_lines`, or a refusal saying how many words are left."""
    after = Block(block.name, tuple(new_lines))
    if after.words > limit:
        left = max(0, limit - block.words)
        raise ToolError(
            f"cannot {action} [{block.name}]: it would hold {after.words}/{limit} words; {left} words left. "
            "Consolidate lines (core_memory_replace/core_memory_delete) or move detail to archival memory.",
            code="invalid_args",
        )
    return after


def with_warning(text: str, block: Block, limit: int) -> str:
    """A tool result, followed by the consolidation warning while the block is ≥ 80 % full."""
    return f"{text}\n{warning(block, limit)}" if near_limit(block, limit) else text


async def store(db: Db, user_id: int, block: Block) -> None:
    """Write a block's lines; an emptied custom block is removed (human and persona stay, virtually)."""
    if not block.lines and block.name not in DESCRIPTIONS:
        await db.execute("DELETE FROM memory_blocks WHERE user_id = $1 AND name = $2", user_id, block.name)
        return
    await db.execute(
        "INSERT INTO memory_blocks (user_id, name, lines) VALUES ($1, $2, $3)"
        " ON CONFLICT (user_id, name) DO UPDATE SET lines = EXCLUDED.lines, updated_at = now()",
        user_id,
        block.name,
        list(block.lines),
    )
