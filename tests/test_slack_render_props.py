"""Property tests of the Slack renderer: any text renders without error into parts within the limit that ping nobody
and show all of the answer's text in order, code kept verbatim."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.markdown import utf16_len
from adapters.slack.limits import SLACK_TEXT_LIMIT
from adapters.slack.render import ZWSP, esc, render, render_parts, split
from tests.test_slack_render import _BROADCAST, assert_safe, is_subsequence, source_text, squeeze, visible

PROPS = settings(
    max_examples=50,
    deadline=None,  # the machine is shared; the bound that matters is the whole file's few seconds
    derandomize=True,  # the same examples on every run, so CI is deterministic
    database=None,  # and no examples carried over from earlier runs
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass(frozen=True)
class Md:
    """Generated Markdown, the text a reader should see (renderer decorations included) and its code."""

    source: str
    visible: str
    code: tuple[str, ...] = ()  # what must appear verbatim in the mrkdwn (`code` spans and ``` blocks, escaped)


# words carry no Markdown syntax of their own; the literal pieces must show as written and ping nobody
_WORDS = ["alpha", "Beta", "x1", "你好", "مرحبا", "שלום", "😀", "𝔸𝔹", "👍🏽", "👩\u200d👩\u200d👧", "🇩🇪", "naïve", "é"]
_LITERALS = [
    ("<b>", "<b>"),
    ("<script>alert(1)</script>", "<script>alert(1)</script>"),
    ("a<b", "a<b"),
    ("AT&T", "AT&T"),
    ("&amp;", "&"),
    ("&lt;!channel&gt;", "<!channel>"),
    ("5 > 4", "5 > 4"),
    ("a|b", "a|b"),
    ("<!channel>", "<!channel>"),
    ("<!here|here>", "<!here|here>"),
    ("<@U123>", "<@U123>"),
    ("<#C123|general>", "<#C123|general>"),
    ("<!subteam^S1>", "<!subteam^S1>"),
    ("@channel", "@channel"),
    ("@here", "@here"),
    ("@Everyone!", "@Everyone!"),
    ("nul\x00byte", "nul\ufffdbyte"),  # CommonMark reads NUL as U+FFFD
]
_URLS = [
    "https://example.com/a?b=1&c=2",
    "https://en.wikipedia.org/wiki/Foo_(bar)",
    "mailto:a@b.c",
    "https://evil.com/x|<!channel>",
    "https://a.b/<@U1>>",
]
_CODE_CHARS = st.sampled_from([*list("ab xy_*[]()<>&;#|~=+-\\'\"@!"), "😀", "你", "\t", "𝔸", "\x00"])

word = st.sampled_from(_WORDS)
words = st.lists(word, min_size=1, max_size=4).map(" ".join)


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
        kept = code.replace("\x00", "\ufffd")  # CommonMark reads NUL as U+FFFD
        return Md(f"`{code}`", kept, (f"`{esc(kept)}`",))
    text = draw(words) if kind != "word" else draw(word)
    marker = {"word": "", "bold": "**", "italic": "*", "bold-italic": "***", "strike": "~~"}[kind]
    return Md(f"{marker}{text}{marker}", text)


def _concat(first: str, pieces: list[Md], seps: list[str]) -> Md:
    """A first word and pieces joined by the separators."""
    src = first + "".join(s + p.source for s, p in zip(seps, pieces, strict=True))
    shown = first + "".join(s + p.visible for s, p in zip(seps, pieces, strict=True))
    return Md(src, shown, tuple(c for p in pieces for c in p.code))


@st.composite
def paragraph(draw: st.DrawFn) -> Md:
    """A paragraph (possibly over several lines) that starts with a plain word."""
    pieces = draw(st.lists(inline_piece(), max_size=8))
    return _concat(draw(word), pieces, [draw(st.sampled_from([" ", " ", " ", "\n"])) for _ in pieces])


def one_line(p: Md) -> bool:
    """Whether a paragraph's source is one line."""
    return "\n" not in p.source


