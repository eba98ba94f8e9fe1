"""Markdown → Slack mrkdwn rendering and splitting: examples, the model-style corpus, pings and link tricks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from adapters.markdown import utf16_len
from adapters.slack.limits import SLACK_TEXT_LIMIT
from adapters.slack.render import ZWSP, plain, render, render_parts, safe_url, split, steps_line
from core import EMPTY_ANSWER

CORPUS = Path(__file__).resolve().parent.parent / "bench" / "markdown_corpus.txt"
_LINK = re.compile(r"<((?:https?://|mailto:)[^<>|\s]*)(?:\|([^<>]*))?>")
_ENTITY = re.compile(r"&(?:amp|lt|gt);")
_MARKERS = re.compile(r"[*_~`\u200b]")
_BROADCAST = re.compile(r"(?<!\w)@(?:channel|here|everyone|group)\b", re.IGNORECASE)
_MD = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


def unescape(text: str) -> str:
    """Slack's three entities back to their characters."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def visible(mrkdwn: str) -> str:
    """What a reader sees of mrkdwn: links as their labels (or URLs), formatting markers and zero-width spaces
    dropped, entities decoded."""
    text = _LINK.sub(lambda m: m[2] if m[2] is not None else m[1], mrkdwn)
    return unescape(_MARKERS.sub("", text))


def squeeze(text: str) -> str:
    """Text without whitespace, formatting markers, zero-width spaces or the quote marks a rendering adds."""
    return re.sub(r"[\s*_~`>\u200b]+", "", text)


def assert_safe(mrkdwn: str) -> None:
    """The only `<…>` are links made by the renderer, every `&` starts an entity, no raw `>` outside quote marks."""
    rest = _LINK.sub("", mrkdwn)
    assert "<" not in rest, mrkdwn
    lines = [re.sub(r"^>( |$)", "", line) for line in rest.split("\n")]
    assert all(">" not in line for line in lines), mrkdwn
    assert "&" not in _ENTITY.sub("", mrkdwn), mrkdwn
    for m in _LINK.finditer(mrkdwn):
        assert not re.search(r"[|\s<>]", m[1]) and "&" not in _ENTITY.sub("", m[1])


def is_subsequence(small: str, big: str) -> bool:
    """Whether every character of `small` appears in `big`, in order."""
    it = iter(big)
    return all(ch in it for ch in small)


def source_text(md: str) -> str:
    """The text of a Markdown answer a reader should see: its text, code and image descriptions (no link targets)."""
    out: list[str] = []

    def walk(tokens: list[Token]) -> None:
        for t in tokens:
            if t.type in ("text", "code_inline", "fence", "code_block"):
                out.append(t.content)
            elif t.type == "image":
                out.append(t.content)
                continue
            if t.children:
                walk(t.children)

    walk(_MD.parse(md))
    return "".join(out)


def load_corpus() -> list[tuple[str, str]]:
    """(name, answer) pairs of bench/markdown_corpus.txt, plus long answers built from it."""
    items: list[tuple[str, str]] = []
    for chunk in CORPUS.read_text(encoding="utf-8").split("%%% ")[1:]:
        name, _, body = chunk.partition("\n")
        items.append((name.strip(), body.rstrip("\n")))
    everything = "\n\n".join(body for _, body in items)
    code = "\n".join(f"print('line {i} 😀 <tag> & more @here')" for i in range(400))
    items += [
        ("long-all-x3", "\n\n".join([everything] * 3)),
        ("long-code", f"Here you go:\n\n```python\n{code}\n```\n\nThe end."),
        ("long-no-spaces", "x" * 3000 + "😀" * 2000 + "&" * 3000),
        ("long-bold-lines", "\n".join(f"**Line {i}** with *emphasis* & <angles> 👍🏽" for i in range(400))),
        ("long-links", " ".join(f"[link {i}](https://example.com/{i}?a=1&b=2)" for i in range(300))),
    ]
    return items


@pytest.mark.parametrize(("name", "md"), load_corpus(), ids=[n for n, _ in load_corpus()])
def test_corpus_answers_render_safely_within_the_limit_with_nothing_lost(name: str, md: str) -> None:
    parts = render_parts(md)
    assert parts and all(p.strip() for p in parts)
    assert all(utf16_len(p) <= SLACK_TEXT_LIMIT for p in parts), [utf16_len(p) for p in parts]
    for p in parts:
        assert_safe(p)
        assert p.count("```") % 2 == 0, p  # a code block cut by a split is closed in its part
    shown = squeeze(visible("".join(parts)))
    assert is_subsequence(squeeze(source_text(md)), shown), name
    if name not in ("empty-code", "only-whitespace-code"):
        assert EMPTY_ANSWER not in shown


