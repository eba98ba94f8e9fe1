"""The activity under an answer's last part: its summary line (`🔧 2 steps · 1.3 s`) and one line per tool call, in
the body for every client and as a collapsed <details> in the HTML (Element shows the summary; a tap opens it)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from adapters.matrix.limits import MATRIX_ACTIVITY_CHARS
from adapters.matrix.send import HTML, formatted
from core import Step, activity_lines, summary_line


def capped(lines: Sequence[str], most: int = MATRIX_ACTIVITY_CHARS) -> list[str]:
    """The first lines whose total stays within `most` characters (each line kept whole, cut only when alone)."""
    out: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 1 > most:
            if not out:
                out.append(line[: most - 1] + "…")
            break
        out.append(line)
        used += len(line) + 1
    return out


def with_activity(body: dict[str, Any], steps: Sequence[Step], elapsed_s: float) -> dict[str, Any]:
    """The content with the turn's activity after its text (unchanged without steps)."""
    if not steps:
        return body
    summary, lines = summary_line(steps, elapsed_s), capped(activity_lines(steps))
    shown = "<br>".join(html.escape(line) for line in lines)
    details = f"<details><summary>{html.escape(summary)}</summary>{shown}</details>"
    return {
        **body,
        "body": "\n".join([f"{body.get('body', '')}\n", summary, *lines]),
        "format": HTML,
        "formatted_body": formatted(body) + details,
    }
