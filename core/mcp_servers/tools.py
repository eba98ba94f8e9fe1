"""An MCP server's tools as the agent's tools: named `mcp__<server>__<tool>`, offered by the server's access rules,
their results someone else's text (an untrusted server's result takes the turn's admin tools away), and mcp_search
for when all of them would not fit the prompt."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from core.constants import MCP_DESCRIPTION_CHARS, MCP_NAME_CHARS, MCP_SEARCH_RESULTS
from core.mcp_servers.config import ServerConfig
from core.mcp_servers.confirm import asks_first, confirmed, park
from core.mcp_servers.connection import CallFailed, Connection, RemoteTool
from core.mcp_servers.results import Outcome
from core.tools.framework import Tool, ToolContext, ToolError
from core.types import ChatRef, UserRef

log = logging.getLogger(__name__)

PREFIX = "mcp__"
SEARCH = "mcp_search"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_WORD = re.compile(r"[a-z0-9]+")
# The connection a call goes to, by the speaker (a per_person server: their own; ToolError when they have none)
PickConnection = Callable[[ToolContext], Awaitable[Connection]]
# Keeps a result's images (data, mime) as photos of the speaker in their chat: a line each (core/media/photos.py keep)
KeepImages = Callable[[Sequence[tuple[bytes, str]], UserRef, ChatRef, datetime], Awaitable[list[str]]]


def tool_name(server: str, tool: str) -> str:
    """`mcp__<server>__<tool>` with anything but letters, digits, `_` and `-` as `_`; a longer name is cut to
    MCP_NAME_CHARS with a short hash of the whole, so two long names never meet."""
    name = f"{PREFIX}{_UNSAFE.sub('_', server)}__{_UNSAFE.sub('_', tool)}"
    if len(name) <= MCP_NAME_CHARS:
        return name
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{name[: MCP_NAME_CHARS - 9]}_{digest}"


def schema_hash(tool: RemoteTool) -> str:
    """What pins a tool: its name, description and input schema (any change holds it back until an admin accepts)."""
    canonical = json.dumps([tool.name, tool.description, tool.input_schema], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def identity(ctx: ToolContext) -> str:
    """The speaker as ADMINS and `access` lists name people: `telegram:123`."""
    return f"{ctx.user.platform}:{ctx.user.platform_user_id}"


def may_use(config: ServerConfig, ctx: ToolContext) -> bool:
    """Whether the speaker may use the server's tools in this turn: the operator's credentials (and `access: admin`)
    only for an admin in a turn of admins' own words; a list only for the identities on it."""
    if (config.credentials == "operator" or config.access == "admin") and not ctx.is_admin:
        return False
    if config.credentials == "per_person" and not ctx.personal:
        return False  # someone's own account is never used in a group
    if isinstance(config.access, frozenset):
        return identity(ctx) in config.access
    return True


def agent_tool(
    config: ServerConfig, remote: RemoteTool, connection: Connection | PickConnection, *, keep: KeepImages | None = None
) -> Tool | None:
    """The agent's tool for one of the server's tools (None when its input schema is not a valid JSON Schema);
    `connection`: the server's, or what picks the speaker's own (per_person); `keep`: what stores the images a result
    brings (their marks go into its text)."""
    name = tool_name(config.name, remote.name)
    schema = dict(remote.input_schema) or {"type": "object"}
    schema.setdefault("type", "object")
    from jsonschema import Draft202012Validator  # loaded by the first schema checked
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        log.warning(
            "MCP server %s: tool %s left out: its input schema is invalid (%s)", config.name, remote.name, e.message
        )
        return None

    async def call(args: dict[str, Any], ctx: ToolContext) -> str:
        if not may_use(config, ctx):
            raise ToolError(f"{name} is not available to this person here", code="forbidden")
        if asks_first(config, remote) and not confirmed():  # the person's OK first (core/mcp_servers/confirm.py)
            return await park(ctx, config.name, remote.name, args)
        try:
            conn = connection if isinstance(connection, Connection) else await connection(ctx)
            outcome = await conn.call(remote.name, args)
        except CallFailed as e:
            raise ToolError(str(e), code="unknown_outcome" if e.reached else "unavailable") from None
        if config.trust == "untrusted":
            ctx.taint()  # the server's words from now on: no admin tools for the rest of the turn
        if not outcome.ok:
            raise ToolError(outcome.text or f"{remote.name} failed", code="tool_error")
        return await with_images(outcome, ctx, keep)

    description = " ".join(remote.description.split())[:MCP_DESCRIPTION_CHARS] or remote.name
    return Tool(
        name,
        f"[{config.name}] {description}",
        schema,
        call,
        admin_only=config.credentials == "operator" or config.access == "admin",
        personal=config.credentials == "per_person",
        timeout=config.timeout,
    )


async def with_images(outcome: Outcome, ctx: ToolContext, keep: KeepImages | None) -> str:
    """A result's text (without photo marks of its own: those would name the chat's photos) and a line per image it
    brought: its mark once kept as a photo of the speaker's (a vision model then sees it), or why it was not kept."""
    text = outcome.text.replace("[photo #", "[photo ")
    if not outcome.images:
        return text
    if keep is None:
        return "\n".join([text, *(f"image {i}: not kept" for i in range(1, len(outcome.images) + 1))])
    return "\n".join([text, *await keep(outcome.images, ctx.user, ctx.chat, ctx.now())])


def schema_tokens(tools: Sequence[Tool]) -> int:
    """About how many prompt tokens these tools' schemas cost (4 characters a token)."""
    return sum(len(json.dumps(t.schema, separators=(",", ":"))) for t in tools) // 4


def search_tool(usable: Callable[[ToolContext], list[Tool]]) -> Tool:
    """mcp_search: the model finds the MCP tools it needs by words; the ones found are offered for the rest of the
    turn."""

    async def search(args: dict[str, Any], ctx: ToolContext) -> str:
        words = set(_WORD.findall(str(args.get("query", "")).lower()))
        scored = []
        for tool in usable(ctx):
            text = f"{tool.name} {tool.description}".lower()
            score = sum(2 if w in tool.name.lower() else 1 for w in words if w in text)
            if score:
                scored.append((-score, tool.name, tool))
        found = [t for _, _, t in sorted(scored)[:MCP_SEARCH_RESULTS]]
        if not found:
            return "No tool matches; try other words."
        ctx.found.extend(t.name for t in found if t.name not in ctx.found)
        lines = [f"{t.name}: {t.description.splitlines()[0]}" for t in found]
        return "These tools can be called now:\n" + "\n".join(lines)

    params = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    return Tool(
        SEARCH,
        "Find tools of connected services by what they do; found ones become callable.",
        params,
        search,
    )
