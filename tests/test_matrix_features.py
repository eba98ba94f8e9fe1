"""The Matrix adapter's features beyond the kit, on the fake homeserver with the real mautrix: `!commands` in a group
room without a mention (a personal one answered in a direct room the bot makes), `/commands` sent as text, a reaction
delivered twice presses once, files people send become the core's uploads, /link between Matrix and Telegram."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from adapters.matrix.buttons import BUTTONS_FIELD
from adapters.matrix.incoming import StoredFile, files_of, mentions, update_id, without_mention
from core import SENT_PRIVATELY, Incoming, ReminderMessage
from core.storage.db import Pool
from tests.fake_matrix import BOT, BOT_NAME, FakeMatrix, Room
from tests.helpers import WAIT_S, incoming
from tests.test_linking import CODE
from tests.test_matrix import ALICE, MALLORY, Start, answers, mx, start

__all__ = ["mx", "start"]  # the fixtures, shared with tests/test_matrix.py


async def joined(mx: FakeMatrix, room: Room) -> Room:
    """The room once the bot is in it."""
    await mx.wait_for(lambda: BOT in room.members, WAIT_S, what="the bot joining")
    return room


def directs_of(mx: FakeMatrix, user: str) -> list[Room]:
    """The direct rooms the bot made for a person."""
    return [r for r in mx.rooms.values() if r.direct and r.creator == BOT and user in r.invited | r.members]


async def test_a_command_in_a_group_needs_no_mention_and_a_personal_one_goes_to_a_direct_room(
    start: Start, mx: FakeMatrix
) -> None:
    await start()
    group = mx.room(ALICE)
    mx.invite(group, ALICE)
    await joined(mx, group)
    mx.say(group, ALICE, "!unknownword please")  # no command of the catalogue, no mention: not for the bot
    mx.say(group, ALICE, "!tasks")
    await mx.wait_for(lambda: len(directs_of(mx, ALICE)) == 1, WAIT_S, what="a direct room made for Alice")
    [direct] = directs_of(mx, ALICE)
    await mx.wait_for(lambda: answers(mx, group.id) == [SENT_PRIVATELY], WAIT_S, what="the note in the group")
    assert answers(mx, direct.id) == ["You have no open tasks. Tell me what to remember!"]
    note = next(e for e in mx.sent if e["room_id"] == group.id)
    assert note["content"]["m.relates_to"]["m.in_reply_to"]["event_id"]  # a reply to the command
    mx.say(group, ALICE, "/help")  # a /command sent as text (Element asks first) is taken too
    await mx.wait_for(lambda: len(answers(mx, group.id)) == 2, WAIT_S, what="/help's answer in the group")
    assert "!remind" in answers(mx, group.id)[1] and "/remind" not in answers(mx, group.id)[1]  # as typed here
    assert await_count(mx, direct) == 1  # nothing more went to the direct room


def await_count(mx: FakeMatrix, room: Room) -> int:
    """How many messages the bot sent into a room."""
    return len(answers(mx, room.id))


async def test_a_reaction_delivered_twice_presses_once_and_anothers_is_refused_privately(
    start: Start, mx: FakeMatrix, pool: Pool
) -> None:
    adapter = await start(ALLOWED_USERS=f"matrix:{ALICE},matrix:{MALLORY}")
    room = await joined(mx, mx.direct(ALICE))
    made = await adapter.core.command(adapter_incoming(ALICE, room.id), "remind", "tomorrow 9:00 Buy milk")
    assert not isinstance(made, str) and made is not None
    when = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
    task_id = await pool.fetchval("SELECT id FROM tasks")
    msg = ReminderMessage(task_id, when, "matrix", room.id, "", "private", ALICE, "Alice", "⏰ Buy milk")
    reminder = await adapter.send_reminder(msg)
    assert reminder is not None
    assert [b["label"] for b in mx.event(reminder)["content"][BUTTONS_FIELD]] == ["✅ Done", "😴 10 min", "😴 1 h"]
    buttons_row = "SELECT expires_at - updated_at FROM platform_state WHERE key LIKE '%:buttons:' || $1"
    assert await pool.fetchval(buttons_row, reminder) == timedelta(days=adapter.core.settings.RETENTION_DAYS)
    mx.join(room, MALLORY)
    mx.react(room, MALLORY, reminder, "✅")  # not hers: told in her own direct room
    await mx.wait_for(lambda: len(directs_of(mx, MALLORY)) == 1, WAIT_S, what="Mallory's direct room")
    [hers] = directs_of(mx, MALLORY)
    owner = "SELECT owner FROM platform_state WHERE value = $1"
    assert await pool.fetchval(owner, hers.id) == f"matrix:{MALLORY}"  # her direct room goes with her /forget_me
    await mx.wait_for(lambda: len(answers(mx, hers.id)) == 1, WAIT_S, what="the refusal")
    assert "Only the person" in answers(mx, hers.id)[0]
    assert await pool.fetchval("SELECT status FROM tasks") == "pending"
    pressed = mx.react(room, ALICE, reminder, "✅")
    await mx.wait_for(lambda: len(mx.edits(reminder)) == 1, WAIT_S, what="the reminder edited")
    assert await pool.fetchval("SELECT status FROM tasks") == "done"
    await mx.wait_for(lambda: mx.reactions(reminder) == [], WAIT_S, what="the bot's reactions taken away")
    assert await pool.fetchval(buttons_row, reminder) is None  # spent: its row is gone, not kept blank
    mx.redeliver(pressed)  # the same reaction again: the inbox has it
    mx.say(room, ALICE, "!tasks")  # answered after the redelivery (one room's events go in order)
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 2, WAIT_S, what="the next answer")
    assert len(mx.edits(reminder)) == 1
    stored = "SELECT count(*) FROM inbox WHERE update_id = $1"
    assert await pool.fetchval(stored, update_id(pressed)) == 1


def adapter_incoming(user: str, room_id: str) -> Incoming:
    """A person in their direct room, as the adapter tells the core."""
    return incoming("", user=user, chat=room_id, platform="matrix", name="Alice")


def test_files_people_send_become_the_cores_uploads() -> None:
    voice = {"msgtype": "m.audio", "body": "Voice message", "url": "mxc://s/v", "org.matrix.msc3245.voice": {}}
    assert files_of(voice, "") == (StoredFile("mxc://s/v", "voice", "Voice message", None, 0),)
    song = {"msgtype": "m.audio", "body": "song.mp3", "url": "mxc://s/a", "info": {"mimetype": "audio/mpeg"}}
    assert files_of(song, "")[0].kind == "audio"
    photo = {"msgtype": "m.image", "body": "what is this?", "filename": "p.png", "url": "mxc://s/p"}
    assert files_of(photo, "what is this?") == (StoredFile("mxc://s/p", "photo", "what is this?", "image/png", 0),)
    gif = {"msgtype": "m.image", "body": "a.gif", "url": "mxc://s/g", "info": {"mimetype": "image/gif"}}
    assert files_of(gif, "") == ()
    assert files_of({"msgtype": "m.file", "body": "x.pdf", "url": "https://elsewhere/x.pdf"}, "") == ()
    assert without_mention(f"{BOT_NAME}: hello", BOT, BOT_NAME) == "hello"
    assert without_mention(f"{BOT}, hello", BOT, BOT_NAME) == "hello"

    def said(body: str) -> dict[str, object]:
        return {"content": {"body": body}}

    assert mentions(said(f"hey {BOT_NAME.upper()}, hi"), BOT, BOT_NAME) and mentions(said(f"{BOT} hi"), BOT, BOT_NAME)
    assert not mentions(said(f"not{BOT_NAME} or {BOT_NAME}x"), BOT, BOT_NAME)
    assert mentions({"content": {"body": "hi", "m.mentions": {"user_ids": [BOT]}}}, BOT, BOT_NAME)


async def test_link_joins_a_matrix_and_a_telegram_identity_into_one_account(
    start: Start, mx: FakeMatrix, pool: Pool
) -> None:
    adapter = await start(ALLOWED_USERS=f"matrix:{ALICE},telegram:100")
    adapter.core.outboxes["matrix"] = adapter  # as bot/ runs it: the issuer is told through its platform
    room = await joined(mx, mx.direct(ALICE))
    mx.say(room, ALICE, "!link")
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the link code")
    code = CODE.search(answers(mx, room.id)[0])
    assert code is not None
    said = await adapter.core.command(incoming("", user="100", name="Ann"), "link", code.group(1))
    assert isinstance(said, str) and said.startswith(f"🔗 Linked with `matrix:{ALICE}`")
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 2, WAIT_S, what="Alice told in her direct room")
    told = answers(mx, room.id)[1]
    assert "telegram:100 (Ann) used your link code" in told and "!unlink separates" in told
    accounts = await pool.fetch("SELECT DISTINCT account_id FROM users WHERE platform_user_id IN ($1, '100')", ALICE)
    assert len(accounts) == 1


async def test_a_reply_that_names_a_button_presses_it(start: Start, mx: FakeMatrix, pool: Pool) -> None:
    adapter = await start()
    room = await joined(mx, mx.direct(ALICE))
    await adapter.core.command(adapter_incoming(ALICE, room.id), "remind", "tomorrow 9:00 Buy milk")
    when = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
    task_id = await pool.fetchval("SELECT id FROM tasks")
    msg = ReminderMessage(task_id, when, "matrix", room.id, "", "private", ALICE, "Alice", "⏰ Buy milk")
    reminder = await adapter.send_reminder(msg)
    assert reminder is not None
    mx.say(room, ALICE, "> ⏰ Buy milk\n\nSnooze", reply_to=reminder)  # a client that quotes what it replies to
    await mx.wait_for(lambda: len(mx.edits(reminder)) == 1, WAIT_S, what="the reminder edited")
    assert "😴 Snoozed: Buy milk" in mx.text(reminder)
    assert await pool.fetchval("SELECT status FROM tasks") == "pending"


async def test_admins_and_allowed_users_name_matrix_identities_whole(start: Start) -> None:
    adapter = await start(ADMINS=f"matrix:{ALICE},telegram:1", ALLOWED_USERS=f"matrix:{MALLORY}")
    alice, mallory = adapter_incoming(ALICE, "!r:s"), adapter_incoming(MALLORY, "!r:s")
    assert adapter.core.is_admin(alice) and adapter.core.is_allowed(alice)  # `:` inside the id is kept
    assert adapter.core.is_allowed(mallory) and not adapter.core.is_admin(mallory)
    other = adapter_incoming("@alice:elsewhere.test", "!r:s")  # the same name on another homeserver is not her
    assert not adapter.core.is_allowed(other)
