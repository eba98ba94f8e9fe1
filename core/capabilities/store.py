"""Capabilities in PostgreSQL: every version's code, description and schema, and which one is current."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from core.storage.db import Pool

_COLUMNS = "v.name, v.version, v.description, v.code, v.parameters_schema, c.enabled"


@dataclass(frozen=True)
class Version:
    """One stored version of a capability (and whether the capability is enabled)."""

    name: str
    version: int
    description: str
    code: str
    parameters_schema: dict[str, Any]
    enabled: bool = True


def _version(row: Any) -> Version:
    """A Version from a row with the _COLUMNS."""
    return Version(
        row["name"], row["version"], row["description"], row["code"], row["parameters_schema"], row["enabled"]
    )


async def enabled_current(pool: Pool) -> list[Version]:
    """The current version of every enabled capability, by name."""
    rows = await pool.fetch(
        f"SELECT {_COLUMNS} FROM capabilities c JOIN capability_versions v ON v.name = c.name AND v.version = c.version"
        " WHERE c.enabled ORDER BY c.name"
    )
    return [_version(r) for r in rows]


async def get_version(pool: Pool, name: str, version: int | None = None) -> Version | None:
    """One version of a capability (the current one when `version` is None)."""
    row = await pool.fetchrow(
        f"SELECT {_COLUMNS} FROM capabilities c JOIN capability_versions v ON v.name = c.name"
        " WHERE c.name = $1 AND v.version = coalesce($2, c.version)",
        name,
        version,
    )
    return None if row is None else _version(row)


async def save_version(pool: Pool, name: str, description: str, code: str, schema: dict[str, Any], by: str) -> int:
    """Store a new version, make it current and enable the capability; returns the version number."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(  # creates the capability or locks its row against concurrent writers
            "INSERT INTO capabilities (name, version, updated_by) VALUES ($1, 0, $2)"
            " ON CONFLICT (name) DO UPDATE SET updated_at = now()",
            name,
            by,
        )
        version: int = await conn.fetchval(
            "INSERT INTO capability_versions (name, version, description, code, parameters_schema, created_by)"
            " SELECT $1, coalesce(max(version), 0) + 1, $2, $3, $4, $5 FROM capability_versions WHERE name = $1"
            " RETURNING version",
            name,
            description,
            code,
            schema,
            by,
        )
        await conn.execute(
            "UPDATE capabilities SET version = $2, enabled = true, updated_at = now(), updated_by = $3 WHERE name = $1",
            name,
            version,
            by,
        )
    return version


async def set_current(pool: Pool, name: str, version: int, by: str) -> None:
    """Make an existing version the current one (a rollback)."""
    await _set(pool, name, "version", version, by)


async def set_enabled(pool: Pool, name: str, enabled: bool, by: str) -> None:
    """Enable or disable a capability."""
    await _set(pool, name, "enabled", enabled, by)


async def _set(pool: Pool, name: str, column: Literal["version", "enabled"], value: int | bool, by: str) -> None:
    """Change one column of a capability's row, recording who did it and when (`column` is code's, never input)."""
    sql = f"UPDATE capabilities SET {column} = $2, updated_at = now(), updated_by = $3 WHERE name = $1"
    await pool.execute(sql, name, value, by)


async def listing(pool: Pool) -> list[dict[str, Any]]:
    """Every capability with its current version, state, description and all version numbers."""
    rows = await pool.fetch(
        "SELECT c.name, c.version, c.enabled, c.updated_at, c.updated_by, cur.description,"
        " (SELECT array_agg(v.version ORDER BY v.version) FROM capability_versions v WHERE v.name = c.name)"
        " AS versions"
        " FROM capabilities c JOIN capability_versions cur ON cur.name = c.name AND cur.version = c.version"
        " ORDER BY c.name"
    )
    return [
        {
            "name": r["name"],
            "version": r["version"],
            "enabled": r["enabled"],
            "description": r["description"],
            "versions": list(r["versions"]),
            "updated_at": r["updated_at"].isoformat(),
            "updated_by": r["updated_by"],
        }
        for r in rows
    ]
