"""What the Markdown renderers share (Telegram's HTML, Slack's mrkdwn, Matrix's HTML): the length a platform counts
(UTF-16 units), the rule a `---` becomes, how rendered blocks are joined and where a split may not cut."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

from markdown_it.tree import SyntaxTreeNode

RULE = "──────────"  # a thematic break (`---`), as a line


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, as Telegram and Slack count it (a character outside the BMP counts 2)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def follows_directly(node: SyntaxTreeNode, lines: Sequence[str]) -> bool:
    """Whether the source line above a block holds text (quote markers and indentation aside)."""
    first = node.map[0] if node.map is not None else 0
    return 0 < first <= len(lines) and lines[first - 1].strip(" \t>") != ""


def join_blocks(
    nodes: Sequence[SyntaxTreeNode], render: Callable[[SyntaxTreeNode], str], lines: Sequence[str], sep: str
) -> str:
    """The blocks rendered, empty ones skipped, `sep` between them; a block right below the previous one in the
    source `lines` (no blank line: "Steps:" above a list or code) stays right below it."""
    out: list[str] = []
    for node in nodes:
        text = render(node)
        if not text:
            continue
        if out:
            out.append("\n" if follows_directly(node, lines) else sep)
        out.append(text)
    return "".join(out)


def glued(before: str, after: str) -> bool:
    """True when a cut between these two units would break one visible character (emoji, accents, flags)."""
    if len(before) != 1 or len(after) != 1:
        return False
    if before == "\u200d" or after in "\u200d\ufe0e\ufe0f" or 0x1F3FB <= ord(after) <= 0x1F3FF:
        return True
    if 0x1F1E6 <= ord(before) <= 0x1F1FF and 0x1F1E6 <= ord(after) <= 0x1F1FF:
        return True  # a flag is two regional indicators
    # combining marks (accents, the keycap of 1️⃣) and the tag characters of subdivision flags
    return unicodedata.category(after) in ("Mn", "Me", "Mc") or 0xE0020 <= ord(after) <= 0xE007F


def units_of(text: str, unit: re.Pattern[str]) -> list[str]:
    """The text as the pattern's matches (tags, entities: what a split may not cut) and single characters between."""
    out: list[str] = []
    pos = 0
    for m in unit.finditer(text):
        out.extend(text[pos : m.start()])
        out.append(m.group(0))
        pos = m.end()
    out.extend(text[pos:])
    return out


def drop_empty_pairs(markup: str, pair: re.Pattern[str]) -> str:
    """Remove the tag pairs `pair` finds (its group 2: the whitespace kept) until none is left (a removed pair may
    leave its parent empty)."""
    prev = None
    while prev != markup:
        prev = markup
        markup = pair.sub(r"\2", markup)
    return markup
