"""Markdown from the model → Slack mrkdwn, and splitting mrkdwn at Slack's size limit.

Markdown is parsed by markdown-it-py (CommonMark, plus tables and ~~strikethrough~~), as for Telegram, and the syntax
tree is written as mrkdwn: `*bold*`, `_italic_`, `~strike~`, `` `code` ``, ```` ``` ```` blocks (Slack has no language
tag), `<url|label>` links, "> " quotes, "• " / "1. " lists, headings as bold lines and tables as aligned columns in a
code block. Slack's control characters `&`, `<` and `>` are escaped everywhere (docs.slack.dev, "Formatting message
text: escaping"), so the only `<` in the output opens a link this renderer made from an http(s)/mailto URL: text from
the model or a person can never form `<!channel>`, `<!here>`, `<!everyone>`, `<@U…>`, `<#C…>` or `<!subteam^…>`.
A typed "@channel", "@here", "@everyone" or "@group" pings only when a message is posted with `link_names=1` or
`parse=full` (Slack's message formatting docs: by default Slack does not link names), which the adapter must not set;
the renderer also puts a zero-width space after such an "@" so it would stay text even then.

Known limits: Slack has no escape for its formatting markers, so a literal `*x*` or `_x_` left in the text
(backslash-escaped in the Markdown) may show formatted; a line longer than a part, cut in the middle, may leave a
marker unpaired (shown as written). Quotes do not nest in Slack (inner ones join the outer) and hold no code block
(a code block or table directly in a quote stands outside it; one deeper in a list is quoted line by line).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

from adapters.markdown import RULE, glued, join_blocks, utf16_len
from adapters.slack.limits import SLACK_MIN_LIMIT, SLACK_TEXT_LIMIT
from core import EMPTY_ANSWER

FENCE = "```"
ZWSP = "\u200b"  # invisible: keeps "@here" from being a name, a marker next to a letter working, "```" out of code
LINK_SCHEMES = ("http://", "https://", "mailto:")  # hrefs made into Slack links; others are shown as text
INDENT = "    "  # one level of list nesting

# "html": False keeps raw HTML as text (escaped on output); bare URLs are left to Slack, which links them itself
_MD = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_MARKS = {"strong": "*", "em": "_", "s": "~"}
_BROADCAST = re.compile(r"(?<!\w)@(?=(?:channel|here|everyone|group)\b)", re.IGNORECASE)
_FENCE_RUN = re.compile(r"``(?=`)")
_URL_UNSAFE = set(' "<>|\\^`{}')
_UNIT = re.compile(r"<[^<>]*>|&(?:amp|lt|gt);|```")
_CLOSE = "\n" + FENCE  # what closes a code block cut by a split


def esc(text: str) -> str:
    """Escape Slack's three control characters (&, <, >) as HTML entities, and nothing else."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unescape(mrkdwn: str) -> str:
    """Undo esc()."""
    return mrkdwn.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def plain(text: str) -> str:
    """User-supplied plain text (a name, a task title) escaped so it shows as written and pings nobody."""
    return _BROADCAST.sub("@" + ZWSP, esc(text))


def steps_line(summary: str) -> str:
    """The "🔧 n steps · …" context line's text, escaped."""
    return plain(summary)


# ---------------------------------------------------------------------------------------------------------
# Markdown → mrkdwn


@dataclass
class _Ctx:
    """Where a block is rendered: at which list depth, and the source (to keep its blank lines between blocks)."""

    depth: int = 0
    lines: Sequence[str] = ()


def _defuse_fences(code: str) -> str:
    """Code with every run of three backticks broken by a zero-width space (Slack's code cannot hold "```")."""
    return _FENCE_RUN.sub("``" + ZWSP, code)


def _code_span(code: str) -> str:
    """Inline code: `x`, or ```x``` when the code holds a backtick (Slack's single backticks cannot)."""
    if not code.strip():
        return esc(code)
    body = esc(_defuse_fences(code))
    if "`" not in code:
        return f"`{body}`"
    return FENCE + (ZWSP if code.startswith("`") else "") + body + (ZWSP if code.endswith("`") else "") + FENCE


