"""The plain `body` of a Matrix message, read from its own formatted_body: the HTML this package renders shown as
Markdown-ish text for clients without HTML (and for notifications): "• " / "1. " lists, "> " quotes, code as it is,
tables as aligned columns, a link as "label (url)" when the label is not the URL, a rule as a line."""

from __future__ import annotations

from html.parser import HTMLParser

from adapters.markdown import RULE

_BLOCKS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table", "details", "div", "caption"}


class _Plain(HTMLParser):
    """Writes the text of the HTML line by line, each line led by its quote and list prefixes."""

    def __init__(self) -> None:
        """An empty text."""
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.line: str | None = None  # the line being written (None: no line started)
        self.prefix: list[str] = []  # per open quote or list item: what leads its lines
        self.marker: str | None = None  # a list item's marker, leading its first line
        self.pending = 0  # line breaks asked for before the next text
        self.pending_depth = 0  # how many prefixes the blank lines among them carry
        self.lists: list[int | None] = []  # per open list: the next number (None: bullets)
        self.links: list[tuple[str, list[str]]] = []  # per open link: its href and its label so far
        self.pre = 0
        self.rows: list[tuple[list[str], bool]] | None = None  # a table's rows (cells, whether a header row)
        self.cell: list[str] | None = None

    def breaks(self, n: int) -> None:
        """Ask for at least `n` line breaks before the next text (1: a new line, 2: a blank line between)."""
        if self.pending == 0:
            self.pending_depth = len(self.prefix)
        self.pending = max(self.pending, n)
        self.pending_depth = min(self.pending_depth, len(self.prefix))

    def put(self, text: str) -> None:
        """Text on the current line (lines in `text` start new ones)."""
        for link in self.links:
            link[1].append(text)
        if self.cell is not None:
            self.cell.append(text.replace("\n", " "))
            return
        for i, piece in enumerate(text.split("\n")):
            if i:
                self.pending += 1
            if piece:
                self._write(piece)

    def _write(self, piece: str) -> None:
        """A piece without line breaks, after the breaks asked for."""
        if self.pending and self.line is not None:
            self.lines.append(self.line)
            blank = "".join(self.prefix[: self.pending_depth]).rstrip()
            self.lines.extend([blank] * (self.pending - 1))
            self.line = None
        self.pending = 0
        if self.line is None:
            lead = "".join(self.prefix)
            if self.marker is not None:
                lead = "".join(self.prefix[:-1]) + self.marker
                self.marker = None
            self.line = lead
        self.line += piece

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """Open an element."""
        values = {k: v or "" for k, v in attrs}
        if tag in _BLOCKS or tag == "summary":
            self.breaks(1 if tag == "summary" else 2)
            self.pre += tag == "pre"
            if tag == "table":
                self.rows = []
        elif tag == "br":
            self.put(" " if self.cell is not None else "\n")
        elif tag == "hr":
            self.breaks(2)
            self.put(RULE)
            self.breaks(2)
        elif tag == "blockquote":
            self.breaks(2)
            self.prefix.append("> ")
        elif tag in ("ul", "ol"):
            self.breaks(1 if self.lists else 2)
            start = values.get("start", "1")
            self.lists.append(int(start) if tag == "ol" and start.isdigit() else (1 if tag == "ol" else None))
        elif tag == "li":
            self._item()
        elif tag == "a":
            self.links.append((values.get("href", ""), []))
        elif tag == "tr" and self.rows is not None:
            self.rows.append(([], False))
        elif tag in ("td", "th"):
            self.cell = []

    def _item(self) -> None:
        """A list item: its marker leads its first line, its other lines are indented as far."""
        self.breaks(1)
        number = self.lists[-1] if self.lists else None
        if number is None:
            marker = "• " if len(self.lists) <= 1 else "◦ "
        else:
            marker = f"{number}. "
            self.lists[-1] = number + 1
        self.marker = marker
        self.prefix.append(" " * len(marker))

    def handle_endtag(self, tag: str) -> None:
        """Close an element."""
        if tag in _BLOCKS or tag == "summary":
            self.pre -= tag == "pre"
            if tag == "table":
                self._table()
            self.breaks(1 if tag == "summary" else 2)
        elif tag == "blockquote" or tag == "li":
            if self.prefix:
                self.prefix.pop()
            self.marker = None
            self.breaks(2 if tag == "blockquote" else 1)
        elif tag in ("ul", "ol"):
            if self.lists:
                self.lists.pop()
            self.breaks(1 if self.lists else 2)
        elif tag == "a" and self.links:
            href, label = self.links.pop()
            shown = "".join(label)
            if href and shown.strip() != href and f"mailto:{shown.strip()}" != href:
                self.put(f" ({href})" if shown.strip() else href)
        elif tag in ("td", "th") and self.cell is not None:
            if self.rows:
                self.rows[-1][0].append("".join(self.cell).strip())
                self.rows[-1] = (self.rows[-1][0], self.rows[-1][1] or tag == "th")
            self.cell = None

    def _table(self) -> None:
        """The table's rows as aligned columns, a line under its header row."""
        rows, self.rows = self.rows or [], None
        cells = [r for r, _ in rows]
        width = max((len(r) for r in cells), default=0)
        cols = [max((len(r[i]) for r in cells if i < len(r)), default=0) for i in range(width)]
        for i, (row, header) in enumerate(rows):
            self.breaks(1)
            self.put(" | ".join(c.ljust(cols[k]) for k, c in enumerate(row)).rstrip() or " ")
            if header and i == 0 and len(rows) > 1:
                self.breaks(1)
                self.put("-+-".join("-" * w for w in cols))

    def handle_data(self, data: str) -> None:
        """Text: as it is in code; elsewhere the line breaks between elements are only layout."""
        if not self.pre and "\n" in data and not data.strip():
            return
        self.put(data)

    def text(self) -> str:
        """The text written."""
        lines = [*self.lines, *([self.line] if self.line is not None else [])]
        return "\n".join(line.rstrip() for line in lines).strip("\n")


def to_plain(markup: str) -> str:
    """The plain text of HTML rendered by this package."""
    parser = _Plain()
    parser.feed(markup)
    parser.close()
    return parser.text()
