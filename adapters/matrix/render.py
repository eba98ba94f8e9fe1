"""An answer as Matrix message parts (in progress: plain text now; Markdown → Matrix HTML in formatted_body next)."""

from __future__ import annotations

from mautrix.types import Obj

from adapters.matrix.limits import MATRIX_TEXT_LIMIT
from core import EMPTY_ANSWER


def parts(text: str, limit: int = MATRIX_TEXT_LIMIT) -> list[str]:
    """The text split into parts within `limit` characters, at a line break where there is one."""
    text = text.strip() or EMPTY_ANSWER
    out: list[str] = []
    while len(text) > limit:
        cut = text.rfind("\n", 0, limit + 1)
        cut = cut if cut > 0 else limit
        out.append(text[:cut].rstrip("\n"))
        text = text[cut:].lstrip("\n")
    out.append(text)
    return out


def content(body: str) -> Obj:
    """An m.text event's content. An empty m.mentions says it pings nobody: clients that know intentional mentions
    then ignore the text's `@room` and names (older clients' keyword rules are the next session's HTML work)."""
    return Obj(**{"msgtype": "m.text", "body": body, "m.mentions": {}})  # type: ignore[no-untyped-call]