def _wrap(inner: str, mark: str) -> str:
    """Formatting markers around each line of the text (Slack formats within a line), outside its spaces."""
    out: list[str] = []
    for line in inner.split("\n"):
        core = line.strip(" \t")
        if not core:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip(" \t"))]
        trail = line[len(line.rstrip(" \t")) :]
        out.append(f"{lead}{mark}{core}{mark}{trail}")
    return "\n".join(out)


def _word_char(ch: str) -> bool:
    """Whether a character is a letter or digit (a marker next to one is not taken as a marker by Slack)."""
    return ch.isalnum()


def _join_pieces(pieces: list[tuple[str, bool]]) -> str:
    """Join inline pieces; a formatted piece right next to a letter or digit gets a zero-width space between."""
    out: list[str] = []
    for i, (text, formatted) in enumerate(pieces):
        if formatted and text:
            before = pieces[i - 1][0] if i > 0 else ""
            after = pieces[i + 1][0] if i + 1 < len(pieces) else ""
            if before and _word_char(before[-1]):
                text = ZWSP + text
            if after and _word_char(after[0]):
                text += ZWSP
        out.append(text)
    return "".join(out)


def _inline(node: SyntaxTreeNode, active: frozenset[str] = frozenset(), in_link: bool = False) -> str:
    """Inline children of a node → mrkdwn (in a link's label: escaped text only)."""
    pieces: list[tuple[str, bool]] = []
    for child in node.children:
        kind = child.type
        if kind == "text":
            pieces.append((plain(child.content), False))
        elif kind in ("softbreak", "hardbreak"):
            pieces.append((" " if in_link else "\n", False))
        elif kind == "code_inline":
            pieces.append((plain(child.content), False) if in_link else (_code_span(child.content), True))
        elif kind in _MARKS:
            inner = _inline(child, active | {kind}, in_link)
            if in_link or kind in active:  # Slack nests no marker within itself
                pieces.append((inner, False))
            else:
                pieces.append((_wrap(inner, _MARKS[kind]), True))
        elif kind == "link":
            pieces.append((_link(str(child.attrs.get("href", "")), _inline(child, active, True), in_link), False))
        elif kind == "image":
            label = "🖼 " + (plain(child.content) or "image")
            pieces.append((_link(str(child.attrs.get("src", "")), label, in_link), False))
        else:  # html_inline cannot occur with html off; keep any other leaf's source visible
            pieces.append((plain(child.content), False))
    return _join_pieces(pieces)


def safe_url(href: str) -> str | None:
    """The URL as it may stand in `<url|label>` (percent-encoded where it could end or split the link, `&` escaped),
    or None when it is not an http(s) or mailto URL."""
    if not href.lower().startswith(LINK_SCHEMES):
        return None
    encoded = "".join(
        quote(c, safe="") if c in _URL_UNSAFE or not c.isprintable() or not c.isascii() else c for c in href
    )
    return encoded.replace("&", "&amp;")


def _link(href: str, label: str, in_link: bool) -> str:
    """A Slack link when the URL is one Slack opens, else the label followed by the URL as text."""
    if in_link or not href:
        return label
    url = safe_url(href)
    if url is not None:
        return f"<{url}|{label}>" if label.strip() else f"<{url}>"
    return f"{label} ({plain(href)})" if label else plain(href)


def _code_block(code: str) -> str:
    """A ``` block (Slack shows no language); nothing for an empty one."""
    code = code.rstrip("\n")
    if not code.strip():
        return ""
    return f"{FENCE}\n{esc(_defuse_fences(code))}\n{FENCE}"


