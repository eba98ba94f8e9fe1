"""Discord rendering: fence-aware splitting, the summary line, the steps block."""

from __future__ import annotations

from adapters.discord.render import render_reply, split_markdown, steps_text, with_steps, without_steps
from core.types import Step


def fences_balanced(part: str) -> bool:
    """Every code fence opened in the part is closed in it."""
    return sum(1 for line in part.split("\n") if line.lstrip().startswith(("```", "~~~"))) % 2 == 0


def test_short_text_is_one_part() -> None:
    assert split_markdown("hello **world**") == ["hello **world**"]


def test_split_at_lines_within_the_limit_and_nothing_lost() -> None:
    text = "\n".join(f"line {i}" for i in range(500))
    parts = split_markdown(text, limit=200)
    assert all(len(p) <= 200 for p in parts)
    assert "\n".join(parts) == text


def test_a_cut_fence_is_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"x = {i}" for i in range(100))
    text = f"before\n~~~js\n{code}\n~~~\nafter"
    parts = split_markdown(text, limit=150)
    assert len(parts) > 3 and all(len(p) <= 150 for p in parts)
    assert all(fences_balanced(p) for p in parts)
    assert all(p.startswith("~~~js\n") for p in parts[1:-1])
    assert "\n".join(parts).replace("\n~~~\n~~~js\n", "\n") == text


def test_a_line_longer_than_a_message_is_cut() -> None:
    parts = split_markdown("word " * 1000)
    assert len(parts) == 3 and all(len(p) <= 2000 for p in parts)
    assert "".join(parts).split() == ["word"] * 1000
    assert all(len(p) <= 2000 for p in split_markdown("x" * 5000))


def test_summary_line_goes_on_the_last_part_within_the_limit() -> None:
    step = Step("manage_tasks", {"action": "list"}, True, "2 tasks", 0.01)
    parts = render_reply("a" * 1990, [step], 1.25)
    assert len(parts) == 2 and all(len(p) <= 2000 for p in parts)
    assert parts[-1].endswith("\n-# 🔧 1 step · 1.2 s")
    assert render_reply("plain", [], 0.3) == ["plain"]


def test_steps_are_escaped_and_capped() -> None:
    steps = [Step("execute_sql", {}, False, "forbidden", 0.0), Step("x_y", {}, True, "@everyone *hi*", 0.0)]
    text = steps_text(steps, 2000)
    assert text.startswith("> ⚠️ execute\\_sql → forbidden")
    assert "@everyone" not in text and "\\*hi\\*" in text
    many = [Step(f"tool_{i}", {}, True, "x" * 80, 0.0) for i in range(12)]
    short = steps_text(many, 400)
    assert len(short) <= 400 and short.endswith("more")


def test_with_and_without_steps_round_trip() -> None:
    last = "the answer\n-# 🔧 1 step · 0.4 s"
    step = Step("manage_tasks", {"action": "create"}, True, 'created #1 "Milk"', 0.1)
    shown = with_steps(last, [step])
    assert shown.startswith(last + "\n> ✅ manage\\_tasks create")
    assert with_steps(shown, [step]) == shown  # pressing twice never stacks
    assert without_steps(shown) == last
