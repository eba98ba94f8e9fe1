"""Where an answer that used the web came from: the pages the turn read and the search results the answer names, at
its end, numbered, as links with their domain (core/turn/citations.py)."""

from __future__ import annotations

from core.turn.citations import cited
from core.types import Source

READ = Source("https://www.example.org/guide", "The Guide", read=True)
LISTED = Source("https://news.example.com/a?b=1", "A story", read=False)
OTHER = Source("https://unused.example.net/", "Not named", read=False)


def test_read_pages_and_named_results_are_cited_in_order_once() -> None:
    text = "See https://news.example.com/a?b=1 for the story."
    assert cited(text, [READ, OTHER, LISTED, READ]) == (
        f"{text}\n\nSources:\n"
        "1. [The Guide](https://www.example.org/guide) — example.org\n"
        "2. [A story](https://news.example.com/a?b=1) — news.example.com"
    )


def test_an_answer_without_web_pages_stays_as_it_is() -> None:
    assert cited("Nothing looked up.", []) == "Nothing looked up."
    assert cited("A search, nothing named.", [OTHER]) == "A search, nothing named."


def test_a_hostile_title_or_url_cannot_break_the_link() -> None:
    evil = Source("https://x.example/p) [click](https://evil.example", "] (https://evil.example) [", read=True)
    out = cited("ok", [evil])
    line = out.splitlines()[-1]
    assert (
        line
        == "1. [) (https://evil.example) (](https://x.example/p%29%20%5Bclick%5D%28https://evil.example) — x.example"
    )
    assert line.count("](") == 1, "one link only"


def test_an_empty_title_shows_the_domain() -> None:
    assert cited("ok", [Source("https://example.org/x", "  ", read=True)]).endswith(
        "1. [example.org](https://example.org/x) — example.org"
    )
