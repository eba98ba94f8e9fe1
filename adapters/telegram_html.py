"""Markdown from the model → Telegram's HTML subset, and splitting HTML at Telegram's length limit."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

from core.activity import activity_lines, summary_line
from core.types import Step

MESSAGE_LIMIT = 4096  # Telegram's limit, in UTF-16 code units of the text after tags
ACTIVITY_CHARS = 1500  # the activity block is capped so the answer keeps most of the last part

_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_QUOTE = re.compile(r"^\s{0,3}>\s?(.*)$")
_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")
_LINK = re.compile(r"\[([^\[\]\n]+)\]\(((?:https?|tg|mailto):[^\s()]+)\)")
_TAG = re.compile(r"<(/?)([a-z-]+)([^>]*)>")
_ENTITY = re.compile(r"&(?:#\d+|#x[0-9a-fA-F]+|[a-z]+);")


def esc(text: str) -> str:
    """Escape text for Telegram HTML (&, <, >)."""
    return html.escape(text, quote=False)


def esc_attr(text: str) -> str:
    """Escape an attribute value (quotes too)."""
    return html.escape(text, quote=True)


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, as Telegram counts."""
    return len(text.encode("utf-16-le")) // 2


def _flanking_open(text: str, i: int, n: int) -> bool:
    """A marker of length n at i can open: followed by non-space (and `_` not inside a word)."""
    after = text[i + n] if i + n < len(text) else " "
    before = text[i - 1] if i > 0 else " "
    if after.isspace():
        return False
    return not (text[i] == "_" and before.isalnum())


def _flanking_close(text: str, i: int, n: int) -> bool:
    """A marker of length n at i can close: preceded by non-space (and `_` not inside a word)."""
    before = text[i - 1] if i > 0 else " "
    after = text[i + n] if i + n < len(text) else " "
    if before.isspace():
        return False
    return not (text[i] == "_" and after.isalnum())


_MARKERS = (("**", "b"), ("__", "b"), ("~~", "s"), ("*", "i"), ("_", "i"))


def inline(text: str) -> str:
    """Inline Markdown of one line → HTML; unmatched markers stay literal, tags always nest."""
    out: list[str] = []
    stack: list[tuple[str, str, int]] = []  # (marker, tag, index of its placeholder in out)
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "`":
            end = text.find("`", i + 1)
            if end > i + 1:
                out.append(f"<code>{esc(text[i + 1 : end])}</code>")
                i = end + 1
                continue
        if ch == "[":
            m = _LINK.match(text, i)
            if m:
                out.append(f'<a href="{esc_attr(m.group(2))}">{esc(m.group(1))}</a>')
                i = m.end()
                continue
        marker = next(((mk, tag) for mk, tag in _MARKERS if text.startswith(mk, i)), None)
        if marker is not None:
            mk, tag = marker
            if stack and stack[-1][0] == mk and _flanking_close(text, i, len(mk)):
                _, _, at = stack.pop()
                out[at] = f"<{tag}>"
                out.append(f"</{tag}>")
                i += len(mk)
                continue
            if all(s[0] != mk for s in stack) and _flanking_open(text, i, len(mk)):
                stack.append((mk, tag, len(out)))
                out.append(esc(mk))
                i += len(mk)
                continue
            out.append(esc(mk))
            i += len(mk)
            continue
        out.append(esc(ch))
        i += 1
    return "".join(out)


def markdown_to_html(md: str) -> str:
    """Model Markdown → Telegram HTML: fences, inline code, bold, italic, strike, links, lists,
    headings as bold lines, blockquotes; everything else escaped."""
    lines = md.replace("\r\n", "\n").split("\n")
    out: list[str] = []
    quote: list[str] = []
    i = 0

    def flush_quote() -> None:
        if quote:
            out.append("<blockquote>" + "\n".join(quote) + "</blockquote>")
            quote.clear()

    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            flush_quote()
            close = fence.group(1)
            body: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(close[:3]):
                body.append(lines[i])
                i += 1
            i += 1  # the closing fence (or the end of the text)
            lang = fence.group(2)
            code = esc("\n".join(body))
            attr = f' class="language-{esc_attr(lang)}"' if lang else ""
            out.append(f"<pre><code{attr}>{code}</code></pre>")
            continue
        q = _QUOTE.match(line)
        if q:
            quote.append(inline(q.group(1)))
            i += 1
            continue
        flush_quote()
        h = _HEADING.match(line)
        b = _BULLET.match(line)
        if h:
            out.append(f"<b>{inline(h.group(1))}</b>")
        elif _RULE.match(line):
            out.append("──────────")
        elif b:
            out.append(f"{b.group(1)}• {inline(b.group(2))}")
        else:
            out.append(inline(line))
        i += 1
    flush_quote()
    return "\n".join(out).strip("\n")


