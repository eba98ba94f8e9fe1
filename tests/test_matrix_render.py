"""Markdown → Matrix HTML and its plain body: examples, the model-style corpus, pings, link tricks and splitting."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from typing import Any

import pytest

from adapters.matrix.limits import MATRIX_MIN_LIMIT, MATRIX_TEXT_LIMIT
from adapters.matrix.render import (
    HTML_FORMAT,
    ZWSP,
    answer_contents,
    answer_parts,
    body_of,
    content,
    render,
    steps_html,
)
from adapters.matrix.split import size, split_html
from core import EMPTY_ANSWER, Step
from tests.test_slack_render import is_subsequence, load_corpus, source_text

# the spec's strongly suggested tags (v1.10 replaced font and strike with s; the renderer uses neither)
ALLOWED_TAGS = {
    *"s font del h1 h2 h3 h4 h5 h6 blockquote p a ul ol sup sub li b i u strong em strike code hr br div".split(),
    *"table thead tbody tr th td caption pre span img details summary".split(),
}
VOID = {"br", "hr", "img"}
ROOM_PING = re.compile(r"(?<!\w)@room(?!\w)", re.IGNORECASE)
_ENTITY = re.compile(r"&(?:amp|lt|gt|quot|#x27);")


class _Checker(HTMLParser):
    """Fails on a tag outside the spec's subset, an attribute not allowed, a misnested or unclosed element."""

    def __init__(self) -> None:
        """Nothing open yet."""
        super().__init__(convert_charrefs=False)
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """An allowed tag with allowed attributes."""
        assert tag in ALLOWED_TAGS, tag
        for name, value in attrs:
            allowed = (tag, name) in (("a", "href"), ("ol", "start"), ("code", "class"))
            assert allowed, (tag, name)
            if name == "href":
                assert (value or "").lower().startswith(("http://", "https://", "mailto:")), value
            if name == "class":
                assert re.fullmatch(r"language-[A-Za-z0-9_+#.\-]+", value or ""), value
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        """The innermost open element's end."""
        assert self.open and self.open[-1] == tag, (self.open, tag)
        self.open.pop()

    def handle_data(self, data: str) -> None:
        """Text holds no markup."""
        assert "<" not in data and ">" not in data, data


def assert_well_formed(markup: str) -> None:
    """Allowed tags only, properly nested and closed, every `&` an entity."""
    checker = _Checker()
    checker.feed(markup)
    checker.close()
    assert not checker.open, (checker.open, markup)
    assert "&" not in _ENTITY.sub("", markup), markup


def visible(markup: str) -> str:
    """What a reader sees of the HTML: its text, entities decoded, zero-width spaces dropped."""
    return html.unescape(re.sub(r"<[^>]*>", "", markup)).replace(ZWSP, "")


def squeeze(text: str) -> str:
    """Text without whitespace, zero-width spaces or the list, quote and rule marks a plain body adds."""
    return re.sub(r"[\s\u200b•◦>─]+", "", text)


def check_contents(contents: list[Any], limit: int = MATRIX_TEXT_LIMIT) -> None:
    """Each content: HTML with its plain body, both within the limit, well-formed, pinging nobody."""
    assert contents
    for c in (c.serialize() for c in contents):
        assert c["msgtype"] == "m.text" and c["format"] == HTML_FORMAT and c["m.mentions"] == {}
        body, markup = c["body"], c["formatted_body"]
        assert body.strip() and size(body) <= limit and size(markup) <= limit, (size(body), size(markup), limit)
        assert_well_formed(markup)
        text = html.unescape(re.sub(r"<[^>]*>", "", markup))  # zero-width spaces kept (a URL may hold "@room")
        assert not ROOM_PING.search(body) and not ROOM_PING.search(text)
        assert markup.count("<pre>") == markup.count("</pre>")


