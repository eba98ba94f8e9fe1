"""An answer as Matrix messages: Markdown → the HTML of `formatted_body` (org.matrix.custom.html), a plain `body`
read from it, parts within the limit, and the tool steps folded in a <details>.

Markdown is parsed by markdown-it-py (CommonMark, plus tables and ~~strikethrough~~), as for Telegram and Slack, and
the syntax tree is written with tags of the spec's recommended subset only: p, h1–h6, strong, em, del, code,
pre/code class="language-x", ul/ol start/li, blockquote (nested), hr, br, a href, table/thead/tbody/tr/th/td,
details/summary. Raw HTML in the text is not interpreted ("html": False): every text is escaped. Only http(s) and
mailto URLs become links; any other (javascript:, a relative path) and a matrix.to link to a person (a pill) are shown
as "label (url)"; an image is a link (Matrix shows only mxc:// images). Tables are HTML tables (Element and most
clients draw them; the plain body has them as aligned columns).

Pings: every content carries an empty "m.mentions" (it mentions nobody: clients and servers that know intentional
mentions ignore the text), and for older ones, whose legacy push rule finds "@room" in the body, a zero-width space
goes after the "@" of "@room" (in code too: the rule reads the body whole). A typed user id `@name:server` stays as
typed, so a person can copy theirs; a person's name or id typed in the text can still match an old server's legacy
name rules (they match the localpart or display name as a word, which no invisible character hides); only m.mentions
stops that.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode
from mautrix.types import Obj

from adapters.matrix.limits import MATRIX_LINK_CHARS, MATRIX_MIN_LIMIT, MATRIX_TEXT_LIMIT
from adapters.matrix.plain import to_plain
from adapters.matrix.split import size, split_both
from core import EMPTY_ANSWER, Step, activity_lines, summary_line

HTML_FORMAT = "org.matrix.custom.html"
ZWSP = "\u200b"  # invisible: keeps "@room" from being a room ping
LINK_SCHEMES = ("http://", "https://", "mailto:")  # hrefs made into links; others are shown as text

_MD = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_INLINE_TAGS = {"strong": "strong", "em": "em", "s": "del"}
_ROOM = re.compile(r"(?<!\w)@(?=room(?!\w))", re.IGNORECASE)
_LEADING_ROOM = re.compile(r"^((?:<[^>]*>|\s)*)@(?=room(?!\w))", re.IGNORECASE)  # a part's text starting "@room"
_PERSON_LINK = re.compile(r"https?://matrix\.to/#/(?:@|%40)", re.IGNORECASE)
_LANGUAGE = re.compile(r"[A-Za-z0-9_+#.\-]{1,32}")


def defuse(text: str) -> str:
    """Text with a zero-width space after the "@" of "@room" (any case), so no push rule sees a room ping."""
    return _ROOM.sub("@" + ZWSP, text)


def esc(text: str) -> str:
    """Text as HTML: escaped, "@room" defused. A user id stays as typed, so a person can copy theirs (a refusal names
    it for ALLOWED_USERS): the empty m.mentions already keeps it from notifying anyone, and an old server's rule
    matches the localpart, which a zero-width space after the "@" would not hide."""
    return html.escape(defuse(text), quote=False)


def _esc_code(code: str) -> str:
    """Code as HTML: escaped, "@room" defused, nothing else changed."""
    return html.escape(defuse(code), quote=False)


# ---------------------------------------------------------------------------------------------------------
# Markdown → HTML


def _inline(node: SyntaxTreeNode, in_link: bool = False) -> str:
    """Inline children of a node → HTML (in a link's label: no link within)."""
    out: list[str] = []
    for child in node.children:
        kind = child.type
        if kind == "text":
            out.append(esc(child.content))
        elif kind in ("softbreak", "hardbreak"):
            out.append("<br>")  # the model's line breaks are kept, as Element's own Markdown does
        elif kind == "code_inline":
            out.append(f"<code>{_esc_code(child.content)}</code>")
        elif kind in _INLINE_TAGS:
            tag = _INLINE_TAGS[kind]
            out.append(f"<{tag}>{_inline(child, in_link)}</{tag}>")
        elif kind == "link":
            out.append(_link(str(child.attrs.get("href", "")), _inline(child, True), in_link))
        elif kind == "image":
            label = "🖼 " + (esc(child.content) or "image")
            out.append(_link(str(child.attrs.get("src", "")), label, in_link))
        else:  # html_inline cannot occur with html off; keep any other leaf's source visible
            out.append(esc(child.content))
    return "".join(out)


def _linkable(href: str) -> bool:
    """Whether a URL becomes a link: http(s) or mailto, not too long for a part, not a person's pill."""
    return href.lower().startswith(LINK_SCHEMES) and len(href) <= MATRIX_LINK_CHARS and not _PERSON_LINK.match(href)


def _link(href: str, label: str, in_link: bool) -> str:
    """An <a> when the URL may be one, else the label followed by the URL as text."""
    if in_link or not href:
        return label
    if _linkable(href):
        return f'<a href="{html.escape(href, quote=True)}">{label or esc(href)}</a>'
    return f"{label} ({esc(href)})" if label else esc(href)


def _code_block(code: str, info: str) -> str:
    """A <pre><code> block with its language (a plain word only); nothing for an empty one."""
    code = code.rstrip("\n")
    if not code.strip():
        return ""
    lang = info.strip().split(" ")[0] if info else ""
    attr = f' class="language-{lang}"' if _LANGUAGE.fullmatch(lang) else ""
    return f"<pre><code{attr}>{_esc_code(code)}</code></pre>"


def _table(node: SyntaxTreeNode) -> str:
    """A table: a <thead> row of <th>, <tbody> rows of <td> (no alignment: Matrix allows no style)."""
    out = ["<table>"]
    for section in node.children:
        cell = "th" if section.type == "thead" else "td"
        rows = [
            "<tr>"
            + "".join(f"<{cell}>{_inline(c.children[0]) if c.children else ''}</{cell}>" for c in tr.children)
            + "</tr>"
            for tr in section.children
        ]
        out.append(f"<{section.type}>\n" + "\n".join(rows) + f"\n</{section.type}>")
    return "\n".join([*out, "</table>"])


def _blocks(nodes: Sequence[SyntaxTreeNode]) -> str:
    """Block nodes → HTML, one a line, empty ones skipped."""
    return "\n".join(text for text in (_block(node) for node in nodes) if text)


def _list(node: SyntaxTreeNode) -> str:
    """A bullet or numbered list (a tight one's items hold their text without <p>: its paragraphs are hidden)."""
    items = node.children
    tag = "ol" if node.type == "ordered_list" else "ul"
    start = int(str(node.attrs.get("start", 1))) if tag == "ol" else 1
    head = f'<ol start="{start}">' if start != 1 else f"<{tag}>"
    body = "\n".join(f"<li>{_blocks(item.children)}</li>" for item in items)
    return f"{head}\n{body}\n</{tag}>"


def _block(node: SyntaxTreeNode) -> str:
    """One block node → HTML."""
    kind = node.type
    if kind == "paragraph":
        text = _inline(node.children[0]) if node.children else ""
        return text if node.hidden or not text else f"<p>{text}</p>"
    if kind == "heading":
        text = _inline(node.children[0]) if node.children else ""
        return f"<{node.tag}>{text}</{node.tag}>" if text.strip() else ""
    if kind in ("bullet_list", "ordered_list"):
        return _list(node)
    if kind == "blockquote":
        body = _blocks(node.children)
        return f"<blockquote>\n{body}\n</blockquote>" if body else ""
    if kind in ("fence", "code_block"):
        return _code_block(node.content, node.info)
    if kind == "hr":
        return "<hr>"
    if kind == "table":
        return _table(node)
    if kind == "inline":
        return _inline(node)
    return _blocks(node.children) if node.children else esc(node.content)


def render(markdown: str) -> str:
    """The whole answer as Matrix HTML: every text escaped, nothing of it lost, no ping."""
    return _blocks(SyntaxTreeNode(_MD.parse(markdown)).children)


def steps_html(steps: Sequence[Step], elapsed_s: float) -> str:
    """The tool steps folded: `<details>` with the summary line, then one line per call (capped)."""
    lines = "\n".join(f"<li>{esc(line)}</li>" for line in activity_lines(steps))
    return f"<details><summary>{esc(summary_line(steps, elapsed_s))}</summary>\n<ul>\n{lines}\n</ul>\n</details>"


# ---------------------------------------------------------------------------------------------------------
# message contents


def body_of(markup: str) -> str:
    """The plain body of a formatted_body ("@room" defused once more: a URL shown after its label may hold one)."""
    return defuse(to_plain(markup))


def html_content(markup: str) -> Obj:
    """An m.text event's content: the HTML and its plain body; an empty m.mentions says it pings nobody."""
    body = body_of(markup)
    fields = {"msgtype": "m.text", "body": body, "format": HTML_FORMAT, "formatted_body": markup, "m.mentions": {}}
    return Obj(**fields)  # type: ignore[no-untyped-call]


def _plain_size(markup: str) -> int:
    """The size of a part's plain body."""
    return size(body_of(markup))


def html_parts(markup: str, limit: int = MATRIX_TEXT_LIMIT) -> list[str]:
    """HTML split into parts whose HTML and plain body are both within `limit`; parts showing nothing dropped. A cut
    can leave a "@room" that followed a letter (not a ping there) at the start of a part, where it reads as one: it is
    defused there, a character more at most (room is kept for it)."""
    return [
        _LEADING_ROOM.sub(r"\1@" + ZWSP, p, count=1)
        for p in split_both(markup, limit - 1, _plain_size)
        if body_of(p).strip()
    ]


def answer_parts(
    text: str, steps: Sequence[Step] = (), elapsed_s: float = 0.0, limit: int = MATRIX_TEXT_LIMIT
) -> list[str]:
    """The answer's HTML parts (`limit` at least MATRIX_MIN_LIMIT); with steps, their <details> ends the last part,
    or is a part of its own when it does not fit there."""
    limit = max(limit, MATRIX_MIN_LIMIT)
    parts = html_parts(render(text), limit) or [esc(EMPTY_ANSWER)]
    if not steps:
        return parts
    folded = steps_html(steps, elapsed_s)
    joined = f"{parts[-1]}\n{folded}"
    if size(joined) <= limit and _plain_size(joined) <= limit:
        return [*parts[:-1], joined]
    return [*parts, *html_parts(folded, limit)]


def answer_contents(
    text: str, steps: Sequence[Step] = (), elapsed_s: float = 0.0, limit: int = MATRIX_TEXT_LIMIT
) -> list[Obj]:
    """The answer as the contents of its messages, in order."""
    return [html_content(p) for p in answer_parts(text, steps, elapsed_s, limit)]


# ---------------------------------------------------------------------------------------------------------
# plain text (the adapter's own lines: a refusal, a reminder)


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
    """A plain m.text event's content ("@room" defused); an empty m.mentions says it pings nobody."""
    return Obj(**{"msgtype": "m.text", "body": defuse(body), "m.mentions": {}})  # type: ignore[no-untyped-call]
