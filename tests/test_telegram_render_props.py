"""Property tests of the Telegram renderer: generated Markdown always becomes parts the Bot API accepts,
within the limit, with all the text visible in order."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.markdown import utf16_len
from adapters.telegram.limits import TELEGRAM_MESSAGE_LIMIT
from adapters.telegram.render import markdown_to_html, render_reply, split_html, split_plain
from core.types import Step
from tests.fake_telegram import parse_html

PROPS = settings(
    max_examples=60,
    deadline=None,  # the machine is shared; the bound that matters is the whole file's few seconds
    derandomize=True,  # the same examples on every run, so CI is deterministic
    database=None,  # and no examples carried over from earlier runs
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@dataclass(frozen=True)
class Md:
    """Generated Markdown and the text a reader should see (renderer decorations included)."""

    source: str
    visible: str


# words carry no Markdown syntax of their own; the literal HTML and `&` pieces must show as written
_WORDS = [
    "alpha",
    "Beta",
    "x1",
    "你好",
    "世界",
    "مرحبا",
    "😀",
    "𝔸𝔹",
    "👍🏽",
    "👩\u200d👩\u200d👧",
    "🇩🇪",
    "ü",
    "naïve",
    "é",
]
_LITERALS = [
    ("<b>", "<b>"),
    ("</i>", "</i>"),
    ("<br>", "<br>"),
    ("<script>alert(1)</script>", "<script>alert(1)</script>"),
    ("a<b", "a<b"),
    ("AT&T", "AT&T"),
    ("&", "&"),
    ("&amp;", "&"),
    ("&lt;tag&gt;", "<tag>"),
    ("5 > 4", "5 > 4"),
]
_URLS = ["https://example.com/a?b=1&c=2", "https://en.wikipedia.org/wiki/Foo_(bar)", "tg://user?id=5", "mailto:a@b.c"]
_CODE_CHARS = st.sampled_from([*list("ab xy_*[]()<>&;#|~=+-\\'\""), "😀", "你", "\t", "𝔸"])

word = st.sampled_from(_WORDS)
words = st.lists(word, min_size=1, max_size=4).map(" ".join)


@st.composite
def inline_piece(draw: st.DrawFn) -> Md:
    """One inline element: a word, literal HTML, emphasis, a link or a code span."""
    kind = draw(
        st.sampled_from(["word", "literal", "bold", "italic", "bold-italic", "strike", "spoiler", "link", "code"])
    )
    if kind == "literal":
        src, shown = draw(st.sampled_from(_LITERALS))
        return Md(src, shown)
    if kind == "link":
        text = draw(words)
        return Md(f"[{text}]({draw(st.sampled_from(_URLS))})", text)
    if kind == "code":
        code = draw(st.text(_CODE_CHARS, min_size=1, max_size=12).filter(lambda c: c.strip() == c and c.strip()))
        return Md(f"`{code}`", code)
    text = draw(words) if kind != "word" else draw(word)
    marker = {"word": "", "bold": "**", "italic": "*", "bold-italic": "***", "strike": "~~", "spoiler": "||"}[kind]
    return Md(f"{marker}{text}{marker}", text)


@st.composite
def paragraph(draw: st.DrawFn) -> Md:
    """A paragraph (possibly over several lines) that starts with a plain word."""
    first = draw(word)
    pieces = draw(st.lists(inline_piece(), max_size=8))
    seps = [draw(st.sampled_from([" ", " ", " ", "\n"])) for _ in pieces]
    src = first + "".join(s + p.source for s, p in zip(seps, pieces, strict=True))
    shown = first + "".join(s + p.visible for s, p in zip(seps, pieces, strict=True))
    return Md(src, shown)


@st.composite
def block(draw: st.DrawFn) -> Md:
    """One block: paragraph, heading, quote, list, code fence or rule."""
    kinds = ["para", "para", "heading", "quote", "bullets", "numbers", "nested", "table", "fence", "rule"]
    kind = draw(st.sampled_from(kinds))
    if kind == "para":
        return draw(paragraph())
    if kind == "nested":
        outer, inner = draw(words), draw(st.lists(words, min_size=1, max_size=3))
        return Md(
            f"- {outer}\n" + "\n".join(f"  - {w}" for w in inner), f"• {outer}\n" + "\n".join(f"  ◦ {w}" for w in inner)
        )
    if kind == "table":
        cols = draw(st.integers(1, 3))
        rows = draw(st.lists(st.lists(words, min_size=cols, max_size=cols), min_size=2, max_size=4))
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        lines.insert(1, "|" + "---|" * cols)
        return Md("\n".join(lines), "\n".join(" ".join(r) for r in rows))  # compared without | - + (the grid)
    if kind == "heading":
        p = draw(paragraph().filter(lambda p: "\n" not in p.source))
        return Md(f"{'#' * draw(st.integers(1, 6))} {p.source}", p.visible)
    if kind == "quote":
        p = draw(paragraph())
        deeper = draw(st.booleans())
        prefix = ">> " if deeper else "> "
        return Md("\n".join(prefix + line for line in p.source.split("\n")), p.visible)
    if kind in ("bullets", "numbers"):
        items = draw(st.lists(paragraph().filter(lambda p: "\n" not in p.source), min_size=1, max_size=4))
        start = draw(st.integers(1, 12))
        marks = [("- ", "• ") if kind == "bullets" else (f"{start + i}. ", f"{start + i}. ") for i in range(len(items))]
        return Md(
            "\n".join(m[0] + p.source for m, p in zip(marks, items, strict=True)),
            "\n".join(m[1] + p.visible for m, p in zip(marks, items, strict=True)),
        )
    if kind == "fence":
        lines = draw(st.lists(st.text(_CODE_CHARS, max_size=30), min_size=1, max_size=8))
        lang = draw(st.sampled_from(["", "python", "c++", "js"]))
        code = "\n".join(lines)
        if not code.strip():
            code = "pass"
        return Md(f"```{lang}\n{code}\n```", code)
    return Md("---", "──────────")


@st.composite
def answer(draw: st.DrawFn) -> Md:
    """A whole answer: blocks separated by blank lines."""
    blocks = draw(st.lists(block(), min_size=1, max_size=8))
    return join(blocks)


def join(blocks: list[Md]) -> Md:
    """Blocks as one answer; a paragraph between two lists keeps CommonMark from merging them."""
    out: list[Md] = []
    for b in blocks:
        if out and _is_list(out[-1]) and _is_list(b):
            out.append(Md("alpha", "alpha"))
        out.append(b)
    return Md("\n\n".join(b.source for b in out), "\n\n".join(b.visible for b in out))


def _is_list(md: Md) -> bool:
    """Whether a block is a list (it starts with a list marker)."""
    return re.match(r"- |\d+\. ", md.source) is not None


def no_space(text: str) -> str:
    """Text without whitespace (a split may drop the space or newline it cuts at) and without the
    characters a table's grid is drawn with."""
    return re.sub(r"[\s|+-]+", "", text)