@pytest.mark.parametrize(("name", "md"), load_corpus(), ids=[n for n, _ in load_corpus()])
def test_corpus_answers_render_within_the_limit_with_nothing_lost(name: str, md: str) -> None:
    contents = answer_contents(md)
    check_contents(contents)
    shown = squeeze(visible("".join(c["formatted_body"] for c in contents)))
    body = squeeze("".join(c["body"] for c in contents)).replace(ZWSP, "")
    wanted = squeeze(source_text(md))
    assert is_subsequence(wanted, shown), name
    assert is_subsequence(wanted, body), name
    if name not in ("empty-code", "only-whitespace-code"):
        assert EMPTY_ANSWER not in shown


def test_headings_emphasis_code_and_links() -> None:
    md = "## Plan\n\n**bold**, *italic*, ***both***, ~~gone~~, `a < b` and [a link](https://example.com/a?b=1&c=2)."
    assert render(md) == (
        "<h2>Plan</h2>\n<p><strong>bold</strong>, <em>italic</em>, <em><strong>both</strong></em>, <del>gone</del>, "
        '<code>a &lt; b</code> and <a href="https://example.com/a?b=1&amp;c=2">a link</a>.</p>'
    )
    assert body_of(render(md)) == (
        "Plan\n\nbold, italic, both, gone, a < b and a link (https://example.com/a?b=1&c=2)."
    )
    assert body_of(render("<https://a.b/x> and <me@example.com>")) == "https://a.b/x and me@example.com"


def test_html_in_the_text_stays_text() -> None:
    md = "AT&T: 5 < 6 > 4, <b>bold?</b> <script>alert(1)</script> &amp; &lt;x&gt;"
    out = render(md)
    assert "<b>" not in out and "<script>" not in out
    assert visible(out) == "AT&T: 5 < 6 > 4, <b>bold?</b> <script>alert(1)</script> & <x>"
    assert_well_formed(out)


@pytest.mark.parametrize(
    ("md", "shown", "href"),
    [
        ("[a](javascript:alert(1))", "[a](javascript:alert(1))", None),  # not even a link to CommonMark
        ("[a](JaVaScRiPt:alert(1))", "[a](JaVaScRiPt:alert(1))", None),
        ("<javascript:alert(1)>", "<javascript:alert(1)>", None),
        ("[b](ftp://x.y/f)", "b (ftp://x.y/f)", None),
        ("[c](settings.html)", "c (settings.html)", None),
        ("[Alice](https://matrix.to/#/@alice:example.org)", "Alice (https://matrix.to/#/@alice:example.org)", None),
        ("![chart](https://x.io/c.png)", "🖼 chart", "https://x.io/c.png"),
        ('[q](https://a.b/"onclick=x)', "q", "https://a.b/%22onclick=x"),
        ("[m](mailto:a@b.c)", "m", "mailto:a@b.c"),
    ],
)
def test_only_http_and_mailto_urls_become_links(md: str, shown: str, href: str | None) -> None:
    out = render(md)
    assert_well_formed(out)
    assert visible(out) == shown
    assert re.findall(r'href="([^"]*)"', out) == ([href] if href else [])


def test_a_long_url_is_text_after_its_label() -> None:
    url = "https://example.com/" + "a" * 5000
    out = render(f"see [the page]({url}) now")
    assert "<a " not in out and visible(out) == f"see the page ({url}) now"
    contents = answer_contents(f"see [the page]({url}) now")
    check_contents(contents)
    assert squeeze(visible("".join(c["formatted_body"] for c in contents))) == squeeze(f"seethepage({url})now")


