"""Property tests of the Matrix renderer: any text renders without error into messages within the limit, HTML
well-formed with the spec's tags only, pinging nobody, showing all of the answer's text in order (in formatted_body
and in the plain body), code kept verbatim; and the "nothing lost" check catches a renderer that loses text."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

from hypothesis import find, given, settings
from hypothesis import strategies as st

from adapters.matrix.limits import MATRIX_MIN_LIMIT, MATRIX_TEXT_LIMIT
from adapters.matrix.render import ZWSP, answer_contents, render
from core import Step
from tests.test_matrix_render import ROOM_PING, check_contents, squeeze, visible
from tests.test_slack_render import is_subsequence, source_text
from tests.test_slack_render_props import PROPS, Md, _concat, join, one_line, word, words

# Md, the words and how blocks join are the Slack properties' (Md.visible: the text of the HTML, Md.code: what
# formatted_body holds verbatim); the literal pieces must show as written and ping nobody
_LITERALS = [
    ("<b>", "<b>"),
    ("<script>alert(1)</script>", "<script>alert(1)</script>"),
    ("<a href='javascript:x'>y</a>", "<a href='javascript:x'>y</a>"),
    ("a<b", "a<b"),
    ("AT&T", "AT&T"),
    ("&amp;", "&"),
    ("&lt;b&gt;", "<b>"),
    ("&quot;", '"'),
    ("5 > 4", "5 > 4"),
    ("@room", "@room"),
    ("@ROOM!", "@ROOM!"),
    ("@alice:example.org", "@alice:example.org"),
    ('"quoted" \\ back', '"quoted" \\ back'),
    ("nul\x00byte", "nul\ufffdbyte"),  # CommonMark reads NUL as U+FFFD
]
_URLS = [
    "https://example.com/a?b=1&c=2",
    "https://en.wikipedia.org/wiki/Foo_(bar)",
    "mailto:a@b.c",
    "https://evil.com/x\"onmouseover='alert(1)'",
    "https://a.b/@room",
]
_CODE_CHARS = st.sampled_from([*list("ab xy_*[]()<>&;#|~=+-\\'\"@!"), "😀", "你", "\t", "𝔸", "\x00"])


def _code_html(code: str) -> str:
    """Code as formatted_body holds it: escaped, "@room" defused."""
    return html.escape(re.sub(r"(?<!\w)@(?=room(?!\w))", "@" + ZWSP, code, flags=re.IGNORECASE), quote=False)


@st.composite
def inline_piece(draw: st.DrawFn) -> Md:
    """One inline element: a word, a literal, emphasis, a link or a code span."""
    kind = draw(
        st.sampled_from(["word", "literal", "literal", "bold", "italic", "bold-italic", "strike", "link", "code"])
    )
    if kind == "literal":
        src, shown = draw(st.sampled_from(_LITERALS))
        return Md(src, shown)
    if kind == "link":
        text = draw(words)
        return Md(f"[{text}]({draw(st.sampled_from(_URLS))})", text)
    if kind == "code":
        code = draw(st.text(_CODE_CHARS, min_size=1, max_size=12).filter(lambda c: c.strip() == c and c.strip()))
        code += draw(st.sampled_from(["", "", "@room", " @Room"]))  # a ping form is defused in code too
        kept = code.replace("\x00", "\ufffd")  # CommonMark reads NUL as U+FFFD
        return Md(f"`{code}`", kept, (f"<code>{_code_html(kept)}</code>",))
    text = draw(words) if kind != "word" else draw(word)
    marker = {"word": "", "bold": "**", "italic": "*", "bold-italic": "***", "strike": "~~"}[kind]
    return Md(f"{marker}{text}{marker}", text)


@st.composite
def paragraph(draw: st.DrawFn) -> Md:
    """A paragraph (possibly over several lines) that starts with a plain word."""
    pieces = draw(st.lists(inline_piece(), max_size=8))
    return _concat(draw(word), pieces, [draw(st.sampled_from([" ", " ", " ", "\n"])) for _ in pieces])


@st.composite
def block(draw: st.DrawFn) -> Md:
    """One block: paragraph, heading, quote, list, table, code fence or rule."""
    kinds = ["para", "para", "heading", "quote", "bullets", "numbers", "nested", "table", "fence", "rule"]
    kind = draw(st.sampled_from(kinds))
    if kind == "para":
        return draw(paragraph())
    if kind == "nested":
        outer, inner = draw(words), draw(st.lists(words, min_size=1, max_size=3))
        return Md(f"- {outer}\n" + "\n".join(f"  - {w}" for w in inner), outer + " " + " ".join(inner))
    if kind == "table":
        cols = draw(st.integers(1, 3))
        rows = draw(st.lists(st.lists(words, min_size=cols, max_size=cols), min_size=2, max_size=4))
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        lines.insert(1, "|" + "---|" * cols)
        return Md("\n".join(lines), "\n".join(" ".join(r) for r in rows))
    if kind == "heading":
        p = draw(paragraph().filter(one_line))
        return Md(f"{'#' * draw(st.integers(1, 6))} {p.source}", p.visible, p.code)
    if kind == "quote":
        p = draw(paragraph())
        prefix = draw(st.sampled_from(["> ", ">> "]))
        return Md("\n".join(prefix + line for line in p.source.split("\n")), p.visible, p.code)
    if kind in ("bullets", "numbers"):
        items = draw(st.lists(paragraph().filter(one_line), min_size=1, max_size=4))
        start = draw(st.integers(1, 12))
        marks = ["- " if kind == "bullets" else f"{start + i}. " for i in range(len(items))]
        return Md(
            "\n".join(m + p.source for m, p in zip(marks, items, strict=True)),
            "\n".join(p.visible for p in items),
            tuple(c for p in items for c in p.code),
        )
    if kind == "fence":
        chars = st.one_of(_CODE_CHARS, st.just("`"))
        lines = draw(st.lists(st.text(chars, max_size=30).filter(lambda s: "````" not in s), min_size=1, max_size=8))
        code = "\n".join(lines).rstrip("\n")
        if not code.strip():
            code = "pass"
        kept = code.replace("\x00", "\ufffd")
        lang = draw(st.sampled_from(["", "python", "c++"]))
        attr = f' class="language-{lang}"' if lang else ""
        return Md(f"````{lang}\n{code}\n````", kept, (f"<pre><code{attr}>{_code_html(kept)}</code></pre>",))
    return Md("---", "")


answers = st.lists(block(), min_size=1, max_size=8).map(join)


def shown_html(contents: list[Any]) -> str:
    """The visible text of all the messages' formatted_body."""
    return "".join(visible(c["formatted_body"]) for c in contents)


