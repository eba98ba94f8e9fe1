"""A slow Matrix answer streams as a draft edited in place (m.replace), on the fake homeserver with the real mautrix:
one draft, rare edits, the final answer's first part an edit of the draft (its own transaction id: sent again, the
same event), later parts new messages; a quick answer has no draft; nothing pings anyone; a process that died after
its draft leaves it to the rerun. The drafts' clock is stepped by the test (no sleeps)."""

from __future__ import annotations

from typing import Any

from mautrix.errors import MatrixRequestError

from adapters.matrix.buttons import BUTTONS_FIELD
from adapters.matrix.draft import MORE, Draft
from adapters.matrix.limits import MATRIX_DRAFT_AFTER_S, MATRIX_DRAFT_EDITS, MATRIX_DRAFT_EVERY_S, MATRIX_TEXT_LIMIT
from adapters.matrix.render import answer_contents
from adapters.matrix.reply import RoomReply
from core import Assistant, Error
from core.types import Ask
from tests.fake_matrix import BOT, FakeMatrix, Room
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import WAIT_S
from tests.test_matrix import ALICE, Start, mx, start  # noqa: F401 (the fixtures)

SLOW = "A slow answer, **written** bit by bit — for @room & <everyone>, as it streams in."


class Ticks:
    """A clock that moves `step` seconds on every reading: each streamed piece comes that much after the last."""

    def __init__(self, step: float) -> None:
        """Start at 0."""
        self.step, self.now = step, -step

    def __call__(self) -> float:
        """The next reading."""
        self.now += self.step
        return self.now


def bots(mx: FakeMatrix, room_id: str) -> list[dict[str, Any]]:  # noqa: F811
    """The bot's m.room.message events in a room (drafts, edits, parts), oldest first."""
    return [e for e in mx.sent if e["room_id"] == room_id and e["type"] == "m.room.message"]


def txn_of(mx: FakeMatrix, event_id: str) -> str:  # noqa: F811
    """The transaction id an event was sent with."""
    return next(txn for (_, txn), sent in mx.txns.items() if sent == event_id)


def replaces(event: dict[str, Any]) -> str | None:
    """The event an edit replaces (None: not an edit)."""
    relates = event["content"].get("m.relates_to") or {}
    return relates.get("event_id") if relates.get("rel_type") == "m.replace" else None


def assert_pings_nobody(events: list[dict[str, Any]]) -> None:
    """Every content, and every edit's new content, says it mentions nobody."""
    for e in events:
        assert e["content"]["m.mentions"] == {}
        assert e["content"].get("m.new_content", {"m.mentions": {}})["m.mentions"] == {}


async def joined(mx: FakeMatrix, room: Room) -> Room:  # noqa: F811
    """The room once the bot is in it."""
    await mx.wait_for(lambda: BOT in room.members, WAIT_S, what="the bot joining")
    return room


async def test_a_slow_answer_is_one_draft_edited_then_replaced_by_the_answer(
    start: Start,  # noqa: F811
    mx: FakeMatrix,  # noqa: F811
    fake_llm: FakeOpenAI,
) -> None:
    adapter = await start()
    adapter.clock = Ticks(MATRIX_DRAFT_EVERY_S + 0.5)  # its three pieces come 2.5 s apart
    room = await joined(mx, mx.direct(ALICE))
    fake_llm.script(Reply(text=SLOW))
    asked = mx.say(room, ALICE, "take your time")
    await mx.wait_for(lambda: len(bots(mx, room.id)) == 3, WAIT_S, what="the draft, an edit and the answer")
    await mx.wait_for(lambda: mx.typing[-1:] == [(room.id, False)], WAIT_S, what="typing… ended")
    draft, edit, final = bots(mx, room.id)
    assert txn_of(mx, draft["event_id"]) == f"{asked}.draft" and replaces(draft) is None
    assert draft["content"]["formatted_body"].endswith(MORE) and draft["content"]["body"].endswith("…")
    assert "A slow answer" in draft["content"]["body"] and "streams in" not in draft["content"]["body"]  # so far
    assert replaces(edit) == draft["event_id"] and edit["content"]["body"].startswith("* A slow answer")
    assert "streams in" in edit["content"]["m.new_content"]["body"]
    # the answer: an edit of the draft with the part's own transaction id, reading exactly the rendered first part
    assert replaces(final) == draft["event_id"] and txn_of(mx, final["event_id"]) == f"{asked}.answer.0"
    [first] = answer_contents(SLOW)
    assert final["content"]["m.new_content"] == dict(first.serialize())
    assert final["content"]["body"] == f"* {first['body']}"  # what a client without edits shows
    assert mx.text(draft["event_id"]) == first["body"] and "…" not in first["body"]
    assert_pings_nobody(bots(mx, room.id))


