"""Markdown from the model → Telegram's HTML subset, and splitting HTML at Telegram's length limit.

Markdown is parsed by markdown-it-py (CommonMark, plus tables and ~~strikethrough~~) and the syntax tree is
rendered to the tags Telegram accepts; raw HTML in the model's text is not interpreted, it stays visible.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline
from markdown_it.tree import SyntaxTreeNode

from adapters.markdown import RULE, drop_empty_pairs, glued, join_blocks, units_of, utf16_len
from adapters.telegram.limits import TELEGRAM_ACTIVITY_CHARS, TELEGRAM_MESSAGE_LIMIT
from core import EMPTY_ANSWER, Step, activity_lines, summary_line

LINK_SCHEMES = ("http://", "https://", "tg://", "mailto:")  # hrefs Telegram takes in a text link


def _spoiler(state: StateInline, silent: bool) -> bool:
    """Inline rule for Telegram's `||spoiler||` (not CommonMark): content without space at its edges."""
    start = state.pos
    if not state.src.startswith("||", start):
        return False
    end = state.src.find("||", start + 2, state.posMax)  # within the link label or span being parsed
    if end <= start + 2 or state.src[start + 2].isspace() or state.src[end - 1].isspace():
        return False
    if not silent:
        outer_max = state.posMax
        state.push("spoiler_open", "tg-spoiler", 1)
        state.pos, state.posMax = start + 2, end
        state.md.inline.tokenize(state)
        state.posMax = outer_max
        state.push("spoiler_close", "tg-spoiler", -1)
    state.pos = end + 2
    return True


# "html": False keeps raw HTML as text (escaped on output); linkify is left to Telegram, which links URLs itself
_MD = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_MD.inline.ruler.before("emphasis", "spoiler", _spoiler)
_MD.inline.add_terminator_char("|")  # so plain text stops where a spoiler may start
_INLINE_TAGS = {"strong": "b", "em": "i", "s": "s", "spoiler": "tg-spoiler"}
_TAG = re.compile(r"<(/?)([a-z-]+)([^>]*)>")
_UNIT = re.compile(r"<[^>]*>|&(?:#\d+|#x[0-9a-fA-F]+|[a-zA-Z]+);")
_EMPTY_PAIR = re.compile(r"<([a-z-]+)(?: [^>]*)?>(\s*)</\1>")
_QUOTE_EDGE = re.compile(r"(<blockquote>)(\s+)|(\s+)(</blockquote>)")


def esc(text: str) -> str:
    """Escape text for Telegram HTML (&, <, >)."""
    return html.escape(text, quote=False)


def esc_attr(text: str) -> str:
    """Escape an attribute value (quotes too)."""
    return html.escape(text, quote=True)


# ---------------------------------------------------------------------------------------------------------
# Markdown → HTML


@dataclass
class _Ctx:
    """Where a block is rendered: inside a quote, at which list depth."""

    quote: bool = False
    depth: int = 0
    lines: Sequence[str] = ()  # the source, to keep its blank lines between blocks


def _inline(node: SyntaxTreeNode, in_link: bool = False) -> str:
    """Inline children of a node → HTML."""
    out: list[str] = []
    for child in node.children:
        kind = child.type
        if kind == "text":
            out.append(esc(child.content))
        elif kind in ("softbreak", "hardbreak"):
            out.append("\n")  # Telegram shows the model's line breaks as they are
        elif kind == "code_inline":
            out.append(esc(child.content) if in_link else f"<code>{esc(child.content)}</code>")
        elif kind in _INLINE_TAGS:
            tag = _INLINE_TAGS[kind]
            out.append(f"<{tag}>{_inline(child, in_link)}</{tag}>")
        elif kind == "link":
            out.append(_link(str(child.attrs.get("href", "")), _inline(child, True), in_link))
        elif kind == "image":
            alt = esc(child.content) or "image"
            out.append(_link(str(child.attrs.get("src", "")), f"🖼 {alt}", in_link))
        else:  # html_inline cannot occur with html off; keep any other leaf's source visible
            out.append(esc(child.content))
    return "".join(out)


def _link(href: str, label: str, in_link: bool) -> str:
    """A text link when Telegram can open the URL, else the label followed by the URL."""
    if in_link or not href:
        return label
    if href.lower().startswith(LINK_SCHEMES):
        return f'<a href="{esc_attr(href)}">{label or esc(href)}</a>'
    return f"{label} ({esc(href)})" if label else esc(href)


def _code_block(code: str, lang: str, ctx: _Ctx) -> str:
    """A <pre> block (with its language); outside any quote, since Telegram nests neither."""
    code = code.rstrip("\n")
    if not code.strip():
        return ""
    attr = f' class="language-{esc_attr(lang)}"' if lang else ""
    block = f"<pre><code{attr}>{esc(code)}</code></pre>"
    return f"</blockquote>{block}<blockquote>" if ctx.quote else block


