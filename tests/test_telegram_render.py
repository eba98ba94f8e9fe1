"""Markdown → Telegram HTML rendering and splitting: examples, one per known way it used to go wrong."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.markdown import utf16_len
from adapters.telegram.limits import TELEGRAM_MESSAGE_LIMIT
from adapters.telegram.render import (
    activity_html,
    markdown_to_html,
    plain_text,
    render_reply,
    split_html,
    split_plain,
    visible_len,
)
from core.types import Step
from tests.fake_telegram import parse_html

Entity = dict[str, Any]


def accepted(part: str) -> tuple[str, list[Entity]]:
    """Telegram's view of one HTML part, failing the test where the Bot API would refuse it."""
    text, entities = parse_html(part)
    shown = text.strip(" \t\r\n")
    assert shown, f"empty message: {part!r}"
    assert utf16_len(shown) <= TELEGRAM_MESSAGE_LIMIT, f"{utf16_len(shown)} UTF-16 units"
    return text, entities


def only_part(md: str) -> tuple[str, list[Entity]]:
    """The single accepted part an answer renders to."""
    parts = render_reply(md, [], 0.0)
    assert len(parts) == 1, parts
    return accepted(parts[0])


def covered(text: str, e: Entity) -> str:
    """The text an entity covers."""
    data = text.encode("utf-16-le", "surrogatepass")
    return data[2 * e["offset"] : 2 * (e["offset"] + e["length"])].decode("utf-16-le", "surrogatepass")


def spans(md: str) -> tuple[str, set[tuple[str, str]]]:
    """Visible text and (entity type, covered text) pairs of a one-part answer."""
    text, entities = only_part(md)
    return text, {(e["type"], covered(text, e)) for e in entities}


def test_split_never_exceeds_the_limit_with_an_astral_character_at_the_edge() -> None:
    parts = render_reply(">\n" + "a" * 4095 + "😀", [], 0.0)
    views = [accepted(p)[0] for p in parts]
    assert "".join(views) == "a" * 4095 + "😀"


def test_only_an_empty_code_block_still_sends_a_message() -> None:
    for md in ("```\n```", "```python\n\n```", "~~~\n~~~", ">", "#"):
        parts = render_reply(md, [], 0.0)
        assert parts and all(accepted(p) for p in parts)


def test_triple_stars_are_bold_and_italic() -> None:
    text, found = spans("***x*** and ***more words***")
    assert text == "x and more words"
    assert {("bold", "x"), ("italic", "x"), ("bold", "more words"), ("italic", "more words")} <= found


def test_link_whose_url_has_parentheses() -> None:
    url = "https://en.wikipedia.org/wiki/Foo_(bar)"
    text, entities = only_part(f"See [x]({url}).")
    assert text == "See x."
    assert [(e["type"], e.get("url")) for e in entities] == [("text_link", url)]


def test_multi_line_bold_and_italic() -> None:
    text, found = spans("**a\nb** and *c\nd*")
    assert text == "a\nb and c\nd"
    assert {("bold", "a\nb"), ("italic", "c\nd")} <= found


def test_literal_html_and_ampersands_stay_visible() -> None:
    md = "Use <b>bold</b>, <script>x()</script>, a <br> & AT&T; 5 < 6 > 4"
    text, entities = only_part(md)
    assert text == md
    assert entities == []


def test_code_keeps_markup_characters_literally() -> None:
    _, found = spans("Run `a **b** <c> & d` now\n\n```html\n<b>x</b> &amp; y\n```")
    assert ("code", "a **b** <c> & d") in found
    assert ("pre", "<b>x</b> &amp; y") in found


def test_fence_language_and_inline_code_with_backticks() -> None:
    text, entities = only_part("``a ` b``\n\n```python\nprint(1)\n```")
    assert text == "a ` b\n\nprint(1)"
    pre = next(e for e in entities if e["type"] == "pre")
    assert pre["language"] == "python"


def test_headings_lists_and_quotes() -> None:
    md = "# Plan\n\n- one\n- two\n  - nested\n\n3. three\n4. four\n\n> quoted\n>> deeper"
    text, found = spans(md)
    assert text == "Plan\n\n• one\n• two\n  ◦ nested\n\n3. three\n4. four\n\nquoted\ndeeper"
    assert {("bold", "Plan"), ("blockquote", "quoted\ndeeper")} <= found


