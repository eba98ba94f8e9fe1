"""Markdown as Slack mrkdwn (placeholder: the renderer's branch brings the real file): escaped, split by length with
code fences closed and reopened across parts."""

from __future__ import annotations

from adapters.slack.limits import SLACK_TEXT_LIMIT

FENCE = "```"


def render(markdown: str) -> str:
    """The text with Slack's control characters escaped (&, <, >)."""
    return plain(markdown)


def plain(text: str) -> str:
    """User text escaped: shown as written, pings nobody."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def split(mrkdwn: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """Parts of at most `limit` characters, cut between lines; a code block cut is closed and reopened."""
    parts: list[str] = []
    current: list[str] = []
    size, in_code = 0, False
    for line in _lines(mrkdwn, limit - 2 * len(FENCE) - 2):
        extra = len(FENCE) + 1 if in_code else 0
        if current and size + len(line) + 1 + extra > limit:
            parts.append("\n".join([*current, FENCE] if in_code else current))
            current, size = ([FENCE] if in_code else []), (len(FENCE) + 1 if in_code else 0)
        current.append(line)
        size += len(line) + 1
        if line.startswith(FENCE):
            in_code = not in_code
    if current:
        parts.append("\n".join(current))
    return [p for p in parts if p.strip()] or [""]


def _lines(text: str, most: int) -> list[str]:
    """The text's lines, each cut to at most `most` characters."""
    out: list[str] = []
    for line in text.split("\n"):
        while len(line) > most:
            out.append(line[:most])
            line = line[most:]
        out.append(line)
    return out


def render_parts(markdown: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """Markdown rendered and split into parts."""
    return split(render(markdown), limit)


def steps_line(summary: str) -> str:
    """The activity's summary line shown under an answer."""
    return plain(summary)