def test_blocks_lists_quotes_rules_and_their_plain_body() -> None:
    md = "# Plan\n\n- one\n- two\n  - nested\n\n3. three\n4. four\n\n> quoted\n>> deeper\n\n---\n\nend"
    out = render(md)
    assert out == (
        "<h1>Plan</h1>\n<ul>\n<li>one</li>\n<li>two\n<ul>\n<li>nested</li>\n</ul></li>\n</ul>\n"
        '<ol start="3">\n<li>three</li>\n<li>four</li>\n</ol>\n'
        "<blockquote>\n<p>quoted</p>\n<blockquote>\n<p>deeper</p>\n</blockquote>\n</blockquote>\n<hr>\n<p>end</p>"
    )
    assert body_of(out) == (
        "Plan\n\n• one\n• two\n  ◦ nested\n\n3. three\n4. four\n\n> quoted\n>\n> > deeper\n\n──────────\n\nend"
    )


def test_a_loose_list_and_a_line_break_in_a_paragraph() -> None:
    out = render("1. first\n\n   more\n2. second\n\nline one\nline two")
    assert "<li><p>first</p>\n<p>more</p></li>" in out and "<p>line one<br>line two</p>" in out
    assert body_of(out) == "1. first\n\n   more\n\n2. second\n\nline one\nline two"


def test_code_blocks_keep_their_language_and_content() -> None:
    md = "> Try:\n> ```sql\n> SELECT * FROM t WHERE a < 1 && b_c;\n> ```"
    out = render(md)
    assert '<pre><code class="language-sql">SELECT * FROM t WHERE a &lt; 1 &amp;&amp; b_c;</code></pre>' in out
    assert "SELECT * FROM t WHERE a < 1 && b_c;" in body_of(out)
    assert render('```"><script>\nx\n```') == "<pre><code>x</code></pre>"  # no odd language in the class
    assert render("```\n```") == "" and answer_parts("```\n```") == [EMPTY_ANSWER]


def test_tables_are_html_tables_with_aligned_columns_in_the_body() -> None:
    out = render("| a | bb |\n|---|:-:|\n| **1** | [x](https://a.b) & <y> |")
    assert out == (
        "<table>\n<thead>\n<tr><th>a</th><th>bb</th></tr>\n</thead>\n<tbody>\n"
        '<tr><td><strong>1</strong></td><td><a href="https://a.b">x</a> &amp; &lt;y&gt;</td></tr>\n</tbody>\n</table>'
    )
    assert body_of(out) == "a | bb\n--+-" + "-" * 21 + "\n1 | x (https://a.b) & <y>"


def test_room_pings_are_defused_and_user_ids_kept_to_copy() -> None:
    md = "Hi @room, @Room! and `@room` ```x``` me@room.org @roomy @alice:example.org [@room](https://a.b/@room)"
    for c in answer_contents(md):
        shown = html.unescape(re.sub(r"<[^>]*>", "", c["formatted_body"]))  # zero-width spaces kept
        assert not ROOM_PING.search(c["body"]) and not ROOM_PING.search(shown)
        assert "@alice:example.org" in c["body"] and "@alice:example.org" in c["formatted_body"]
        assert "<a" not in c["formatted_body"].split("@alice")[0][-40:]  # a typed id is not made a link (a pill)
        assert "me@room.org" in c["body"] and "@roomy" in c["body"]
        assert visible(c["formatted_body"]) == (
            "Hi @room, @Room! and @room x me@room.org @roomy @alice:example.org @room"
        )
    assert content("ping @room")["body"] == f"ping @{ZWSP}room"
    assert content("ping @room").serialize()["m.mentions"] == {}


def test_steps_are_folded_in_details_on_the_last_part() -> None:
    steps = [Step("manage_tasks", {"action": "list"}, True, "2 tasks <b> @room", 0.1)]
    [c] = answer_contents("Done.", steps, 1.3)
    assert c["formatted_body"] == (
        "<p>Done.</p>\n<details><summary>🔧 1 step · 1.3 s</summary>\n<ul>\n"
        f"<li>✅ manage_tasks list → 2 tasks &lt;b&gt; @{ZWSP}room</li>\n</ul>\n</details>"
    )
    assert c["body"] == f"Done.\n\n🔧 1 step · 1.3 s\n\n• ✅ manage_tasks list → 2 tasks <b> @{ZWSP}room"
    check_contents([c])