def test_code_block_inside_a_quote_is_moved_out_of_it() -> None:
    text, found = spans("> Try:\n> ```sql\n> SELECT 1;\n> ```\n> then tell me.")
    assert text == "Try:\nSELECT 1;\nthen tell me."
    assert {("blockquote", "Try:"), ("pre", "SELECT 1;"), ("blockquote", "then tell me.")} <= found


def test_table_becomes_aligned_columns() -> None:
    text, found = spans("| a | bb |\n|---|---|\n| **1** | 2 |")
    assert text == "a | bb\n--+---\n1 | 2"
    assert found == {("pre", text)}


def test_spoilers_but_not_logical_or() -> None:
    text, found = spans("The answer is ||42||, and a || b || c stays.")
    assert text == "The answer is 42, and a || b || c stays."
    assert found == {("spoiler", "42")}


def test_images_and_relative_links() -> None:
    text, entities = only_part("![chart](https://x.io/c.png) and [settings](settings.html)")
    assert text == "🖼 chart and settings (settings.html)"
    assert [e.get("url") for e in entities] == ["https://x.io/c.png"]


def test_long_code_block_is_reopened_with_its_language_on_every_part() -> None:
    code = "\n".join(f"x_{i} = '😀 <{i}> &'" for i in range(700))
    parts = render_reply(f"Intro\n\n```python\n{code}\n```\n\nThe end.", [], 0.0)
    assert len(parts) >= 3
    views = [accepted(p) for p in parts]
    code_parts = [p for p in parts if "x_" in p]
    assert all(p.count('<pre><code class="language-python">') == 1 for p in code_parts)
    shown = "\n".join(t for t, _ in views)
    assert all(f"x_{i} = '😀 <{i}> &'" in shown for i in range(700))  # lines are not cut
    assert shown.startswith("Intro") and shown.endswith("The end.")


def test_split_html_reopens_formatting_and_counts_entities_decoded() -> None:
    markup = "<b>" + "&amp;" * 10 + "</b>"
    parts = split_html(markup, limit=4)
    assert [accepted(p)[0] for p in parts] == ["&&&&", "&&&&", "&&"]
    assert all(p.startswith("<b>") and p.endswith("</b>") for p in parts)


def test_split_does_not_break_an_emoji_sequence() -> None:
    family = "👩\u200d👩\u200d👧\u200d👦"
    parts = split_html("ab" + family, limit=12)  # the family is 11 units: it must not be cut
    assert [plain_text(p) for p in parts] == ["ab", family]
    for cluster in ("🇩🇪", "1\ufe0f\u20e3", "e\u0301", "👍🏽"):
        assert [plain_text(p) for p in split_html("a" + cluster, limit=utf16_len(cluster))] == ["a", cluster]


def test_activity_block_goes_on_the_last_part_only() -> None:
    steps = [Step(name="manage_tasks", arguments={"action": "list"}, ok=True, outcome="3 tasks", duration_s=0.1)]
    parts = render_reply("word " * 3000, steps, 1.5)
    assert len(parts) >= 2
    assert all("blockquote expandable" not in p for p in parts[:-1])
    assert parts[-1].endswith(activity_html(steps, 1.5))
    assert all(visible_len(p) <= TELEGRAM_MESSAGE_LIMIT for p in parts)
    for p in parts:
        accepted(p)


@pytest.mark.parametrize("md", ["", "   ", "\n\n", "<>", "&"])
def test_degenerate_answers_give_one_valid_part(md: str) -> None:
    parts = render_reply(md, [], 0.0)
    assert len(parts) == 1
    accepted(parts[0])


def test_markdown_to_html_keeps_soft_line_breaks_and_the_source_blank_lines() -> None:
    assert markdown_to_html("one\ntwo") == "one\ntwo"
    assert markdown_to_html("**Tasks:**\n- a\n- b\n\nDone.") == "<b>Tasks:</b>\n• a\n• b\n\nDone."
    assert markdown_to_html("Steps:\r\n\r\n```\nx\n```\nok") == "Steps:\n\n<pre><code>x</code></pre>\nok"


def test_split_plain_never_returns_a_blank_part() -> None:
    assert split_plain("   ") == [] and split_plain("") == []
    parts = split_plain("😀" * 3000)
    assert [utf16_len(p) for p in parts] == [4096, 1904]
    assert split_plain("ab👍🏽", limit=5) == ["ab", "👍🏽"]
