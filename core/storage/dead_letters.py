"""Dead letters: platform updates that could not be stored or parsed, kept with the reason instead of being retried
for ever (sql/035)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.constants import DEAD_LETTER_PAYLOAD_CHARS, DEAD_LETTER_REASON_CHARS
from core.storage.db import Pool

_ADD_SQL = """
INSERT INTO dead_letters (platform, update_id, reason, payload) VALUES ($1, $2, $3, $4)
ON CONFLICT (platform, update_id) WHERE update_id IS NOT NULL DO NOTHING
"""


@dataclass(frozen=True)
class Summary:
    """How many dead letters are kept, and the newest one's time and reason."""

    count: int
    newest_at: datetime | None
    newest_reason: str | None


def raw_copy(payload: Any) -> str:
    """A capped, escaped text copy of a payload (ASCII JSON: NUL and lone surrogates stay escapes, text holds them)."""
    try:
        text = json.dumps(payload, ensure_ascii=True, default=repr)
    except (TypeError, ValueError):
        text = ascii(payload)
    return text if len(text) <= DEAD_LETTER_PAYLOAD_CHARS else text[:DEAD_LETTER_PAYLOAD_CHARS] + "…"


async def add(pool: Pool, platform: str, update_id: int | None, reason: str, payload: Any) -> bool:
    """Keep one dead letter; False when that update was quarantined before."""
    why = ascii(reason)[1:-1][:DEAD_LETTER_REASON_CHARS]  # the reason may quote the payload: escaped, like the copy
    status = await pool.execute(_ADD_SQL, platform, update_id, why, raw_copy(payload))
    return status.endswith(" 1")


async def summary(pool: Pool) -> Summary:
    """The count of dead letters kept and the newest one."""
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM dead_letters) AS n, created_at, reason FROM dead_letters"
        " ORDER BY created_at DESC, id DESC LIMIT 1"
    )
    if row is None:
        return Summary(0, None, None)
    return Summary(int(row["n"]), row["created_at"], row["reason"])
