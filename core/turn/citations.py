"""The sources an answer that used the web ends with: the pages the turn read, and the search results whose URL the
answer itself names, numbered, as Markdown links with their domain (each front end shows links its own way)."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote, urlsplit

from core.constants import CITED_TITLE_CHARS
from core.types import Source

SOURCES = "Sources:"
URL_SAFE = ":/?#@!$&'*+,;=%~-._"  # kept as they are in a cited URL; everything else is percent-encoded


def cited(text: str, sources: Sequence[Source]) -> str:
    """`text` with its sources after it: the pages read, then the search results it names (unchanged when none)."""
    chosen: list[Source] = []
    read = [s for s in sources if s.read]  # the pages read first, then the results the answer names
    for source in [*read, *(s for s in sources if not s.read and s.url in text)]:
        if all(c.url != source.url for c in chosen):
            chosen.append(source)
    if not chosen:
        return text
    lines = [f"{n}. {_link(s)}" for n, s in enumerate(chosen, 1)]
    return f"{text.rstrip()}\n\n{SOURCES}\n" + "\n".join(lines)


def _link(source: Source) -> str:
    """`[Title](url) — domain`, the title cut and kept from closing the link early."""
    domain = urlsplit(source.url).hostname or source.url
    title = " ".join(source.title.split())[:CITED_TITLE_CHARS].replace("[", "(").replace("]", ")") or domain
    url = quote(source.url, safe=URL_SAFE)  # no space, bracket or parenthesis can end the link early
    return f"[{title}]({url}) — {domain.removeprefix('www.')}"
