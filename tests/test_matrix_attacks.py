"""Hostile and malformed input to the Matrix adapter through the fake homeserver, with the real mautrix: no event a
stranger (or a broken client or homeserver) sends stops or stalls the sync. A malformed event is skipped (or, when
the adapter still cannot read it, kept as a dead letter) and the sync goes on past it: the message after it is
answered once; a homeserver that fails, rate-limits or drops syncs and sends is waited out without losing or
repeating an answer; a flood from a stranger holds up nobody else."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web

from adapters.matrix import adapter as matrix_adapter
from adapters.matrix import files as matrix_files
from adapters.matrix.files import TOO_BIG
from adapters.matrix.incoming import caption, update_id
from adapters.matrix.limits import MATRIX_RATE_LIMIT_TRIES
from adapters.matrix.paced import wait_of
from core import FAILED, ReminderMessage
from core.storage.db import Pool
from tests.fake_matrix import BOT, SERVER, FakeMatrix, Room
from tests.fake_openai import FakeOpenAI
from tests.helpers import WAIT_S
from tests.test_inbox import echo
from tests.test_matrix import ALICE, MALLORY, Start, answers, mx, start
from tests.test_matrix_features import joined
from tests.test_poison import dead_letters

__all__ = ["mx", "start"]  # the fixtures, shared with tests/test_matrix.py

MSG = "m.room.message"
KEY_10K = "k" * 10_000
DONE = "SELECT done_at IS NOT NULL FROM inbox WHERE update_id = $1"


def msg(event_id: str, content: Any, sender: Any = ALICE, **more: Any) -> dict[str, Any]:
    """A raw m.room.message event as a client might send it (content as given, however wrong)."""
    return {"type": MSG, "sender": sender, "event_id": event_id, "content": content, **more}


def text(body: Any, **more: Any) -> dict[str, Any]:
    """m.text content with `more` fields."""
    return {"msgtype": "m.text", "body": body, **more}


def annotation(event_id: str, relates: Any) -> dict[str, Any]:
    """A raw m.reaction of Alice's."""
    return {"type": "m.reaction", "sender": ALICE, "event_id": event_id, "content": {"m.relates_to": relates}}


POISONS: dict[str, dict[str, Any]] = {
    "content a string": msg("$p1", "hello"),
    "content a list": msg("$p2", [1, 2]),
    "content null": msg("$p2n", None),
    "body a number": msg("$p3", text(5)),
    "body null": msg("$p4", text(None)),
    "body a list": msg("$p4l", text(["a"])),
    "no msgtype": msg("$p5", {"body": "no type"}),
    "unknown msgtype": msg("$p6", {"msgtype": "m.weird", "body": "weird"}),
    "relates_to a string": msg("$p7", text("x", **{"m.relates_to": "oops"})),
    "relates_to a list": msg("$p8", text("x", **{"m.relates_to": [1]})),
    "relates_to null": msg("$p8n", text("x", **{"m.relates_to": None})),
    "in_reply_to a string": msg("$p9", text("x", **{"m.relates_to": {"m.in_reply_to": "$e"}})),
    "in_reply_to's id a list": msg("$p9b", text("x", **{"m.relates_to": {"m.in_reply_to": {"event_id": [1]}}})),
    "mentions a string": msg("$p10", text("x", **{"m.mentions": "everyone"})),
    "user_ids a string": msg("$p11", text("x", **{"m.mentions": {"user_ids": BOT}})),
    "user_ids an object": msg("$p11b", text("x", **{"m.mentions": {"user_ids": {BOT: 1}}})),
    "no event_id": {"type": MSG, "sender": ALICE, "content": text("no id")},
    "event_id a number": msg(5, text("numbered")),  # type: ignore[arg-type]
    "no sender": {"type": MSG, "event_id": "$p12", "content": text("nobody")},
    "sender a number": msg("$p12b", text("x"), sender=7),
    "reaction without key": annotation("$p13", {"rel_type": "m.annotation", "event_id": "$x"}),
    "reaction key of 10 KB": annotation("$p14", {"rel_type": "m.annotation", "event_id": "$x", "key": KEY_10K}),
    "reaction to no event": annotation("$p14b", {"rel_type": "m.annotation", "event_id": "$gone", "key": "✅"}),
    "reaction relates_to a string": annotation("$p15", "x"),
    "reaction content a string": {"type": "m.reaction", "sender": ALICE, "event_id": "$p15b", "content": "x"},
    "redaction": {"type": "m.room.redaction", "sender": ALICE, "event_id": "$p16", "redacts": "$x", "content": {}},
    "state of an unknown type": {"type": "com.example.odd", "sender": ALICE, "event_id": "$p17", "state_key": ""},
    "bot's membership content a string": {
        "type": "m.room.member",
        "sender": ALICE,
        "event_id": "$p18",
        "state_key": BOT,
        "content": "join",
    },
    "no type": {"sender": ALICE, "event_id": "$p19", "content": {}},
    "file info a string": msg("$p21", {"msgtype": "m.file", "body": "f.txt", "url": f"mxc://{SERVER}/zz", "info": "x"}),
    "file size a string": msg(
        "$p22", {"msgtype": "m.file", "body": "f.txt", "url": f"mxc://{SERVER}/zz", "info": {"size": "big"}}
    ),
    "file mimetype a number": msg(
        "$p22b", {"msgtype": "m.file", "body": "f.txt", "url": f"mxc://{SERVER}/zz", "info": {"mimetype": 3}}
    ),
}