def test_inline_formatting_becomes_mrkdwn() -> None:
    md = "**bold**, *italic*, ***both***, ~~gone~~, `code` and [a link](https://example.com/a?b=1&c=2)."
    assert render(md) == ("*bold*, _italic_, _*both*_, ~gone~, `code` and <https://example.com/a?b=1&amp;c=2|a link>.")


def test_slack_control_characters_are_escaped_and_html_stays_text() -> None:
    md = "AT&T: 5 < 6 > 4, <b>bold?</b> &amp; &lt;x&gt;"
    out = render(md)
    assert out == "AT&amp;T: 5 &lt; 6 &gt; 4, &lt;b&gt;bold?&lt;/b&gt; &amp; &lt;x&gt;"
    assert visible(out) == "AT&T: 5 < 6 > 4, <b>bold?</b> & <x>"


@pytest.mark.parametrize(
    "md",
    [
        "<!channel> <!here> <!everyone> <@U123> <#C123> <!subteam^S123|devs> <!date^1^{date}|x>",
        "`<!channel>` and\n\n```\n<@U1> <!here|here>\n```",
        "[<!channel>](https://example.com) [x](https://a.b/<!here>) ![<@U1>](https://a.b/i.png)",
        "&lt;!channel&gt; &#60;@U1&#62; \\<!here\\>",
        "| <!channel> | <@U1> |\n|---|---|\n| <#C1> | x |",
        "> <!everyone>\n- <!here>",
    ],
)
def test_no_text_can_ping(md: str) -> None:
    out = render(md)
    assert "<!" not in out and "<@" not in out and "<#" not in out
    assert_safe(out)


def test_typed_broadcast_words_cannot_become_mentions() -> None:
    out = render("Hi @channel, @Here and @everyone (and @group)! Mail me@here.com about @hereafter.")
    assert not _BROADCAST.search(out)
    assert f"@{ZWSP}channel" in out and "me@here.com" in out and "@hereafter" in out
    assert visible(out) == "Hi @channel, @Here and @everyone (and @group)! Mail me@here.com about @hereafter."
    assert plain("@here <!channel> & *x*") == f"@{ZWSP}here &lt;!channel&gt; &amp; *x*"
    assert steps_line("🔧 2 steps · 1.3 s <@U1>") == "🔧 2 steps · 1.3 s &lt;@U1&gt;"


@pytest.mark.parametrize(
    ("href", "url"),
    [
        ("https://evil.com/x|<!channel>", "https://evil.com/x%7C%3C!channel%3E"),
        ("https://a.b/c d>e", "https://a.b/c%20d%3Ee"),
        ("https://a.b/?x=1&y=2", "https://a.b/?x=1&amp;y=2"),
        ("https://a.b/ü\n", "https://a.b/%C3%BC%0A"),
        ("javascript:alert(1)", None),
        ("ftp://a.b", None),
    ],
)
def test_link_urls_cannot_end_or_split_the_link(href: str, url: str | None) -> None:
    assert safe_url(href) == url


def test_link_tricks_stay_inside_their_link() -> None:
    out = render("[click](https://evil.com/x|<!channel>) [a](javascript:alert(1)) [b](ftp://x) [c](settings.html)")
    assert out == ("<https://evil.com/x%7C%3C!channel%3E|click> [a](javascript:alert(1)) b (ftp://x) c (settings.html)")
    assert_safe(out)
    assert render("[label > with | bars](https://a.b)") == "<https://a.b|label &gt; with | bars>"
    assert render("[**bold** `code`](https://a.b)") == "<https://a.b|bold code>"
    assert render("<https://a.b/x> and <me@example.com>") == (
        "<https://a.b/x|https://a.b/x> and <mailto:me@example.com|me@example.com>"
    )
    assert render("![chart](https://x.io/c.png)") == "<https://x.io/c.png|🖼 chart>"


def test_blocks_headings_lists_quotes_rules() -> None:
    md = "# Plan\n\n- one\n- two\n  - nested\n\n3. three\n4. four\n\n> quoted\n>> deeper\n\n---\n\nend"
    assert render(md) == (
        "*Plan*\n\n• one\n• two\n    ◦ nested\n\n3. three\n4. four\n\n> quoted\n> deeper\n\n──────────\n\nend"
    )


def test_quotes_inside_lists_keep_their_mark_at_the_start_of_the_line() -> None:
    assert render("- > quoted\n  > more") == "> • quoted\n> more"
    assert render("> - a\n>   > b") == "> • a\n> b"
    assert render("1. > q\n2. x") == "> 1. q\n2. x"
    for md in ("- > quoted", "> - a\n>   > b", "1. > q", "- - > x", "> > - > x"):
        assert_safe(render(md))