def test_steps_that_do_not_fit_the_last_part_are_a_message_of_their_own() -> None:
    steps = [Step(f"tool_{i}", {}, True, "x" * 30, 0.0) for i in range(20)]
    text = "y " * 450
    contents = answer_contents(text, steps, 2.0, limit=MATRIX_MIN_LIMIT)
    check_contents(contents, MATRIX_MIN_LIMIT)
    assert "<details>" not in contents[0]["formatted_body"]
    assert contents[-1]["formatted_body"].startswith("<details><summary>🔧 20 steps · 2.0 s</summary>")
    assert "… and 8 more" in contents[-1]["body"]
    assert steps_html(steps, 2.0).count("<li>") == 13


def test_a_long_code_block_is_split_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"x_{i} = '😀 <{i}> &' \"q\"" for i in range(700))
    contents = answer_contents(f"Intro\n\n```python\n{code}\n```\n\nThe end.")
    check_contents(contents)
    assert len(contents) >= 3
    middle = [c["formatted_body"] for c in contents[1:-1]]
    assert all(m.startswith('<pre><code class="language-python">') and m.endswith("</code></pre>") for m in middle)
    lines = "\n".join(c["body"] for c in contents).split("\n")
    assert all(f"x_{i} = '😀 <{i}> &' \"q\"" in lines for i in range(700))  # lines are not cut
    assert contents[0]["body"].startswith("Intro") and contents[-1]["body"].endswith("The end.")


def test_a_long_numbered_list_goes_on_at_its_number() -> None:
    md = "\n".join(f"{i}. item {i} **bold** & more" for i in range(1, 400))
    contents = answer_contents(md, limit=MATRIX_MIN_LIMIT)
    check_contents(contents, MATRIX_MIN_LIMIT)
    numbers = [int(m) for c in contents for m in re.findall(r"^(\d+)\. ", c["body"], re.MULTILINE)]
    assert numbers == list(range(1, 400))


def test_split_never_cuts_an_entity_or_a_character() -> None:
    family = "👩\u200d👩\u200d👧\u200d👦"
    markup = "<p>" + "&amp;" * 300 + family * 100 + "</p>"
    parts = split_html(markup, MATRIX_MIN_LIMIT)
    assert all(size(p) <= MATRIX_MIN_LIMIT and p.startswith("<p>") and p.endswith("</p>") for p in parts)
    assert "".join(p[3:-4] for p in parts) == markup[3:-4]
    assert all(not p[3:].startswith("\u200d") for p in parts)


@pytest.mark.parametrize("md", ["", "   ", "\n\n", "#", ">", "```\n\n```"])
def test_empty_answers_say_so(md: str) -> None:
    [c] = answer_contents(md)
    assert c["body"] == EMPTY_ANSWER


@pytest.mark.parametrize("char", ["😀", "\x01", '"', "&", "<"])
def test_a_full_part_of_the_widest_characters_fits_an_event(char: str) -> None:
    for c in answer_contents(char * 40_000):
        event = json.dumps(c.serialize(), ensure_ascii=False, separators=(",", ":")).encode()
        assert len(event) <= 65_536 - 1_000  # the PDU limit, with room for the event's other fields


def test_a_cut_before_an_at_room_that_followed_a_letter_defuses_it() -> None:
    for zeros in range(MATRIX_MIN_LIMIT - 30, MATRIX_MIN_LIMIT + 5):  # "0@room" pings nobody; "@room" alone would
        for c in answer_contents("0" * zeros + "@room and more", limit=MATRIX_MIN_LIMIT):
            shown = html.unescape(re.sub(r"<[^>]*>", "", c["formatted_body"]))
            assert not ROOM_PING.search(c["body"]) and not ROOM_PING.search(shown)
