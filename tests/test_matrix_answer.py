"""A Matrix answer on the fake homeserver with the real mautrix: Matrix HTML in formatted_body, a readable plain body,
the tool steps folded in a <details> at its end, nobody pinged."""

from __future__ import annotations

import re

from tests.fake_matrix import BOT, FakeMatrix
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import WAIT_S
from tests.test_matrix import ALICE, Start, answers, mx, start  # noqa: F401 (the fixtures)
from tests.test_matrix_render import assert_well_formed


async def test_an_answer_with_a_tool_step_arrives_as_html_with_its_steps_folded(
    start: Start,  # noqa: F811
    mx: FakeMatrix,  # noqa: F811
    fake_llm: FakeOpenAI,
) -> None:
    await start()
    room = mx.direct(ALICE)
    await mx.wait_for(lambda: BOT in room.members, WAIT_S, what="the bot joining the direct chat")
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Call mum", "due_at": "2026-11-21T11:30"})]),
        Reply(text="Will do, **at 11:30** — tell @room & <everyone>:\n\n- call `mum`"),
    )
    mx.say(room, ALICE, "remind me to call mum at 11:30")
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the answer")
    [answer] = [e["content"] for e in mx.sent if e["type"] == "m.room.message"]
    assert answer["msgtype"] == "m.text" and answer["format"] == "org.matrix.custom.html"
    assert answer["m.mentions"] == {}
    html = answer["formatted_body"]
    assert_well_formed(html)
    assert html.startswith("<p>Will do, <strong>at 11:30</strong> — tell @\u200broom &amp; &lt;everyone&gt;:</p>")
    assert "<li>call <code>mum</code></li>" in html
    assert re.search(r"<details><summary>🔧 1 step · \d+\.\d s</summary>\n<ul>\n<li>✅ manage_tasks create → ", html)
    body = answer["body"]
    assert body.startswith("Will do, at 11:30 — tell @\u200broom & <everyone>:\n\n• call mum\n\n🔧 1 step · ")
    assert "\n• ✅ manage_tasks create → " in body and "<" not in body.replace("<everyone>", "")