async def test_a_quick_answer_has_no_draft(
    start: Start,  # noqa: F811
    mx: FakeMatrix,  # noqa: F811
    fake_llm: FakeOpenAI,
) -> None:
    adapter = await start()
    adapter.clock = Ticks(MATRIX_DRAFT_AFTER_S / 3)  # the whole answer streams within MATRIX_DRAFT_AFTER_S
    room = await joined(mx, mx.direct(ALICE))
    fake_llm.script(Reply(text=SLOW))
    asked = mx.say(room, ALICE, "quick")
    await mx.wait_for(lambda: len(bots(mx, room.id)) == 1, WAIT_S, what="the answer")
    await mx.wait_for(lambda: mx.typing[-1:] == [(room.id, False)], WAIT_S, what="typing… ended")
    [answer] = bots(mx, room.id)
    assert answer["content"] == {**dict(answer_contents(SLOW)[0].serialize())}
    assert txn_of(mx, answer["event_id"]) == f"{asked}.answer.0" and not mx.edits(answer["event_id"])


async def test_a_long_slow_answer_in_a_group_room_drafts_its_first_part_and_sends_the_rest_as_replies(
    start: Start,  # noqa: F811
    mx: FakeMatrix,  # noqa: F811
    fake_llm: FakeOpenAI,
) -> None:
    adapter = await start()
    adapter.clock = Ticks(MATRIX_DRAFT_EVERY_S + 0.5)
    room = mx.room(ALICE)
    mx.invite(room, ALICE)
    await joined(mx, room)
    text = "\n\n".join(f"Paragraph {n}: " + "a fairly long sentence about nothing much. " * 8 for n in range(40))
    fake_llm.script(Reply(text=text))
    asked = mx.say(room, ALICE, "tell me everything", mentions=[BOT])
    contents = [dict(c.serialize()) for c in answer_contents(text)]
    assert len(contents) >= 3
    await mx.wait_for(
        lambda: sum(replaces(e) is None for e in bots(mx, room.id)) == len(contents),  # the draft and the later parts
        WAIT_S,
        what="the whole answer",
    )
    events = bots(mx, room.id)
    draft = events[0]
    assert draft["content"]["m.relates_to"] == {"m.in_reply_to": {"event_id": asked}}  # a reply, like the parts
    assert len(draft["content"]["formatted_body"]) <= MATRIX_TEXT_LIMIT + len(MORE) + 1  # the first part only
    final = next(e for e in events if txn_of(mx, e["event_id"]) == f"{asked}.answer.0")
    assert replaces(final) == draft["event_id"] and final["content"]["m.new_content"] == contents[0]
    rest = [e for e in events if replaces(e) is None][1:]
    assert [txn_of(mx, e["event_id"]) for e in rest] == [f"{asked}.answer.{i}" for i in range(1, len(contents))]
    for sent, made in zip(rest, contents[1:], strict=True):  # new messages, each a reply to the question
        assert sent["content"] == {**made, "m.relates_to": {"m.in_reply_to": {"event_id": asked}}}
    assert len(events) - len(contents) <= MATRIX_DRAFT_EDITS + 1  # the edits are few
    assert_pings_nobody(events)


async def test_an_answer_sent_again_after_its_final_edit_is_the_same_event(
    start: Start,  # noqa: F811
    mx: FakeMatrix,  # noqa: F811
    fake_llm: FakeOpenAI,
) -> None:
    adapter = await start()
    adapter.clock = Ticks(MATRIX_DRAFT_EVERY_S + 0.5)
    room = await joined(mx, mx.direct(ALICE))
    fake_llm.script(Reply(text=SLOW))
    asked = mx.say(room, ALICE, "take your time")
    await mx.wait_for(lambda: len(bots(mx, room.id)) == 3, WAIT_S, what="the draft, an edit and the answer")
    before = list(mx.sent)
    # the process died after the homeserver took the final edit and before the core recorded it: the next one sends
    # the stored answer again (no draft of its own) with the same transaction id
    assert adapter.client is not None and adapter.sender is not None
    again = RoomReply(adapter.client, room.id, asked, adapter.sender)
    assert [n async for n in again.answer(Assistant(SLOW, None))] == [1]
    assert mx.sent == before and mx.text(before[0]["event_id"]) == answer_contents(SLOW)[0]["body"]


async def test_a_rerun_after_a_crash_edits_the_old_draft_when_slow_and_leaves_it_when_quick(
    start: Start,  # noqa: F811
    mx: FakeMatrix,  # noqa: F811
) -> None:
    adapter = await start()
    room = await joined(mx, mx.direct(ALICE))
    client, sender = adapter.client, adapter.sender
    assert client is not None and sender is not None
    pieces = ["The first ", "half, and ", "the rest."]

    async def streamed(asked: str, step: float) -> RoomReply:
        reply = RoomReply(client, room.id, asked, sender, clock=Ticks(step))
        for piece in pieces:
            await reply.draft(piece)
        return reply

    await streamed("$asked1:fake.test", MATRIX_DRAFT_EVERY_S + 0.5)  # a draft, then the process dies
    [old] = bots(mx, room.id)[:1]
    rerun = await streamed("$asked1:fake.test", MATRIX_DRAFT_EVERY_S + 0.5)  # the rerun's draft: the same event
    assert [n async for n in rerun.answer(Assistant("".join(pieces), None))] == [1]
    assert mx.text(old["event_id"]) == "The first half, and the rest."
    assert sum(replaces(e) is None for e in bots(mx, room.id)) == 1  # no second draft, no new message

    await streamed("$asked2:fake.test", MATRIX_DRAFT_EVERY_S + 0.5)
    stale = [e for e in bots(mx, room.id) if replaces(e) is None][-1]
    quick = await streamed("$asked2:fake.test", MATRIX_DRAFT_AFTER_S / 3)  # a quick rerun: no draft
    assert [n async for n in quick.answer(Assistant("".join(pieces), None))] == [1]
    answer = bots(mx, room.id)[-1]
    assert replaces(answer) is None and answer["event_id"] != stale["event_id"]
    assert mx.text(stale["event_id"]).endswith("…")  # the old draft stays as it was (documented in reply.py)
    assert_pings_nobody(bots(mx, room.id))


