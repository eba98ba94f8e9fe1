"""Discord rendering: Markdown kept, 2000-character parts that never break a code fence, the steps line."""

from __future__ import annotations

import re
from collections.abc import Sequence

from discord.utils import escape_markdown, escape_mentions

from adapters.discord.limits import DISCORD_LONG_LINE, DISCORD_MESSAGE_LIMIT
from core import Step, activity_lines, summary_line

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")


def _pieces(text: str) -> list[str]:
    """The text's lines, with lines too long for one message cut (at a space when there is one)."""
    out: list[str] = []
    for line in text.split("\n"):
        while len(line) > DISCORD_LONG_LINE:
            cut = line.rfind(" ", DISCORD_LONG_LINE // 2, DISCORD_LONG_LINE)
            cut = cut + 1 if cut > 0 else DISCORD_LONG_LINE
            out.append(line[:cut])
            line = line[cut:]
        out.append(line)
    return out


def split_markdown(text: str, limit: int = DISCORD_MESSAGE_LIMIT) -> list[str]:
    """Split Markdown into parts of at most `limit` characters; a code fence cut by a split is closed at the
    end of its part and reopened (with its language) at the start of the next."""
    parts: list[str] = []
    lines: list[str] = []
    size = 0
    opener: str | None = None  # the line that opened the fence we are inside, e.g. "```python"
    marker = ""

    def flush() -> None:
        nonlocal lines, size
        body = "\n".join(lines) + (f"\n{marker}" if opener is not None else "")
        if body.strip() and lines != [opener]:
            parts.append(body)
        lines = [opener] if opener is not None else []
        size = len(opener) if opener is not None else 0

    for line in _pieces(text):
        match = _FENCE.match(line)
        after_open, after_marker = opener, marker
        if match and opener is None:
            after_open, after_marker = line.strip(), match.group(1)
        elif match and line.strip().startswith(marker) and not match.group(2).strip():
            after_open, after_marker = None, ""
        reserve = len(after_marker) + 1 if after_open is not None else 0
        if lines and size + 1 + len(line) + reserve > limit:
            flush()
        size += (1 if lines else 0) + len(line)
        lines.append(line)
        opener, marker = after_open, after_marker
    if lines:
        flush()
    return parts or ["(no answer)"]


def summary(steps: Sequence[Step], elapsed_s: float) -> str:
    """The small last line of a reply: `-# 🔧 2 steps · 1.3 s`."""
    return "-# " + summary_line(steps, elapsed_s)


def render_reply(text: str, steps: Sequence[Step], elapsed_s: float, limit: int = DISCORD_MESSAGE_LIMIT) -> list[str]:
    """The answer as message parts; with steps, the last part ends with the summary line."""
    parts = split_markdown(text.strip() or "(no answer)", limit)
    if not steps:
        return parts
    line = summary(steps, elapsed_s)
    last = split_markdown(parts[-1], limit - len(line) - 1)
    return [*parts[:-1], *last[:-1], f"{last[-1]}\n{line}"]


def steps_text(steps: Sequence[Step], limit: int) -> str:
    """One quoted line per tool call (escaped), dropping lines from the end to stay within `limit`."""
    lines = [f"> {escape_mentions(escape_markdown(line))}" for line in activity_lines(steps)]
    if not lines:
        return "> (no tool calls)"
    while lines and len("\n".join(lines)) > limit:
        lines.pop()
        dropped = len(steps) - len(lines)
        tail = f"> … and {dropped} more"
        if len("\n".join([*lines, tail])) <= limit:
            return "\n".join([*lines, tail])
    return "\n".join(lines)


def with_steps(content: str, steps: Sequence[Step], limit: int = DISCORD_MESSAGE_LIMIT) -> str:
    """A reply's last part with the steps shown under its summary line (the DM toggle's "shown" state)."""
    base = without_steps(content)
    return f"{base}\n{steps_text(steps, limit - len(base) - 1)}"


def without_steps(content: str) -> str:
    """A reply's last part cut back to its summary line (the DM toggle's "hidden" state)."""
    lines = content.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("-# 🔧"):
            return "\n".join(lines[: i + 1])
    return content
