"""The fake homeserver answers the real mautrix client as a homeserver does: a password login hands out a token, /sync
long-polls and resumes from a stored next_batch, a resent transaction is one event, media goes up and comes back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from mautrix.client import ClientAPI
from mautrix.errors import MForbidden, MUnknownToken
from mautrix.types import ContentURI, EventType, RoomID, SyncToken, TextMessageEventContent, UserID

from tests.fake_matrix import BOT, PASSWORD, SERVER, TOKEN, FakeMatrix
from tests.helpers import WAIT_S

ALICE = UserID(f"@alice:{SERVER}")


@pytest.fixture
async def mx() -> AsyncIterator[FakeMatrix]:
    """A fake homeserver with Alice on it."""
    async with FakeMatrix() as fake:
        fake.person(ALICE, "Alice")
        yield fake


@pytest.fixture
async def client(mx: FakeMatrix) -> AsyncIterator[ClientAPI]:
    """The real mautrix client, signed in with the bot's token."""
    api = ClientAPI(UserID(BOT), base_url=mx.origin, token=TOKEN)
    try:
        yield api
    finally:
        await api.api.session.close()


async def test_a_password_login_hands_out_a_token_that_whoami_knows(mx: FakeMatrix) -> None:
    api = ClientAPI(UserID(BOT), base_url=mx.origin)
    try:
        with pytest.raises(MForbidden):
            await api.login(password="wrong")
        login = await api.login(password=PASSWORD, device_name="assistant")
        assert login.user_id == BOT and api.api.token == login.access_token
        assert (await api.whoami()).user_id == BOT
        api.api.token = "syt_wrong"
        with pytest.raises(MUnknownToken):
            await api.whoami()
    finally:
        await api.api.session.close()


async def test_sync_long_polls_and_resumes_from_next_batch(mx: FakeMatrix, client: ClientAPI) -> None:
    first = await client.sync(timeout=0)
    assert first["rooms"]["invite"] == {} and first["next_batch"] == mx.next_batch
    room = mx.direct(ALICE)
    invited = await client.sync(since=SyncToken(first["next_batch"]), timeout=0)
    state = invited["rooms"]["invite"][room.id]["invite_state"]["events"]
    assert any(e["state_key"] == BOT and e["content"]["is_direct"] for e in state)
    await client.join_room_by_id(RoomID(room.id))
    joined = await client.sync(since=SyncToken(invited["next_batch"]), timeout=0)
    poll = client.sync(since=SyncToken(joined["next_batch"]), timeout=int(WAIT_S * 1000))
    event_id = mx.say(room, ALICE, "hello")
    got = await poll
    events = got["rooms"]["join"][room.id]["timeline"]["events"]
    assert [e["event_id"] for e in events] == [event_id] and events[0]["content"]["body"] == "hello"
    again = await client.sync(since=SyncToken(joined["next_batch"]), timeout=0)  # a restart from the stored token
    assert [e["event_id"] for e in again["rooms"]["join"][room.id]["timeline"]["events"]] == [event_id]


async def test_a_dropped_sync_answer_is_had_again_from_the_same_since(mx: FakeMatrix, client: ClientAPI) -> None:
    room = mx.room(ALICE)
    mx.invite(room, ALICE)
    await client.join_room_by_id(RoomID(room.id))
    since = SyncToken(mx.next_batch)
    event_id = mx.say(room, ALICE, "are you there?")
    mx.drop_syncs = 1
    try:  # aiohttp itself may try a GET again on a fresh connection when a pooled one closes under it
        got = await client.sync(since=since, timeout=0)
    except Exception:  # the connection closed: whichever error aiohttp raises for it
        got = await client.sync(since=since, timeout=0)
    assert [e["event_id"] for e in got["rooms"]["join"][room.id]["timeline"]["events"]] == [event_id]
    assert [q["since"] for q in mx.syncs if "since" in q] == [since, since]


async def test_a_resent_transaction_is_one_event_and_redaction_is_recorded(mx: FakeMatrix, client: ClientAPI) -> None:
    room = mx.direct(ALICE)
    with pytest.raises(MForbidden):
        await client.send_text(RoomID(room.id), "not in yet")
    await client.join_room_by_id(RoomID(room.id))
    content = TextMessageEventContent(body="hi Alice")
    first = await client.send_message_event(RoomID(room.id), EventType.ROOM_MESSAGE, content, txn_id="t1")
    again = await client.send_message_event(RoomID(room.id), EventType.ROOM_MESSAGE, content, txn_id="t1")
    assert first == again and [e["content"]["body"] for e in mx.sent] == ["hi Alice"]
    await client.redact(RoomID(room.id), first, reason="draft")
    assert mx.redactions == [{"room_id": room.id, "redacts": first, "reason": "draft"}]


async def test_media_goes_up_and_comes_back(mx: FakeMatrix, client: ClientAPI) -> None:
    uri = await client.upload_media(b"%PDF-1.4 export", mime_type="application/pdf", filename="export.pdf")
    assert await client.download_media(uri) == b"%PDF-1.4 export"
    theirs = mx.add_media(b"hello file", "text/plain", "notes.txt")
    assert await client.download_media(ContentURI(theirs)) == b"hello file"