async def test_the_draft_is_throttled_capped_and_best_effort() -> None:
    sent: list[tuple[dict[str, Any], str]] = []
    times: list[float] = []  # when each send was tried
    failing = [True]

    async def put(body: dict[str, Any], txn: str) -> str:
        times.append(clock.now)
        if failing[0]:
            failing[0] = False
            raise MatrixRequestError(502, "M_UNKNOWN", "the homeserver is busy")
        sent.append((body, txn))
        return "$draft:fake.test"

    clock = Ticks(0.5)
    draft = Draft(put, "$q.draft", reply_to=None, clock=clock)
    for n in range(200):  # 100 s of streaming, a piece every 0.5 s
        await draft.add(f"word{n} ")
    # the first try (at 2 s) failed; tried again 2 s later, then an edit every 2 s: 1 + MATRIX_DRAFT_EDITS tries
    assert times == [MATRIX_DRAFT_AFTER_S + n * MATRIX_DRAFT_EVERY_S for n in range(1 + MATRIX_DRAFT_EDITS)]
    assert sent[0][1] == "$q.draft" and len(sent) == MATRIX_DRAFT_EDITS  # the draft and 9 edits
    assert all(txn.startswith(f"$q.draft.{draft.nonce}.") for _, txn in sent[1:])
    assert sent[0][0]["body"].startswith("word0 word1 word2 word3 word4 word5 word6 word7 word8")
    assert "word8" in sent[0][0]["body"] and "word9" not in sent[0][0]["body"]  # shown at 4 s: nine pieces so far
    assert await draft.sent() == "$draft:fake.test"
    assert_pings_nobody([{"content": body} for body, _ in sent])


async def test_a_draft_whose_first_send_was_lost_is_found_again_for_the_answer() -> None:
    calls: list[str] = []

    async def put(body: dict[str, Any], txn: str) -> str:
        calls.append(txn)
        if len(calls) == 1:
            raise TimeoutError  # it may have landed: only its transaction id tells
        return "$draft:fake.test"

    draft = Draft(put, "$q.draft", reply_to=None, clock=Ticks(MATRIX_DRAFT_AFTER_S))
    await draft.add("one ")
    await draft.add("two")
    assert draft.event_id is None and await draft.sent() == "$draft:fake.test" and calls == ["$q.draft"] * 2
    assert await Draft(put, "$r.draft", reply_to=None).sent() is None  # never tried: no draft


async def test_the_draft_carries_the_answers_reactions_and_an_error_replaces_it(
    start: Start,  # noqa: F811
    mx: FakeMatrix,  # noqa: F811
) -> None:
    adapter = await start()
    room = await joined(mx, mx.direct(ALICE))
    client, sender = adapter.client, adapter.sender
    assert client is not None and sender is not None
    slow = Ticks(MATRIX_DRAFT_EVERY_S + 0.5)

    asking = RoomReply(client, room.id, "$asked1:fake.test", sender, clock=slow)
    for piece in ["May I ", "send it?"]:
        await asking.draft(piece)
    [draft] = bots(mx, room.id)
    asked = Assistant("May I send it?", None, asks=(Ask(7, "Allow mail: send_email"),))
    assert [n async for n in asking.answer(asked)] == [1]
    [final] = mx.edits(draft["event_id"])
    assert final["content"]["m.new_content"][BUTTONS_FIELD] == [{"key": "1️⃣", "label": "Allow mail: send_email"}]
    assert [r["content"]["m.relates_to"]["key"] for r in mx.reactions(draft["event_id"])] == ["1️⃣"]  # under the draft
    assert await sender.kept(draft["event_id"]) is not None  # a press on the draft's reaction finds its button

    failing = RoomReply(client, room.id, "$asked2:fake.test", sender, clock=slow)
    for piece in ["Half an ", "answer, then "]:
        await failing.draft(piece)
    stale = bots(mx, room.id)[-1]
    await failing.error(Error("llm_unavailable", "The model stopped answering. Your message is saved."))
    [line] = mx.edits(stale["event_id"])
    assert txn_of(mx, line["event_id"]) == "$asked2:fake.test.error.0"
    assert mx.text(stale["event_id"]) == "The model stopped answering. Your message is saved."
    assert_pings_nobody(bots(mx, room.id))
