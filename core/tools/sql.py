"""`execute_sql`: an admin-only tool to query the bot's database directly."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from core.constants import SQL_MAX_CHARS, SQL_MAX_ROWS, SQL_STATEMENT_TIMEOUT_MS
from core.storage.db import untrusted_sql_connection
from core.tools.framework import Tool, ToolContext, ToolError


class ExecuteSqlParams(BaseModel):
    """Parameters of execute_sql."""

    query: str = Field(description="one SQL statement (PostgreSQL)", max_length=20000)


async def execute_sql(p: ExecuteSqlParams, ctx: ToolContext) -> dict[str, Any]:
    """Run one statement under a timeout; rows as JSON (capped) for queries, a row count otherwise."""
    import asyncpg

    timeout_ms = max(100, min(SQL_STATEMENT_TIMEOUT_MS, int(ctx.step_timeout * 1000) - 200))
    async with ctx.pool.acquire() as conn, conn.transaction():
        untrusted_sql_connection(conn, discard=True)
        await conn.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
        try:
            stmt = await conn.prepare(p.query)
            if stmt.get_attributes():
                rows = await stmt.fetch()
                out = [dict(r) for r in rows[:SQL_MAX_ROWS]]
                text = json.dumps(out, ensure_ascii=False, default=str)
                truncated = len(rows) > SQL_MAX_ROWS or len(text) > SQL_MAX_CHARS
                return {
                    "rows": json.loads(text[:SQL_MAX_CHARS]) if len(text) <= SQL_MAX_CHARS else text[:SQL_MAX_CHARS],
                    "row_count": len(rows),
                    "truncated": truncated,
                    "summary": f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
                    + (" (truncated)" if truncated else ""),
                }
            status = await conn.execute(p.query)
        except asyncpg.exceptions.QueryCanceledError:
            raise ToolError(f"statement cancelled after {timeout_ms} ms (statement timeout)") from None
        except asyncpg.PostgresError as e:
            raise ToolError(f"{type(e).__name__}: {e}") from None
    count = status.rsplit(" ", 1)[-1]
    return {"status": status, "row_count": int(count) if count.isdigit() else None, "summary": status}


EXECUTE_SQL = Tool(
    name="execute_sql",
    description="Admin only: run one SQL statement on the bot's PostgreSQL database.",
    params=ExecuteSqlParams,
    handler=execute_sql,
    admin_only=True,
)
