"""Calls that wait for the person's OK (sql/034): a tool that changes things, of an untrusted server, is not called
when the model asks for it; the call is parked, the model is told so in one line, and the answer carries a button
("Allow mail: send_email", or "/mcp allow <id>" where there are no buttons). Only the identity that was asked may
allow it, once, before MCP_CONFIRM_TTL_S ends; its result is shown to them as quoted text and kept in the
conversation (as someone else's words) so the next turn knows."""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from core.constants import MCP_ALLOWED_RESULT_CHARS, MCP_CONFIRM_TTL_S, MCP_LINE_CHARS
from core.mcp_servers.config import ServerConfig
from core.mcp_servers.connection import RemoteTool
from core.quoting import truncate
from core.storage.db import Pool
from core.tools.framework import ToolContext
from core.types import Ask, Assistant

PARKED = "Waiting for the person's OK: they were asked with a button; do not call it again."
ASKED_BUTTON = "⏳ Waiting for your OK to run {what} with `{args}`: press its button below."
ASKED_COMMAND = "⏳ Waiting for your OK to run {what} with `{args}`: send /mcp allow {id} to run it."
ASKED_HTTP = "⏳ Waiting for your OK to run {what} with `{args}`: POST /v1/mcp/allow/{id} runs it."
NOT_YOURS = "This button is not for you: only the person who was asked can allow this call."
DONE = "That call was run already."
REFUSED = "That call can't be run any more."
EXPIRED = "That request has expired: ask me again."
UNKNOWN = "There is no call waiting with that number."
USAGE = "Use /mcp allow <number>, with the number the answer gave."
GONE = "{what} is not available any more: the call was not made."
UNREACHED = "{what} could not be reached ({error}); the call was not made: try again later."
RAN = "Ran {what} after your OK:"
FAILED = "{what} failed after your OK:"

_UNSHOWN = re.compile(r"[^A-Za-z0-9_.-]")  # a tool's name as the server chose it: only these characters are shown
_CONFIRMED: contextvars.ContextVar[bool] = contextvars.ContextVar("mcp_confirmed", default=False)

_PARK_SQL = """
INSERT INTO mcp_confirmations (account_id, identity_id, chat_id, server, tool, arguments, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id
"""
_CLAIM_SQL = """
UPDATE mcp_confirmations SET state = 'done'
WHERE id = $1 AND identity_id = $2 AND state = 'pending' AND expires_at > $3
RETURNING server, tool, arguments, chat_id
"""
_STORE_SQL = "INSERT INTO messages (chat_id, role, content, quoted_kind) VALUES ($1, 'assistant', $2, 'job')"


@dataclass(frozen=True)
class Parked:
    """A parked call its person allowed (claimed: it is `done` from now on)."""

    id: int
    server: str
    tool: str
    arguments: dict[str, Any]
    chat_id: int

    @property
    def what(self) -> str:
        """`mail: send_email`."""
        return shown(self.server, self.tool)


def shown(server: str, tool: str) -> str:
    """`mail: send_email`, the tool's name (the server's choice) with nothing in it that Markdown would render."""
    return f"{server}: {_UNSHOWN.sub('_', tool)}"


def asks_first(config: ServerConfig, remote: RemoteTool) -> bool:
    """Whether a call of this tool waits for the person's OK: an untrusted server's tool that may change things (any
    not marked read-only), unless the file says `confirm: false`."""
    return config.trust == "untrusted" and config.confirm and remote.read_only is not True


def confirmed() -> bool:
    """Whether the call being made now is one its person allowed."""
    return _CONFIRMED.get()


@contextmanager
def allowing() -> Iterator[None]:
    """Within the block, calls are made as allowed by their person (not parked again)."""
    token = _CONFIRMED.set(True)
    try:
        yield
    finally:
        _CONFIRMED.reset(token)


async def park(ctx: ToolContext, server: str, tool: str, arguments: dict[str, Any]) -> str:
    """Park a call for the speaker's OK (the turn's answer gets its button); the line for the model."""
    now = ctx.now()
    expires = now + timedelta(seconds=MCP_CONFIRM_TTL_S)
    user = ctx.user
    ask_id = await ctx.pool.fetchval(
        _PARK_SQL, user.account_id, user.id, ctx.chat.id, server, tool, arguments, now, expires
    )
    ctx.parked.append(int(ask_id))
    return PARKED


async def asking(pool: Pool, answer: Assistant, ids: Sequence[int], *, buttons: bool, http: bool = False) -> Assistant:
    """The answer with a line per parked call (what it runs, with which arguments, how to allow it) and, where the
    front end has `buttons`, a button each (`http`: the HTTP API, whose route allows it)."""
    rows = await pool.fetch(
        "SELECT id, server, tool, arguments FROM mcp_confirmations WHERE id = ANY($1::bigint[]) ORDER BY id", list(ids)
    )
    lines = []
    for r in rows:
        args = json.dumps(r["arguments"], ensure_ascii=False, separators=(",", ":")).replace("`", "'")
        args_shown = truncate(args, MCP_LINE_CHARS, one_line=True)
        line = ASKED_BUTTON if buttons else ASKED_HTTP if http else ASKED_COMMAND
        lines.append(line.format(what=shown(r["server"], r["tool"]), args=args_shown, id=r["id"]))
    asks = tuple(Ask(int(r["id"]), f"Allow {shown(r['server'], r['tool'])}") for r in rows) if buttons else ()
    text = "\n\n".join(part for part in (answer.text.strip(), "\n".join(lines)) if part)
    return replace(answer, text=text, asks=asks)


async def claim(pool: Pool, ask_id: int, identity_id: int, now: datetime) -> Parked | str:
    """The parked call, claimed for its person (it cannot be run twice), or the one line saying why not."""
    row = await pool.fetchrow(_CLAIM_SQL, ask_id, identity_id, now)
    if row is not None:
        return Parked(ask_id, row["server"], row["tool"], dict(row["arguments"]), int(row["chat_id"]))
    row = await pool.fetchrow("SELECT identity_id, state FROM mcp_confirmations WHERE id = $1", ask_id)
    if row is None:
        return UNKNOWN
    if row["identity_id"] != identity_id:
        return NOT_YOURS
    return {"done": DONE, "refused": REFUSED}.get(row["state"], EXPIRED)


async def settle(pool: Pool, parked: Parked, state: Literal["pending", "refused"]) -> None:
    """A claimed call that was not made: back to waiting (it never reached the server), or refused for good."""
    await pool.execute("UPDATE mcp_confirmations SET state = $2 WHERE id = $1", parked.id, state)


async def ran(pool: Pool, parked: Parked, result: str, *, ok: bool) -> str:
    """What the person sees of a call made after their OK (its result as quoted text, cut to a sane length), also kept
    in the conversation it was asked in as someone else's words (the next turn knows, without admin tools)."""
    head = (RAN if ok else FAILED).format(what=parked.what)
    body = truncate(result.strip() or "(no text)", MCP_ALLOWED_RESULT_CHARS)
    text = head + "\n" + "\n".join(f"> {line}" for line in body.splitlines() or [""])
    await pool.execute(_STORE_SQL, parked.chat_id, text)
    return text