def _table(node: SyntaxTreeNode) -> str:
    """A table as aligned plain columns in a code block (Slack's mrkdwn has no tables)."""
    rows: list[list[str]] = []
    for section in node.children:
        for tr in section.children:
            rows.append([_cell(cell) for cell in tr.children])
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    cols = [max((len(r[i]) for r in rows if i < len(r)), default=0) for i in range(width)]
    lines = [" | ".join(c.ljust(cols[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in cols))
    return _BROADCAST.sub("@" + ZWSP, _code_block("\n".join(lines)))


def _cell(cell: SyntaxTreeNode) -> str:
    """A table cell's text as shown (links as their labels), without formatting."""
    return unescape(_inline(cell.children[0], in_link=True)).replace(ZWSP, "") if cell.children else ""


def _blocks(nodes: Sequence[SyntaxTreeNode], ctx: _Ctx, sep: str = "\n\n") -> str:
    """Render block nodes (join_blocks: empty ones skipped, a block right below the previous one stays so)."""
    return join_blocks(nodes, lambda node: _block(node, ctx), ctx.lines, sep)


def _list(node: SyntaxTreeNode, ctx: _Ctx) -> str:
    """A bullet or ordered list: "• " / "1. " markers, nested lists indented."""
    ordered = node.type == "ordered_list"
    number = int(str(node.attrs.get("start", 1))) if ordered else 0
    inner = _Ctx(ctx.depth + 1, ctx.lines)
    items: list[str] = []
    tight = True
    for item in node.children:
        tight = tight and all(c.hidden for c in item.children if c.type == "paragraph")
        marker = f"{number}. " if ordered else ("• " if ctx.depth == 0 else "◦ ")
        number += 1
        body = _blocks(item.children, inner, "\n" if tight else "\n\n")
        items.append(_marked(INDENT * ctx.depth + marker, body))
    return ("\n" if tight else "\n\n").join(items)


def _marked(lead: str, body: str) -> str:
    """An item's marker before its body; after the quote mark when the body starts with a quote (the mark must
    start the line)."""
    if body.startswith(">"):
        return "> " + lead + body[1:].lstrip(" ")
    return lead + body


def _quote(node: SyntaxTreeNode, ctx: _Ctx) -> str:
    """A block quote: "> " before each line; code and tables stand outside it (a quote holds no code block), and a
    quote within a quote is part of the outer one (Slack nests none)."""
    out: list[str] = []
    for child in node.children:
        text = _block(child, ctx)
        if not text.strip():
            continue
        if child.type not in ("fence", "code_block", "table", "blockquote"):
            text = "\n".join(_quoted(line) for line in text.split("\n"))
        out.append(text)
    return "\n".join(out)


def _quoted(line: str) -> str:
    """A line within a quote; one already quoted (by a quote deeper down) keeps its one mark."""
    if line.startswith(">"):  # text never starts with a raw ">" (it is escaped): this is a quote's mark
        return line
    return "> " + line if line.strip() else ">"


def _block(node: SyntaxTreeNode, ctx: _Ctx) -> str:
    """One block node → mrkdwn."""
    kind = node.type
    if kind == "paragraph":
        return _inline(node.children[0]) if node.children else ""
    if kind == "heading":
        text = _inline(node.children[0], frozenset({"strong"})) if node.children else ""
        return _wrap(text, "*") if text.strip() else ""
    if kind in ("bullet_list", "ordered_list"):
        return _list(node, ctx)
    if kind == "blockquote":
        return _quote(node, ctx)
    if kind in ("fence", "code_block"):
        return _code_block(node.content)
    if kind == "hr":
        return RULE
    if kind == "table":
        return _table(node)
    if kind == "inline":
        return _inline(node)
    return _blocks(node.children, ctx) if node.children else plain(node.content)


def render(markdown: str) -> str:
    """The whole answer as mrkdwn: nothing of its text lost, Slack's control characters escaped, no ping."""
    lines = re.split(r"\r\n?|\n", markdown)
    return _blocks(SyntaxTreeNode(_MD.parse(markdown)).children, _Ctx(lines=lines)).strip("\n")


def render_parts(markdown: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """The answer rendered and split into message parts within `limit` (an empty answer says so)."""
    body = render(markdown)
    if not body.strip():  # e.g. only an empty code block: still say something
        body = plain(EMPTY_ANSWER)
    return split(body, limit)


# ---------------------------------------------------------------------------------------------------------
# splitting


def _unlink(link: str) -> str:
    """`<url|label>` as text: "label (url)" (both already escaped), for a link too long to keep whole."""
    url, _, label = link[1:-1].partition("|")
    return f"{label} ({url})" if label.strip() else url


def _units(mrkdwn: str, limit: int) -> list[str]:
    """Split mrkdwn into links, entities, fences and single characters: the units a split falls between. A link
    longer than half a part becomes text first (so it never stands in the way of a split)."""
    out: list[str] = []
    pos = 0
    for m in _UNIT.finditer(mrkdwn):
        out.extend(mrkdwn[pos : m.start()])
        unit = m.group(0)
        if unit[0] == "<" and utf16_len(unit) > limit // 2:
            out.extend(_units(_unlink(unit), limit))
        else:
            out.append(unit)
        pos = m.end()
    out.extend(mrkdwn[pos:])
    return out


@dataclass
class _Window:
    """The units a part may take from `start`: where each prefix ends, its size and whether it ends inside code."""

    start: int
    ends: list[int]  # candidate cut positions (exclusive ends), increasing
    sizes: list[int]  # the part's size at each end, closing fence included when it ends inside code
    inside: list[bool]  # whether a code block is open at each end


def _window(units: list[str], widths: list[int], start: int, in_code: bool, budget: int) -> _Window:
    """Every end the part starting at `start` may have within the budget."""
    win = _Window(start, [], [], [])
    size, code = 0, in_code
    for i in range(start, len(units)):
        size += widths[i]
        code ^= units[i] == FENCE
        total = size + (len(_CLOSE) if code and i + 1 < len(units) else 0)
        if size > budget:
            break
        if total <= budget:
            win.ends.append(i + 1)
            win.sizes.append(total)
            win.inside.append(code)
    return win


def _best_cut(units: list[str], win: _Window, budget: int) -> int:
    """Index into the window's ends: at the last newline, else after the last space, in the part's second half;
    else as late as possible without breaking a visible character."""
    for wanted, offset in (("\n", 0), (" ", 1)):
        for k in range(len(win.ends) - 1, -1, -1):
            if win.sizes[k] < budget // 2:
                break
            end = win.ends[k]
            if end < len(units) and units[end - offset] == wanted:
                return k
    for k in range(len(win.ends) - 1, -1, -1):
        end = win.ends[k]
        if end >= len(units) or not glued(units[end - 1], units[end]):
            return k
    return len(win.ends) - 1


def split(mrkdwn: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """Split mrkdwn into parts of at most `limit` (see utf16_len), never inside an entity or a link; a code block cut
    by a split is closed at the end of its part and reopened at the start of the next; newlines are preferred.
    Parts without text are dropped, but there is always at least one part."""
    limit = max(limit, SLACK_MIN_LIMIT)
    text = mrkdwn.strip()
    if utf16_len(text) <= limit:
        return [text] if _has_text(text) else ["…"]
    units = _units(text, limit)
    widths = [utf16_len(u) for u in units]
    parts: list[str] = []
    start, in_code = 0, False
    while start < len(units):
        opening = FENCE + "\n" if in_code else ""
        budget = limit - len(opening)
        win = _window(units, widths, start, in_code, budget)
        if not win.ends:  # cannot happen with SLACK_MIN_LIMIT; keep going rather than loop
            win = _Window(start, [start + 1], [widths[start]], [in_code ^ (units[start] == FENCE)])
        k = len(win.ends) - 1 if win.ends[-1] == len(units) else _best_cut(units, win, budget)
        end = win.ends[k]
        body = opening + "".join(units[start:end])
        if win.inside[k] and end < len(units):
            body += _CLOSE
        parts.append(body)
        in_code = win.inside[k]
        start = end + (1 if end < len(units) and units[end] == "\n" else 0)
    kept = [p for p in (p.strip() for p in parts) if _has_text(p)]
    return kept or ["…"]


def _has_text(part: str) -> bool:
    """Whether a part shows anything besides code fences and whitespace."""
    return bool(re.sub(r"```|\s", "", part))
