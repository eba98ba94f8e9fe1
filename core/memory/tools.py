"""The memory tools (with `file_pages`, also saving a file someone sent into archival memory); each acts only on the
speaking user's memory (ctx.user, never a parameter)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from core.constants import ARCHIVAL_CONTENT_CHARS, MEDIA_MEMORY_MAX_CHUNKS, MEMORY_QUERY_CHARS
from core.memory.blocks import Block, check_room, clean_line, line_index, load_blocks, pick, plural, store, with_warning
from core.memory.embeddings import Embedder
from core.memory.search import DEFAULT_ARCHIVAL_MAX, Inserted, insert_archival, search_archival, search_conversation
from core.storage.db import is_dropped, retry_dropped
from core.tools.framework import Handler, Tool, ToolContext, ToolError

log = logging.getLogger(__name__)

# (pool, account id, attachment id) → the file's name and pages of text, or None when the account has no such file
FilePages = Callable[[Any, int, int], Awaitable[tuple[str, list[str]] | None]]
SAVE_FILE = "archival_memory_insert_file"

_S, _N = {"type": "string"}, {"type": "integer"}  # bounds are checked in the handlers (smaller prompt)


def _schema(**props: dict[str, Any]) -> dict[str, Any]:
    """A terse object schema: every listed property is required except `page`."""
    required = [k for k in props if k != "page"]
    return {"type": "object", "properties": props, "required": required} if required else {"type": "object"}


def _tool(
    name: str, description: str, params: dict[str, Any], handler: Handler, *, again: bool = True, own: bool = False
) -> Tool:
    """A tool whose unknown arguments (a forged user_id, say) are refused; checked here to keep schemas small.

    A call whose database connection drops runs again on a fresh one when running it twice does no harm
    (`again`: reads, and writes that are idempotent; `own`: the handler retries by itself, knowing what its
    first attempt did); otherwise the model is told, in one line, to check.
    """
    known = set(params.get("properties", {}))

    async def strict(p: dict[str, Any], ctx: ToolContext) -> Any:
        extra = sorted(set(p) - known)
        if extra:
            raise ToolError(f"unknown arguments: {', '.join(extra)}", code="invalid_args")
        args = {k: _plain(k, v) for k, v in p.items()}
        try:
            if again and not own:
                return await retry_dropped(lambda: handler(args, ctx), name, pool=ctx.pool)
            return await handler(args, ctx)
        except Exception as e:
            if not is_dropped(e):
                raise
            log.warning("%s lost its database connection (%s)", name, type(e).__name__)
            check = "try again shortly" if again else "read the block to see whether it was done"
            raise ToolError(f"the database connection was lost during {name}; {check}", code="tool_error") from None

    return Tool(name, description, params, strict, personal=True)


def _plain(key: str, value: Any) -> Any:
    """An argument PostgreSQL can take: text without NUL or unpaired surrogates, whole numbers as int."""
    if isinstance(value, float):  # JSON Schema's "integer" also admits 3.0
        return int(value)
    if isinstance(value, str) and ("\x00" in value or _unpaired_surrogate(value)):
        raise ToolError(
            f"{key} contains a NUL character or an unpaired surrogate; send plain text", code="invalid_args"
        )
    return value


def _unpaired_surrogate(text: str) -> bool:
    """Whether `text` cannot be encoded as UTF-8 (a lone surrogate from a JSON `\\ud800` escape)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _text(args: dict[str, Any], key: str, limit: int) -> str:
    """A string argument within `limit` characters."""
    value: str = args[key]
    if len(value) > limit:
        raise ToolError(f"{key} is {len(value)} characters; at most {limit}", code="invalid_args")
    return value


def _page(args: dict[str, Any]) -> int:
    """The 1-based page argument (default 1)."""
    page: int = args.get("page", 1)
    if page < 1:
        raise ToolError(f"page {page} does not exist; pages start at 1", code="invalid_args")
    return page


def _quote(line: str) -> str:
    """A line as quoted in results."""
    return f'"{line}"'


@dataclass
class _Attempt:
    """What a write's attempt planned to commit and answer: when a dropped connection hid whether the commit
    landed, the next attempt finds the block as planned and gives that answer (not "already there")."""

    lines: tuple[str, ...] | None = None
    answer: str = ""

    def landed(self, block: Block) -> bool:
        """The block holds what the earlier attempt wrote."""
        return self.lines is not None and block.lines == self.lines

    def plan(self, block: Block, answer: str) -> str:
        """Remember the block about to be committed and its answer; the answer."""
        self.lines, self.answer = block.lines, answer
        return answer