def accepted(part: str, limit: int) -> str:
    """The visible text of a part, asserting the fake Bot API accepts it and it fits the limit."""
    text, _ = parse_html(part)
    shown = text.strip(" \t\r\n")
    assert shown, f"empty part {part!r}"
    assert utf16_len(shown) <= limit
    return text


@PROPS
@given(answer())
def test_rendered_answer_is_accepted_and_keeps_all_text(md: Md) -> None:
    parts = render_reply(md.source, [], 0.0)
    assert len(parts) >= 1
    shown = "".join(accepted(p, TELEGRAM_MESSAGE_LIMIT) for p in parts)
    assert no_space(shown) == no_space(md.visible)


_SOUP = st.lists(
    st.sampled_from(
        [*"*_`[]()|~#>-+=: \n\t!<>&;/.1ab", "https://x.y", "&amp;", "<b>", "```", "😀", "你", "\u200d", "\u0301"]
    ),
    max_size=120,
).map("".join)


@PROPS
@given(_SOUP, st.integers(min_value=12, max_value=400))
def test_any_text_at_all_renders_to_accepted_parts(text: str, limit: int) -> None:
    for parts, bound in (
        (render_reply(text, [], 0.0), TELEGRAM_MESSAGE_LIMIT),
        (split_html(markdown_to_html(text), limit), limit),
    ):
        assert len(parts) >= 1
        for p in parts:
            accepted(p, bound)


@PROPS
@given(answer(), st.integers(min_value=12, max_value=300))
def test_split_at_any_limit_keeps_every_part_valid_and_the_text_in_order(md: Md, limit: int) -> None:
    parts = split_html(markdown_to_html(md.source), limit)
    assert len(parts) >= 1
    shown = "".join(accepted(p, limit) for p in parts)
    assert no_space(shown) == no_space(md.visible)


@settings(PROPS, max_examples=12)
@given(answer(), st.integers(min_value=10, max_value=40))
def test_long_answers_with_activity_fit_telegram(one: Md, repeat: int) -> None:
    long = join([one, Md("alpha", "alpha")] * repeat)
    steps = [Step(name="remember", arguments={}, ok=True, outcome="saved 😀 <x> & y", duration_s=0.2)] * 3
    parts = render_reply(long.source, steps, 2.0)
    shown = [accepted(p, TELEGRAM_MESSAGE_LIMIT) for p in parts]
    assert all("blockquote expandable" not in p for p in parts[:-1])
    assert "blockquote expandable" in parts[-1]
    assert no_space("".join(shown)).startswith(no_space(long.visible))


@PROPS
@given(st.text(st.sampled_from([*list("ab \n"), "😀", "你", "\u200d"]), max_size=400), st.integers(8, 120))
def test_split_plain_parts_fit_and_keep_the_text(text: str, limit: int) -> None:
    parts = split_plain(text, limit)
    assert all(p.strip() and utf16_len(p) <= limit for p in parts)
    assert bool(parts) == bool(text.strip())
    if text.strip():
        assert no_space("".join(parts)) == no_space(text)