def _table(node: SyntaxTreeNode) -> str:
    """A table as aligned plain columns in a <pre> block (no formatting inside, as Telegram requires)."""
    rows: list[list[str]] = []
    for section in node.children:
        for tr in section.children:
            rows.append([plain_text(_inline(cell.children[0])) if cell.children else "" for cell in tr.children])
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    cols = [max((len(r[i]) for r in rows if i < len(r)), default=0) for i in range(width)]
    lines = [" | ".join(c.ljust(cols[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in cols))
    return f"<pre>{esc(chr(10).join(lines))}</pre>"


def _blocks(nodes: Sequence[SyntaxTreeNode], ctx: _Ctx, sep: str = "\n\n") -> str:
    """Render block nodes (join_blocks: empty ones skipped, a block right below the previous one stays so)."""
    return join_blocks(nodes, lambda node: _block(node, ctx), ctx.lines, sep)


def _list(node: SyntaxTreeNode, ctx: _Ctx) -> str:
    """A bullet or ordered list: "• " / "1. " markers, nested lists indented."""
    ordered = node.type == "ordered_list"
    number = int(str(node.attrs.get("start", 1))) if ordered else 0
    inner = _Ctx(ctx.quote, ctx.depth + 1, ctx.lines)
    items: list[str] = []
    tight = True
    for item in node.children:
        tight = tight and all(c.hidden for c in item.children if c.type == "paragraph")
        marker = f"{number}. " if ordered else ("• " if ctx.depth == 0 else "◦ ")
        number += 1
        body = _blocks(item.children, inner, "\n" if tight else "\n\n")
        items.append("  " * ctx.depth + marker + body)
    return ("\n" if tight else "\n\n").join(items)


def _block(node: SyntaxTreeNode, ctx: _Ctx) -> str:
    """One block node → HTML."""
    kind = node.type
    if kind == "paragraph":
        return _inline(node.children[0]) if node.children else ""
    if kind == "heading":
        text = _inline(node.children[0]) if node.children else ""
        return f"<b>{text}</b>" if text.strip() else ""
    if kind in ("bullet_list", "ordered_list"):
        return _list(node, ctx)
    if kind == "blockquote":
        if ctx.quote:  # Telegram cannot nest quotes: the inner one is part of the outer
            return _blocks(node.children, ctx)
        body = _blocks(node.children, _Ctx(True, ctx.depth, ctx.lines))
        return f"<blockquote>{body}</blockquote>" if body.strip() else ""
    if kind in ("fence", "code_block"):
        return _code_block(node.content, node.info.strip().split(" ")[0] if node.info else "", ctx)
    if kind == "hr":
        return RULE
    if kind == "table":
        table = _table(node)
        return f"</blockquote>{table}<blockquote>" if ctx.quote and table else table
    if kind == "inline":
        return _inline(node)
    return _blocks(node.children, ctx) if node.children else esc(node.content)


def markdown_to_html(md: str) -> str:
    """Model Markdown (CommonMark + tables + strikethrough) → Telegram HTML; raw HTML stays visible text."""
    body = _drop_empty_tags(_blocks(SyntaxTreeNode(_MD.parse(md)).children, _Ctx(lines=re.split(r"\r\n?|\n", md))))
    # blank lines next to a code block that interrupted a quote belong outside the quote
    return _QUOTE_EDGE.sub(lambda m: (m[2] + m[1]) if m[1] else (m[4] + m[3]), body).strip()


# ---------------------------------------------------------------------------------------------------------
# the activity block


def activity_html(steps: Sequence[Step], elapsed_s: float) -> str:
    """`<blockquote expandable>` with a summary line and one line per tool call (capped)."""
    lines = activity_lines(steps)
    body = [summary_line(steps, elapsed_s)]
    used = len(body[0])
    for line in lines:
        if used + len(line) > TELEGRAM_ACTIVITY_CHARS:
            body.append("…")
            break
        body.append(line)
        used += len(line) + 1
    return "<blockquote expandable>" + esc("\n".join(body)) + "</blockquote>"


# ---------------------------------------------------------------------------------------------------------
# splitting


def _tokens(markup: str) -> list[str]:
    """Split HTML into tags, entities and single characters (the units a split may fall between)."""
    return units_of(markup, _UNIT)


def _visible_len(token: str) -> int:
    """UTF-16 length of a token as Telegram counts it (tags count 0, entities as their character)."""
    if len(token) == 1:
        return 2 if ord(token) > 0xFFFF else 1
    if token[0] == "<":
        return 0
    if token[0] == "&":
        return utf16_len(html.unescape(token))
    return utf16_len(token)


def visible_len(markup: str) -> int:
    """UTF-16 length of HTML text after tags are removed and entities decoded."""
    return sum(_visible_len(t) for t in _tokens(markup))


@dataclass
class _Part:
    """The part being filled: its tokens, visible size and the tags open at each token."""

    tokens: list[str] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    stacks: list[tuple[str, ...]] = field(default_factory=list)  # open start tags before each token
    size: int = 0


def _cut_at(part: _Part, limit: int, incoming: str) -> int:
    """Where to end a full part: at the last newline, else space, in its second half, else as late as
    possible without splitting a visible character or leaving a start tag behind its text."""
    tokens = part.tokens
    for wanted in ("\n", " "):
        seen = 0
        best = -1
        for i, tok in enumerate(tokens):
            if tok == wanted and seen >= limit // 2:
                best = i
            seen += part.widths[i]
        if best > 0:
            return best
    cut, after = len(tokens), incoming
    while cut > 0 and (_is_start_tag(tokens[cut - 1]) or glued(tokens[cut - 1], after)):
        after = tokens[cut - 1]
        cut -= 1
    return cut if any(part.widths[:cut]) else len(tokens)


def _is_start_tag(token: str) -> bool:
    """Whether a token is a start tag (it goes with the text after it)."""
    return token.startswith("<") and len(token) > 1 and not token.startswith("</")


def _tag_name(start: str) -> str:
    """`a` for `<a href="…">`: what its end tag says ("" when it is no tag)."""
    found = _TAG.match(start)
    return found.group(2) if found else ""


def _close(stack: tuple[str, ...]) -> str:
    """End tags for the open start tags, innermost first."""
    return "".join(f"</{_tag_name(s)}>" for s in reversed(stack))


def split_html(markup: str, limit: int = TELEGRAM_MESSAGE_LIMIT) -> list[str]:
    """Split HTML into parts of at most `limit` visible UTF-16 units, never inside a tag or entity;
    tags open at a cut are closed and reopened (a code block keeps its language); newlines are preferred.
    Parts without visible text are dropped, but there is always at least one part."""
    parts: list[str] = []
    if visible_len(markup) <= limit:
        parts.append(markup)
    else:
        _split_into(markup, limit, parts)
    kept = [p for p in (_drop_empty_tags(p).strip() for p in parts) if plain_text(p).strip()]
    return kept or ["…"]


def _split_into(markup: str, limit: int, parts: list[str]) -> None:
    """Append the parts of markup, each at most `limit` visible units, to parts."""
    stack: tuple[str, ...] = ()  # the start tags open before the current token
    part = _Part()
    for tok in _tokens(markup):
        width = _visible_len(tok)
        while part.size + width > limit and part.size > 0:
            part = _flush(part, limit, parts, tok, stack)
        part.stacks.append(stack)
        part.tokens.append(tok)
        part.widths.append(width)
        part.size += width
        if width == 0 and tok[0] == "<":
            tag = _TAG.fullmatch(tok)
            if tag and tag.group(1):
                stack = stack[:-1]
            elif tag and not tok.endswith("/>"):
                stack = (*stack, tok)
    parts.append("".join(part.tokens))


def _flush(part: _Part, limit: int, parts: list[str], incoming: str, now_open: tuple[str, ...]) -> _Part:
    """End the full part at its best cut; return the rest as the new part (tags reopened)."""
    cut = _cut_at(part, limit, incoming)
    skip = 1 if cut < len(part.tokens) and part.tokens[cut] in ("\n", " ") else 0  # the space or newline cut at
    stack = part.stacks[cut] if cut < len(part.tokens) else now_open
    parts.append("".join(part.tokens[:cut]) + _close(stack))
    start = cut + skip
    return _Part(
        tokens=[*stack, *part.tokens[start:]],
        widths=[0] * len(stack) + part.widths[start:],
        stacks=[stack[:i] for i in range(len(stack))] + part.stacks[start:],
        size=sum(part.widths[start:]),
    )


def _drop_empty_tags(part: str) -> str:
    """Remove tag pairs with nothing visible inside (left by a split or by an empty block)."""
    return drop_empty_pairs(part, _EMPTY_PAIR)


def render_reply(text: str, steps: Sequence[Step], elapsed_s: float, limit: int = TELEGRAM_MESSAGE_LIMIT) -> list[str]:
    """The whole reply as HTML parts: the answer first, the activity block on the last part."""
    body = markdown_to_html(text)
    if not plain_text(body).strip():  # e.g. only an empty code block: still say something
        body = esc(EMPTY_ANSWER)
    parts = split_html(body, limit)
    if not steps:
        return parts
    activity = activity_html(steps, elapsed_s)
    room = limit - visible_len(activity) - 1
    if room < 1:
        return [*parts, *split_html(activity, limit)]
    last = split_html(parts[-1], room)
    return [*parts[:-1], *last[:-1], last[-1] + "\n" + activity]


def plain_text(markup: str) -> str:
    """The visible text of HTML (for the resend when Telegram rejects a part)."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def split_plain(text: str, limit: int = TELEGRAM_MESSAGE_LIMIT) -> list[str]:
    """Plain text in parts of at most `limit` UTF-16 units, cut at a newline (else a space) when one is near;
    no part is blank, so text with nothing visible gives [] and the caller says what it sends instead."""
    parts: list[str] = []
    rest = text
    while utf16_len(rest) > limit:
        cut, size = 0, 0
        for i, ch in enumerate(rest):  # the largest prefix within the limit
            size += 2 if ord(ch) > 0xFFFF else 1
            if size > limit:
                break
            cut = i + 1
        while 1 < cut < len(rest) and glued(rest[cut - 1], rest[cut]):
            cut -= 1  # not inside an emoji sequence or between a letter and its accent
        cut = max(cut, 1)
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
    return [p for p in parts if p.strip()]