async def direct_chat(start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, **settings: Any) -> Room:
    """The bot running (an echoing model) and Alice's direct chat with it, joined."""
    fake_llm.default = echo()
    await start(**settings)
    return await joined(mx, mx.direct(ALICE))


async def answered_after(mx: FakeMatrix, room: Room, body: str = "after") -> None:
    """Alice says `body`; waits for its answer."""
    mx.say(room, ALICE, body)
    await mx.wait_for(lambda: f"re: {body}" in answers(mx, room.id), WAIT_S, what=f"the answer to {body!r}")


def sync_failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The sync loop's warnings of failed syncs."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Matrix sync failed")]


# ---- poison events ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(POISONS))
async def test_a_malformed_event_is_skipped_and_the_message_after_it_answered_once(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, pool: Pool, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    mx.raw(room, POISONS[name])
    await answered_after(mx, room)
    assert answers(mx, room.id).count("re: after") == 1
    assert sync_failures(caplog) == []  # read past at once: the sync was not tried again
    assert await dead_letters(pool) == []  # skipped (or answered, its wrong parts ignored): nothing to keep


async def test_all_the_poison_in_one_sync_then_a_message_answered_once(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    for event in POISONS.values():  # logged with no await between: one sync carries them all
        mx.raw(room, event)
    await answered_after(mx, room)
    await answered_after(mx, room, "and again")
    assert answers(mx, room.id).count("re: after") == 1 and sync_failures(caplog) == []


async def test_an_event_the_adapter_still_cannot_read_is_a_dead_letter_not_retried(
    start: Start,
    mx: FakeMatrix,
    fake_llm: FakeOpenAI,
    pool: Pool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(content: dict[str, Any]) -> str:
        if str(content.get("body")).startswith("poison"):  # a shape nobody foresaw makes the adapter's code raise
            raise TypeError("unforeseen")
        return caption(content)

    monkeypatch.setattr(matrix_adapter, "caption", broken)
    room = await direct_chat(start, mx, fake_llm)
    poison = mx.say(room, ALICE, "poison\x00")
    await answered_after(mx, room)
    [dead] = await dead_letters(pool)
    assert dead["reason"] == "not a Matrix event (TypeError: unforeseen)" and poison in dead["payload"]
    assert sync_failures(caplog) == []
    assert answers(mx, room.id) == ["re: after"]


async def test_a_sync_with_junk_where_rooms_and_events_belong_is_read_past(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    room = await direct_chat(start, mx, fake_llm)

    def junk(body: dict[str, Any]) -> web.StreamResponse:
        rooms = {
            "join": {"!a:x": "nonsense", "!b:x": {"timeline": {"events": [1, "two", None]}}, room.id: []},
            "invite": {"!c:x": {"invite_state": "nonsense"}, "!d:x": {"invite_state": {"events": [[]]}}},
            "leave": {room.id: {"timeline": {"events": [{"type": MSG, "sender": ALICE, "content": text("old")}]}}},
        }
        return web.json_response({**body, "rooms": rooms})

    mx.sync_faults.append(junk)
    mx.say(room, ALICE, "lost in the junk")  # that sync's real events are replaced by the junk
    await mx.wait_for(lambda: not mx.sync_faults, WAIT_S, what="the junk synced")
    await answered_after(mx, room)
    assert sync_failures(caplog) == []
    assert "re: old" not in answers(mx, room.id)  # a room in `leave` is not answered


async def test_the_bot_never_answers_itself(start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI) -> None:
    room = await direct_chat(start, mx, fake_llm)
    mx.raw(room, msg("$me", text(f"{BOT} hello me", **{"m.mentions": {"user_ids": [BOT]}}), sender=BOT))
    mx.raw(room, annotation("$me2", {"rel_type": "m.annotation", "event_id": "$me", "key": "✅"}) | {"sender": BOT})
    await answered_after(mx, room)
    assert answers(mx, room.id) == ["re: after"]


async def test_a_message_with_nul_lone_surrogates_and_control_characters_is_answered_cleaned(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    mx.say(room, ALICE, "a\x00b\ud800c\x1bd")
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the answer")
    assert "\x00" not in answers(mx, room.id)[0] and "\ud800" not in json.dumps(fake_llm.requests[-1])
    assert await dead_letters(pool) == []


async def test_a_megabyte_of_text_gets_an_answer_and_holds_up_nothing(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    mx.say(room, ALICE, "x" * 1_000_000)
    await mx.wait_for(lambda: len(answers(mx, room.id)) >= 1, WAIT_S, what="the huge message's answer")
    await answered_after(mx, room)


async def test_an_invitation_with_missing_fields_is_declined_or_skipped(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    odd = mx.room(MALLORY)

    def invites(body: dict[str, Any]) -> web.StreamResponse:
        member = {"type": "m.room.member", "state_key": BOT, "content": "invite"}  # no sender, content no object
        invite = {odd.id: {"invite_state": {"events": [member, {"type": None}]}}, "!nowhere:x": {}}
        return web.json_response({**body, "rooms": {**body["rooms"], "invite": invite}})

    mx.sync_faults.append(invites)
    mx.say(room, ALICE, "hello")
    await mx.wait_for(lambda: "re: hello" in answers(mx, room.id), WAIT_S, what="the answer")
    assert BOT not in odd.members  # nobody allowed invited the bot: not joined
    await answered_after(mx, room)


async def test_an_invitation_the_homeserver_will_not_let_the_bot_take_stalls_nothing(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    gone = mx.room(ALICE)  # Alice's invitation was withdrawn: joining is refused (M_FORBIDDEN)

    def withdrawn(body: dict[str, Any]) -> web.StreamResponse:
        member = {"type": "m.room.member", "state_key": BOT, "sender": ALICE, "content": {"membership": "invite"}}
        invite = {gone.id: {"invite_state": {"events": [member]}}}
        return web.json_response({**body, "rooms": {**body["rooms"], "invite": invite}})

    mx.sync_faults.append(withdrawn)
    mx.say(room, ALICE, "hello")
    await mx.wait_for(lambda: "re: hello" in answers(mx, room.id), WAIT_S, what="the answer")
    await answered_after(mx, room)
    assert sync_failures(caplog) == [] and BOT not in gone.members
    [dead] = await dead_letters(pool)
    assert "M_FORBIDDEN" in dead["reason"] and gone.id in dead["payload"]


# ---- reactions -------------------------------------------------------------------------------------------------


async def test_a_strangers_reaction_to_a_reminder_presses_nothing(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = echo()
    adapter = await start()
    group = mx.room(ALICE)
    mx.join(group, MALLORY)
    mx.invite(group, ALICE)
    await joined(mx, group)
    await adapter.core.command(_alice(group), "remind", "tomorrow 9:00 Buy milk")
    task_id = await pool.fetchval("SELECT id FROM tasks")
    when = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
    msg_ = ReminderMessage(task_id, when, "matrix", group.id, group.id, "group", ALICE, "Alice", "⏰ Buy milk")
    reminder = await adapter.send_reminder(msg_)
    assert reminder is not None
    mx.react(group, MALLORY, reminder, "✅")
    mx.react(group, MALLORY, reminder, KEY_10K)
    mx.say(group, ALICE, "after", mentions=[BOT])
    await mx.wait_for(lambda: any("after" in a for a in answers(mx, group.id)), WAIT_S, what="the answer")
    assert await pool.fetchval("SELECT status FROM tasks") == "pending" and mx.edits(reminder) == []


def _alice(room: Room) -> Any:
    """Alice in a room, as the adapter tells the core."""
    from tests.helpers import incoming

    return incoming("", user=ALICE, chat=room.id, platform="matrix", name="Alice", kind="group")


# ---- files -----------------------------------------------------------------------------------------------------


async def test_a_file_whose_url_is_not_mxc_is_never_fetched(start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI) -> None:
    room = await direct_chat(start, mx, fake_llm)
    media = mx.add_media(b"secret", "text/plain", "s.txt").rsplit("/", 1)[1]
    for i, url in enumerate([f"{mx.origin}/_matrix/media/v3/download/{SERVER}/{media}", "http://169.254.169.254/"]):
        mx.raw(room, msg(f"$ssrf{i}", {"msgtype": "m.file", "body": "see", "filename": "s.txt", "url": url}))
    await answered_after(mx, room)
    assert mx.downloads == []  # nothing fetched from anywhere


async def test_a_file_with_nul_in_its_name_is_answered_not_a_dead_letter(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    mx.send_file(room, ALICE, "re\x00port\ud800.txt", b"hello", "text/plain", caption="read it")
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the answer")
    assert "read it" in answers(mx, room.id)[0] and await dead_letters(pool) == []


async def test_an_image_declaring_10_gb_is_refused_without_a_download(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    url = mx.add_media(b"\x89PNG", "image/png", "big.png")
    info = {"mimetype": "image/png", "size": 10 * 1024**3}
    mx.say(room, ALICE, "look", extra={"msgtype": "m.image", "filename": "big.png", "url": url, "info": info})
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the answer")
    assert TOO_BIG in answers(mx, room.id)[0] and mx.downloads == []


async def test_a_download_that_fails_or_hangs_is_one_line_and_the_chat_goes_on(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(matrix_files, "MATRIX_DOWNLOAD_TIMEOUT_S", 0.2)
    room = await direct_chat(start, mx, fake_llm)
    missing = {"msgtype": "m.file", "filename": "gone.txt", "url": f"mxc://{SERVER}/gone"}
    mx.say(room, ALICE, "read this", extra=missing)
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the missing file's answer")
    assert "could not download the file from the homeserver (it answered 404)" in answers(mx, room.id)[0]
    mx.hold_downloads = asyncio.Event()
    try:
        mx.send_file(room, ALICE, "slow.txt", b"zzz", "text/plain", caption="and this")
        await mx.wait_for(lambda: len(answers(mx, room.id)) == 2, WAIT_S, what="the hanging file's answer")
    finally:
        mx.hold_downloads.set()
    assert "it took too long" in answers(mx, room.id)[1]
    await answered_after(mx, room)


# ---- the homeserver misbehaving --------------------------------------------------------------------------------


def status(code: int, body: str = "", **headers: str) -> Any:
    """A sync fault: this status and body instead of the sync's answer."""
    return lambda _: web.Response(status=code, text=body, content_type="application/json", headers=headers)


async def test_syncs_that_fail_in_every_way_are_tried_again_and_lose_nothing(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(matrix_adapter, "MATRIX_SYNC_RETRY_S", (0.01,))
    room = await direct_chat(start, mx, fake_llm)
    limited = json.dumps({"errcode": "M_LIMIT_EXCEEDED", "error": "slow down", "retry_after_ms": 20})
    mx.sync_faults += [status(500), status(500), status(429, limited), status(200, "{not json"), status(502, "<html>")]
    mx.sync_faults.append(lambda body: web.json_response({k: v for k, v in body.items() if k != "next_batch"}))
    mx.sync_faults.append(lambda body: web.json_response(["not", "a", "sync"]))
    mx.say(room, ALICE, "through it all")
    await mx.wait_for(lambda: "re: through it all" in answers(mx, room.id), WAIT_S, what="the answer")
    assert mx.sync_faults == []
    await answered_after(mx, room)
    assert answers(mx, room.id).count("re: through it all") == 1


async def test_a_send_rate_limited_several_times_arrives_once_after_the_waits_asked(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    limited = {"errcode": "M_LIMIT_EXCEEDED", "error": "Too many requests", "retry_after_ms": 50}
    mx.send_faults += [lambda: web.json_response(limited, status=429)] * 3
    before = len(mx.send_times)
    await answered_after(mx, room)
    assert answers(mx, room.id) == ["re: after"]
    times = mx.send_times[before : before + 4]
    assert all(b - a >= 0.05 for a, b in itertools.pairwise(times))  # waited as told each time
    assert wait_of({"retry_after_ms": 10**9}) == 30.0 and wait_of({"retry_after_ms": "soon"}) == 1.0


async def test_a_send_rate_limited_for_good_gives_up_and_the_chat_goes_on(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, pool: Pool, allowed_errors: list[str]
) -> None:
    allowed_errors.append("a Matrix answer failed")
    room = await direct_chat(start, mx, fake_llm)
    limited = {"errcode": "M_LIMIT_EXCEEDED", "error": "Too many requests", "retry_after_ms": 1}
    tries = MATRIX_RATE_LIMIT_TRIES + 1
    mx.send_faults += [lambda: web.json_response(limited, status=429)] * (tries + 1)  # the answer, then FAILED once
    hello = mx.say(room, ALICE, "hello")
    await answered_after(mx, room)
    assert mx.send_faults == [] and answers(mx, room.id) == [FAILED, "re: after"]
    assert await pool.fetchval(DONE, update_id(hello))  # given up on, not left to be tried again


async def test_a_room_the_bot_was_kicked_from_is_not_retried_for_ever(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    forbidden = {"errcode": "M_FORBIDDEN", "error": "You are not in this room"}
    mx.send_faults.append(lambda: web.json_response(forbidden, status=403))
    before = len(mx.send_times)
    asked = mx.say(room, ALICE, "are you there?")
    await mx.wait_for(lambda: not mx.send_faults, WAIT_S, what="the refused send")
    await answered_after(mx, room)
    assert len(mx.send_times) - before == 2  # refused once, not tried again, no note that would fail too; then the next
    assert any("(M_FORBIDDEN)" in r.getMessage() for r in caplog.records)
    assert await pool.fetchval(DONE, update_id(asked))


async def test_a_dropped_connection_mid_sync_loses_nothing(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(matrix_adapter, "MATRIX_SYNC_RETRY_S", (0.01,))
    room = await direct_chat(start, mx, fake_llm)
    mx.drop_syncs = 3
    await answered_after(mx, room)
    assert answers(mx, room.id) == ["re: after"]


# ---- a flood ---------------------------------------------------------------------------------------------------


async def test_a_strangers_flood_does_not_hold_up_an_allowed_person_elsewhere(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI
) -> None:
    room = await direct_chat(start, mx, fake_llm)
    group = mx.room(MALLORY)
    mx.join(group, ALICE)
    mx.invite(group, ALICE)
    await joined(mx, group)
    for i in range(200):  # logged with no await between: one sync carries the whole flood
        mx.say(group, MALLORY, f"spam {i}", mentions=[BOT])
    began = time.monotonic()
    await answered_after(mx, room)
    assert time.monotonic() - began < 5.0
    refusals = answers(mx, group.id)
    assert len(refusals) == 1 and MALLORY in refusals[0]  # one refusal, not 200
    assert "spam" not in json.dumps(fake_llm.requests)