def test_code_blocks_drop_the_language_keep_the_content_and_leave_quotes() -> None:
    md = "> Try:\n> ```sql\n> SELECT * FROM t WHERE a < 1 && b_c;\n> ```\n> then *tell* me."
    assert render(md) == "> Try:\n```\nSELECT * FROM t WHERE a &lt; 1 &amp;&amp; b_c;\n```\n> then _tell_ me."
    assert render("```\n```") == "" and render_parts("```\n```") == [EMPTY_ANSWER]
    assert render("````\nx ``` y\n````") == f"```\nx ``{ZWSP}` y\n```"  # Slack's code cannot hold ```


def test_inline_code_with_backticks_and_markup() -> None:
    assert render("Run `a **b** <c> & @here`") == "Run `a **b** &lt;c&gt; &amp; @here`"
    assert render("``a ` b``") == "```a ` b```"
    assert render("`` `x` ``") == f"```{ZWSP}`x`{ZWSP}```"


def test_table_is_an_aligned_code_block() -> None:
    out = render("| a | bb |\n|---|---|\n| **1** | [x](https://a.b) & <y> |")
    assert out == "```\na | bb\n--+--------\n1 | x &amp; &lt;y&gt;\n```"


def test_formatting_is_per_line_and_works_inside_words() -> None:
    assert render("**a\nb** and *c\nd*") == "*a*\n*b* and _c_\n_d_"
    assert render("Un*frigging*believable") == f"Un{ZWSP}_frigging_{ZWSP}believable"
    assert render("snake_case_names and 2 * 3") == "snake_case_names and 2 * 3"
    assert render("**bold *and italic* bold**") == "*bold _and italic_ bold*"
    assert render("*it **bold *it* bold** it*") == "_it *bold it bold* it_"  # no marker nested in itself


def test_split_closes_and_reopens_a_cut_code_block() -> None:
    code = "\n".join(f"x_{i} = '😀 <{i}> &'" for i in range(700))
    parts = render_parts(f"Intro\n\n```python\n{code}\n```\n\nThe end.")
    assert len(parts) >= 3
    assert all(utf16_len(p) <= SLACK_TEXT_LIMIT and p.count("```") % 2 == 0 for p in parts)
    assert all(p.startswith("```\n") and p.endswith("\n```") for p in parts[1:-1])
    lines = "\n".join(parts).split("\n")
    assert all(f"x_{i} = '😀 &lt;{i}&gt; &amp;'" in lines for i in range(700))  # lines are not cut
    assert parts[0].startswith("Intro") and parts[-1].endswith("The end.")


def test_split_never_cuts_an_entity_a_link_or_a_character() -> None:
    parts = split("&amp;" * 100, 16)
    assert all(utf16_len(p) <= 16 and _ENTITY.sub("", p) == "" for p in parts)
    assert "".join(parts) == "&amp;" * 100
    links = " ".join(f"<https://a.b/{i}|link {i}>" for i in range(100))
    parts = split(links, 60)
    assert all(utf16_len(p) <= 60 for p in parts)
    assert [m[0] for p in parts for m in _LINK.finditer(p)] == [m[0] for m in _LINK.finditer(links)]
    family = "👩\u200d👩\u200d👧\u200d👦"
    parts = split("a" * 10 + family * 3, 20)
    assert "".join(parts) == "a" * 10 + family * 3 and all(utf16_len(p) <= 20 for p in parts)
    assert all(not p.startswith("\u200d") for p in parts)


def test_a_link_longer_than_a_part_becomes_text() -> None:
    url = "https://example.com/" + "a" * 5000
    parts = render_parts(f"see [the page]({url}) now")
    assert all(utf16_len(p) <= SLACK_TEXT_LIMIT for p in parts)
    assert "<" not in "".join(parts)
    assert squeeze("".join(parts)) == squeeze(f"see the page ({url}) now")


@pytest.mark.parametrize("md", ["", "   ", "\n\n", "#", ">", "```\n\n```"])
def test_empty_answers_say_so(md: str) -> None:
    assert render_parts(md) == [EMPTY_ANSWER]


def test_split_of_blank_text_still_gives_a_part_and_short_text_stays_whole() -> None:
    assert split("") == ["…"] and split("``````") == ["…"]
    assert split("*hi* <https://a.b|x>") == ["*hi* <https://a.b|x>"]
    assert SLACK_TEXT_LIMIT <= 3000  # a part fits a section block's mrkdwn text