def shown_body(contents: list[Any]) -> str:
    """All the messages' plain body, zero-width spaces dropped."""
    return "".join(c["body"] for c in contents).replace(ZWSP, "")


def nothing_lost(md: Md, markup: str) -> bool:
    """Whether the HTML shows exactly the answer's text (whitespace aside) and holds its code verbatim."""
    return squeeze(visible(markup)) == squeeze(md.visible) and all(code in markup for code in md.code)


@PROPS
@given(answers)
def test_an_answer_renders_with_all_its_text_code_verbatim_and_no_ping(md: Md) -> None:
    out = render(md.source)
    assert nothing_lost(md, out), (out, md.visible)
    assert not ROOM_PING.search(html.unescape(re.sub(r"<[^>]*>", "", out)))
    contents = answer_contents(md.source)
    check_contents(contents)
    assert squeeze(shown_html(contents)) == squeeze(md.visible)
    assert is_subsequence(squeeze(md.visible), squeeze(shown_body(contents)))


@PROPS
@given(answers, st.integers(min_value=MATRIX_MIN_LIMIT, max_value=3 * MATRIX_MIN_LIMIT), st.integers(1, 4))
def test_split_at_any_limit_keeps_messages_valid_and_the_text_in_order(md: Md, limit: int, copies: int) -> None:
    long = join([md] * copies * 3)
    steps = [Step("remember", {}, True, "saved 😀 <x> & @room", 0.2)] * copies
    contents = answer_contents(long.source, steps, 1.5, limit)
    check_contents(contents, limit)
    assert is_subsequence(squeeze(long.visible), squeeze(shown_html(contents)))
    assert is_subsequence(squeeze(long.visible), squeeze(shown_body(contents)))
    assert "<details><summary>🔧" in "".join(c["formatted_body"] for c in contents)


_SOUP = st.lists(
    st.one_of(
        st.sampled_from(
            [
                *'*_`[]()|~#>-+=:! \n\t<>&;/.1ab"\\',
                "https://x.y",
                "javascript:",
                "&amp;",
                "&#60;",
                "<b>",
                "</p>",
                "@room",
                "@alice:x.y",
                "```",
                "\x00",
                "😀",
                "👩\u200d👧",
                "مرحبا",
                "\u0301",
                "](https://a.b/@room)",
                "\n- > ",
                "\n> - ",
                "\n1. > ",
                "\n| a | b |\n|---|---|\n",
            ]
        ),
        st.text(max_size=8),  # anything at all, controls and astral characters included
    ),
    max_size=80,
).map("".join)


@PROPS
@given(_SOUP, st.integers(min_value=MATRIX_MIN_LIMIT, max_value=2 * MATRIX_MIN_LIMIT))
def test_any_text_at_all_renders_to_safe_messages_with_nothing_lost(text: str, limit: int) -> None:
    wanted = squeeze(source_text(text))
    for contents, bound in (
        (answer_contents(text), MATRIX_TEXT_LIMIT),
        (answer_contents(text * 20, limit=limit), limit),
    ):
        check_contents(contents, bound)
    contents = answer_contents(text)
    assert is_subsequence(wanted, squeeze(shown_html(contents)))
    assert is_subsequence(wanted, squeeze(shown_body(contents)))


@settings(PROPS, max_examples=15)
@given(
    st.text(st.sampled_from([*'ab_*&<>|`"\n', "😀", "\u200d", "\x01"]), min_size=500, max_size=6000),
    st.integers(MATRIX_MIN_LIMIT, 3000),
)
def test_very_long_lines_and_words_split_within_the_limit(text: str, limit: int) -> None:
    for md in (text, f"```\n{text}\n```", f"[{text[:50]}](https://a.b/{text[:300]})", f"- {text}\n- {text}"):
        contents = answer_contents(md, limit=limit)
        check_contents(contents, limit)
        wanted = squeeze(source_text(md))
        assert is_subsequence(wanted, squeeze(shown_html(contents)))
        assert is_subsequence(wanted, squeeze(shown_body(contents)))


def _lossy(drop: Callable[[str], str]) -> Callable[[Md], bool]:
    """Whether nothing_lost() notices that a renderer which drops something from the HTML lost text."""
    return lambda md: not nothing_lost(md, drop(render(md.source)))


def test_the_nothing_lost_check_catches_a_lossy_renderer() -> None:
    quiet = settings(PROPS, max_examples=200)
    # a renderer that drops the last character of every text run, and one that drops code blocks
    find(answers, _lossy(lambda out: re.sub(r"[^<>\s](?=<)", "", out)), settings=quiet)
    find(answers, _lossy(lambda out: re.sub(r"<pre>.*?</pre>", "", out, flags=re.DOTALL)), settings=quiet)