def activity_html(steps: Sequence[Step], elapsed_s: float) -> str:
    """`<blockquote expandable>` with a summary line and one line per tool call (capped)."""
    lines = activity_lines(steps)
    body = [summary_line(steps, elapsed_s)]
    used = len(body[0])
    for line in lines:
        if used + len(line) > ACTIVITY_CHARS:
            body.append("…")
            break
        body.append(line)
        used += len(line) + 1
    return "<blockquote expandable>" + esc("\n".join(body)) + "</blockquote>"


@dataclass
class _Open:
    """An open tag while splitting: its name and the full start tag to reopen it."""

    name: str
    start: str


def _tokens(markup: str) -> list[str]:
    """Split HTML into tags, entities and single characters (the units a split may fall between)."""
    out: list[str] = []
    pos = 0
    for m in re.finditer(r"<[^>]*>|&(?:#\d+|#x[0-9a-fA-F]+|[a-z]+);", markup):
        out.extend(markup[pos : m.start()])
        out.append(m.group(0))
        pos = m.end()
    out.extend(markup[pos:])
    return out


def _visible_len(token: str) -> int:
    """UTF-16 length of a token as Telegram counts it (tags count 0, entities as their character)."""
    if token.startswith("<"):
        return 0
    if token.startswith("&") and len(token) > 1:
        return utf16_len(html.unescape(token))
    return utf16_len(token)


def visible_len(markup: str) -> int:
    """UTF-16 length of HTML text after tags are removed and entities decoded."""
    return sum(_visible_len(t) for t in _tokens(markup))


def split_html(markup: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """Split HTML into parts of at most `limit` visible UTF-16 units, never inside a tag or entity;
    tags open at a cut are closed and reopened (a code block keeps its language); newlines are preferred."""
    tokens = _tokens(markup)
    parts: list[str] = []
    cur: list[str] = []
    opened: list[_Open] = []
    size = 0
    last_break = -1  # index in cur just after the last newline at the top level of text
    break_stack: list[_Open] = []
    for tok in tokens:
        tag = _TAG.fullmatch(tok)
        if tag:
            if tag.group(1):
                if opened and opened[-1].name == tag.group(2):
                    opened.pop()
            elif not tok.endswith("/>"):
                opened.append(_Open(tag.group(2), tok))
            cur.append(tok)
            continue
        width = _visible_len(tok)
        if size + width > limit and size > 0:
            if last_break > 0 and last_break < len(cur):
                head, tail = cur[:last_break], cur[last_break:]
                parts.append("".join(head) + "".join(f"</{o.name}>" for o in reversed(break_stack)))
                reopened = [o.start for o in break_stack]
                cur = reopened + tail
                size = sum(_visible_len(t) for t in tail)
            else:
                parts.append("".join(cur) + "".join(f"</{o.name}>" for o in reversed(opened)))
                cur = [o.start for o in opened]
                size = 0
            last_break = -1
        cur.append(tok)
        size += width
        if tok == "\n":
            last_break = len(cur)
            break_stack = list(opened)
    tail_text = "".join(cur)
    if visible_len(tail_text) > 0 or not parts:
        parts.append(tail_text)
    return [p for p in (_drop_empty_tags(p) for p in parts) if p]


def _drop_empty_tags(part: str) -> str:
    """Remove tag pairs left empty by a split (Telegram rejects empty messages, not empty tags, but
    an empty `<pre></pre>` part looks broken)."""
    prev = None
    while prev != part:
        prev = part
        part = re.sub(r"<([a-z-]+)(?: [^>]*)?></\1>", "", part)
    return part.strip("\n")


def render_reply(text: str, steps: Sequence[Step], elapsed_s: float, limit: int = MESSAGE_LIMIT) -> list[str]:
    """The whole reply as HTML parts: the answer first, the activity block on the last part."""
    body = markdown_to_html(text) or esc("(no answer)")
    if not steps:
        return split_html(body, limit)
    activity = activity_html(steps, elapsed_s)
    parts = split_html(body, limit)
    room = limit - visible_len(activity) - 1
    last = split_html(parts[-1], room)
    return [*parts[:-1], *last[:-1], last[-1] + "\n" + activity]


def plain_text(markup: str) -> str:
    """The visible text of HTML (for the resend when Telegram rejects a part)."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def split_plain(text: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """Plain text in parts of at most `limit` UTF-16 units, cut at a newline (else a space) when one is near."""
    parts: list[str] = []
    rest = text
    while utf16_len(rest) > limit:
        cut, size = 0, 0
        for i, ch in enumerate(rest):  # the largest prefix within the limit
            size += 2 if ord(ch) > 0xFFFF else 1
            if size > limit:
                break
            cut = i + 1
        window = rest[:cut]
        at = window.rfind("\n")
        if at < cut // 2:
            at = window.rfind(" ")
        if at < cut // 2:
            at = cut
        parts.append(rest[:at])
        rest = rest[at:].lstrip("\n") if at < cut else rest[at:]
    if rest.strip() or not parts:
        parts.append(rest)
    return [p for p in parts if p.strip()] or [text[:1] or "…"]