def file_chunks(name: str, pages: list[str], size: int = ARCHIVAL_CONTENT_CHARS) -> list[str]:
    """A file's pages as archival entries of at most `size` characters, each naming the file and page, cut at spaces."""
    out: list[str] = []
    for number, page in enumerate(pages, 1):
        head = f"[from the file {name[:100]}, page {number}] "
        text, room = " ".join(page.split()), size - len(head)
        while text:
            cut = len(text) if len(text) <= room else (text.rfind(" ", room // 2, room) + 1 or room)
            out.append(head + text[:cut].strip())
            text = text[cut:].lstrip()
    return out


def memory_tools(
    block_words: int,
    embedder: Embedder | None = None,
    *,
    archival_max_entries: int = DEFAULT_ARCHIVAL_MAX,
    file_pages: FilePages | None = None,
) -> tuple[Tool, ...]:
    """The memory tools for a word limit per block (MEMORY_BLOCK_WORDS), optional embeddings and a cap on each
    person's archival entries (ARCHIVAL_MAX_ENTRIES); with `file_pages`, also the tool that saves a file's text."""
    limit = block_words

    def _for(ctx: ToolContext) -> Embedder | None:
        """The embedder, its calls' token usage counted for the speaking person's account."""
        return embedder.for_user(ctx.user) if embedder is not None else None

    async def read(p: dict[str, Any], ctx: ToolContext) -> str:
        block = pick(await load_blocks(ctx.pool, ctx.user.account_id), p["block"])
        head = f"[{block.name}] Core Memory ({plural(len(block.lines), 'line')}, {block.words}/{limit} words):"
        return with_warning("\n".join([head, *block.numbered()]), block, limit)

    async def append(p: dict[str, Any], ctx: ToolContext) -> str:
        line, attempt = clean_line(p["content"]), _Attempt()

        async def once() -> str:
            async with ctx.pool.acquire() as conn, conn.transaction():
                block = pick(await load_blocks(conn, ctx.user.account_id, lock=True), p["block"], may_create=True)
                if attempt.landed(block):
                    return attempt.answer
                if line in block.lines:
                    at = block.lines.index(line) + 1
                    return f"Line already exists in [{block.name}] at line {at}: {_quote(line)} (no change)"
                after = check_room(block, [*block.lines, line], limit, "append to")
                await store(conn, ctx.user.account_id, after)
                done = f"Appended to [{block.name}] at line {len(after.lines)}: {_quote(line)}"
                return attempt.plan(after, with_warning(f"{done} ({after.words}/{limit} words)", after, limit))

        return await retry_dropped(once, "core_memory_append", pool=ctx.pool)

    async def replace(p: dict[str, Any], ctx: ToolContext) -> str:
        line, number, attempt = clean_line(p["new_content"]), p["line_number"], _Attempt()

        async def once() -> str:
            async with ctx.pool.acquire() as conn, conn.transaction():
                block = pick(await load_blocks(conn, ctx.user.account_id, lock=True), p["block"])
                if attempt.landed(block):
                    return attempt.answer
                i = line_index(block, number)
                old = block.lines[i]
                if old == line:
                    return f"Line {number} of [{block.name}] already reads {_quote(line)} (no change)"
                if line in block.lines:  # the new text is another line already: one line, not two equal ones
                    at = block.lines.index(line) + 1
                    after = Block(block.name, block.lines[:i] + block.lines[i + 1 :])
                    await store(conn, ctx.user.account_id, after)
                    done = (
                        f"{_quote(line)} is already line {at} of [{block.name}], so line {number} ({_quote(old)}) "
                        "was removed instead of repeating it; lines below it moved up"
                    )
                    return attempt.plan(after, with_warning(f"{done} ({after.words}/{limit} words)", after, limit))
                after = check_room(block, [*block.lines[:i], line, *block.lines[i + 1 :]], limit, "replace in")
                await store(conn, ctx.user.account_id, after)
                done = f"Replaced line {number} in [{block.name}]: {_quote(old)} → {_quote(line)}"
                return attempt.plan(after, with_warning(f"{done} ({after.words}/{limit} words)", after, limit))

        return await retry_dropped(once, "core_memory_replace", pool=ctx.pool)

    async def delete(p: dict[str, Any], ctx: ToolContext) -> str:
        async with ctx.pool.acquire() as conn, conn.transaction():
            block = pick(await load_blocks(conn, ctx.user.account_id, lock=True), p["block"])
            i = line_index(block, p["line_number"])
            await store(conn, ctx.user.account_id, Block(block.name, block.lines[:i] + block.lines[i + 1 :]))
        return f"Deleted line {p['line_number']} from [{block.name}]; lines below moved up"

    async def list_blocks(p: dict[str, Any], ctx: ToolContext) -> str:
        return "\n".join(blk.header(limit) for blk in await load_blocks(ctx.pool, ctx.user.account_id))

    async def insert(p: dict[str, Any], ctx: ToolContext) -> str:
        content, call, now = _text(p, "content", ARCHIVAL_CONTENT_CHARS), uuid.uuid4(), ctx.now()

        async def once() -> Inserted:
            return await insert_archival(
                ctx.pool, ctx.user.account_id, content, now, _for(ctx), max_entries=archival_max_entries, call=call
            )

        entry = await retry_dropped(once, "archival_memory_insert", pool=ctx.pool)
        if entry.fresh:
            return f"Stored in archival memory (#{entry.number})"
        return f"Already in archival memory (#{entry.number}, no change)"

    async def insert_file(p: dict[str, Any], ctx: ToolContext) -> str:
        assert file_pages is not None
        found = await file_pages(ctx.pool, ctx.user.account_id, int(p["id"]))
        if found is None:
            raise ToolError(f"there is no file #{p['id']} of this user with text", code="not_found")
        name, pages = found
        ctx.taint()  # a file's text: someone else's words, maybe
        chunks, stored, had = file_chunks(name, pages), 0, 0
        for chunk in chunks[:MEDIA_MEMORY_MAX_CHUNKS]:
            try:
                entry = await insert_archival(
                    ctx.pool, ctx.user.account_id, chunk, ctx.now(), _for(ctx), max_entries=archival_max_entries
                )
            except ToolError as full:  # archival memory is full: say how far it got
                return f"Saved {stored} of {len(chunks)} parts of {name}; then: {full}"
            stored, had = stored + entry.fresh, had + (not entry.fresh)
        said = f"Saved {name} to archival memory in {stored} new part(s)"
        said += f" ({had} were there already)" if had else ""
        if len(chunks) > MEDIA_MEMORY_MAX_CHUNKS:
            said += f"; only its first {MEDIA_MEMORY_MAX_CHUNKS} of {len(chunks)} parts are saved (the most at once)"
        return said

    async def archival_search(p: dict[str, Any], ctx: ToolContext) -> str:
        query, page = _text(p, "query", MEMORY_QUERY_CHARS), _page(p)
        return await search_archival(ctx.pool, ctx.user.account_id, query, page, ctx.tz, _for(ctx))

    async def conversation(p: dict[str, Any], ctx: ToolContext) -> str:
        query, page = _text(p, "query", MEMORY_QUERY_CHARS), _page(p)
        return await search_conversation(ctx.pool, ctx.user.account_id, query, page, ctx.tz)

    block, line = {"block": _S}, {"line_number": _N}
    search = _schema(query=_S, page=_N)
    save_file = _tool(
        SAVE_FILE,
        "Save the whole text of a file the user sent (attachment #id) to archival memory, when they ask for it.",
        _schema(id=_N),
        insert_file,
    )
    return (
        *(() if file_pages is None else (save_file,)),
        _tool("core_memory_read", "Read a block.", _schema(**block), read),
        _tool(
            "core_memory_append",
            "Add a line to a memory block: human (facts on the user), persona (how to act) or a new name.",
            _schema(**block, content=_S),
            append,
            own=True,
        ),
        _tool("core_memory_replace", "Replace a line.", _schema(**block, **line, new_content=_S), replace, own=True),
        _tool("core_memory_delete", "Delete a line.", _schema(**block, **line), delete, again=False),  # twice: 2 lines
        _tool("core_memory_list_blocks", "List blocks.", _schema(), list_blocks),
        _tool("archival_memory_insert", "Save a detail to archival memory.", _schema(content=_S), insert, own=True),
        _tool("archival_memory_search", "Search archival memory.", search, archival_search),
        _tool("conversation_search", "Search past conversations.", search, conversation),
    )