@st.composite
def block(draw: st.DrawFn) -> Md:
    """One block: paragraph, heading, quote, list, table, code fence or rule."""
    kinds = ["para", "para", "heading", "quote", "bullets", "numbers", "nested", "table", "fence", "rule"]
    kind = draw(st.sampled_from(kinds))
    if kind == "para":
        return draw(paragraph())
    if kind == "nested":
        outer, inner = draw(words), draw(st.lists(words, min_size=1, max_size=3))
        return Md(
            f"- {outer}\n" + "\n".join(f"  - {w}" for w in inner), f"• {outer}\n" + "\n".join(f"◦ {w}" for w in inner)
        )
    if kind == "table":
        cols = draw(st.integers(1, 3))
        rows = draw(st.lists(st.lists(words, min_size=cols, max_size=cols), min_size=2, max_size=4))
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        lines.insert(1, "|" + "---|" * cols)
        return Md("\n".join(lines), "\n".join(" ".join(r) for r in rows))  # compared without | - + (the grid)
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
        marks = [("- ", "• ") if kind == "bullets" else (f"{start + i}. ", f"{start + i}. ") for i in range(len(items))]
        return Md(
            "\n".join(m[0] + p.source for m, p in zip(marks, items, strict=True)),
            "\n".join(m[1] + p.visible for m, p in zip(marks, items, strict=True)),
            tuple(c for p in items for c in p.code),
        )
    if kind == "fence":
        chars = st.one_of(_CODE_CHARS, st.just("`"))
        lines = draw(st.lists(st.text(chars, max_size=30).filter(lambda s: "````" not in s), min_size=1, max_size=8))
        code = "\n".join(lines).rstrip("\n")
        if not code.strip():
            code = "pass"
        kept = code.replace("\x00", "\ufffd")
        shown = f"```\n{esc(re.sub(r'``(?=`)', '``' + ZWSP, kept))}\n```"
        return Md(f"````{draw(st.sampled_from(['', 'python', 'c++']))}\n{code}\n````", kept, (shown,))
    return Md("---", "──────────")


def join(blocks: list[Md]) -> Md:
    """Blocks as one answer; a paragraph between two lists keeps CommonMark from merging them."""
    out: list[Md] = []
    for b in blocks:
        if out and _is_list(out[-1]) and _is_list(b):
            out.append(Md("alpha", "alpha"))
        out.append(b)
    return Md(
        "\n\n".join(b.source for b in out), "\n\n".join(b.visible for b in out), tuple(c for b in out for c in b.code)
    )


def _is_list(md: Md) -> bool:
    """Whether a block is a list (it starts with a list marker)."""
    return re.match(r"- |\d+\. ", md.source) is not None


answers = st.lists(block(), min_size=1, max_size=8).map(join)


def grid_free(text: str) -> str:
    """squeeze() without the characters a table's grid is drawn with either."""
    return re.sub(r"[|+\-]", "", squeeze(text))


def check_parts(parts: list[str], limit: int) -> None:
    """Parts are non-empty, within the limit, safe, and keep every code block closed within the part."""
    assert parts
    for p in parts:
        assert p.strip() and utf16_len(p) <= limit, (utf16_len(p), limit)
        assert_safe(p)
        assert "<!" not in p and "<@" not in p and "<#" not in p


@PROPS
@given(answers)
def test_an_answer_renders_with_all_its_text_code_verbatim_and_no_ping(md: Md) -> None:
    out = render(md.source)
    assert grid_free(visible(out)) == grid_free(md.visible)
    for code in md.code:
        assert code in out, (code, out)
    assert not _BROADCAST.search(out)
    parts = render_parts(md.source)
    check_parts(parts, SLACK_TEXT_LIMIT)
    assert grid_free(visible("".join(parts))) == grid_free(md.visible)


@PROPS
@given(answers, st.integers(min_value=16, max_value=400))
def test_split_at_any_limit_keeps_parts_valid_code_closed_and_the_text_in_order(md: Md, limit: int) -> None:
    parts = render_parts(md.source, limit)
    check_parts(parts, limit)
    assert all(p.count("```") % 2 == 0 for p in parts)  # code stays code: a cut block is closed and reopened
    assert is_subsequence(grid_free(md.visible), grid_free(visible("".join(parts))))


_SOUP = st.lists(
    st.one_of(
        st.sampled_from(
            [
                *"*_`[]()|~#>-+=:! \n\t<>&;/.1ab",
                "https://x.y",
                "&amp;",
                "<!channel>",
                "<@U1>",
                "<#C1>",
                "<!subteam^S1|x>",
                "@channel",
                "@here",
                "```",
                "\x00",
                "😀",
                "👩\u200d👧",
                "مرحبا",
                "\u0301",
                "](https://a.b/|<!here>)",
                "\n- > ",
                "\n> - ",
                "\n1. > ",
            ]
        ),
        st.text(max_size=8),  # anything at all, controls and astral characters included
    ),
    max_size=80,
).map("".join)


@PROPS
@given(_SOUP, st.integers(min_value=16, max_value=300))
def test_any_text_at_all_renders_to_safe_parts_with_nothing_lost(text: str, limit: int) -> None:
    shown = grid_free(source_text(text))
    for parts, bound in ((render_parts(text), SLACK_TEXT_LIMIT), (split(render(text), limit), limit)):
        check_parts(parts, bound)
        assert is_subsequence(shown, grid_free(visible("".join(parts))))


@settings(PROPS, max_examples=15)
@given(st.text(st.sampled_from([*"ab_*&<>|`", "😀", "\u200d"]), min_size=200, max_size=4000), st.integers(16, 3000))
def test_very_long_lines_and_words_split_within_the_limit(text: str, limit: int) -> None:
    for md in (text, f"```\n{text}\n```", f"[{text[:50]}](https://a.b/{text})"):
        parts = render_parts(md, limit)
        check_parts(parts, limit)
        assert is_subsequence(grid_free(source_text(md)), grid_free(visible("".join(parts))))
