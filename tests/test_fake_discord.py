"""Tests for the fake Discord server driven by the real discord.py."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import discord
import pytest
import yarl
from discord import app_commands

from tests.fake_discord import EPHEMERAL, FakeDiscord, FakeInteraction


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    """A started fake Discord with discord.py pointed at it."""
    async with FakeDiscord(token="test-token") as server:
        monkeypatch.setattr(discord.http.Route, "BASE", server.api_base)
        monkeypatch.setattr(discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(server.gateway_url))
        yield server
        assert server.unknown_requests == []


def _intents(*, message_content: bool = True) -> discord.Intents:
    """Default intents, with or without the privileged message content intent."""
    intents = discord.Intents.default()
    intents.message_content = message_content
    return intents


@contextlib.asynccontextmanager
async def running(fake: FakeDiscord, client: discord.Client) -> AsyncIterator[discord.Client]:
    """Log the client in, connect it and wait until ready; close it (and its connect task) afterwards."""
    await client.login(fake.token)
    task = asyncio.create_task(client.connect())
    try:
        async with asyncio.timeout(5):
            await client.wait_until_ready()
        yield client
    finally:
        await client.close()
        await asyncio.wait_for(task, 5)


def _client(**kw: Any) -> discord.Client:
    """A plain client with a short guild_ready_timeout."""
    kw.setdefault("intents", _intents())
    return discord.Client(guild_ready_timeout=0.05, **kw)


class Changes:
    """Client-side handlers call notify(); tests wait for a condition on what they recorded."""

    def __init__(self) -> None:
        """Nothing seen yet."""
        self._condition = asyncio.Condition()

    async def notify(self) -> None:
        """Wake everyone waiting for a change."""
        async with self._condition:
            self._condition.notify_all()

    async def until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until predicate() holds."""
        async with asyncio.timeout(timeout), self._condition:
            await self._condition.wait_for(predicate)


def _collect(client: discord.Client, waiter: Changes) -> list[discord.Message]:
    """Record every on_message of a client (its own messages included)."""
    seen: list[discord.Message] = []

    async def on_message(message: discord.Message) -> None:
        seen.append(message)
        await waiter.notify()

    client.event(on_message)
    return seen


@contextlib.asynccontextmanager
async def listening(
    fake: FakeDiscord, client: discord.Client | None = None
) -> AsyncIterator[tuple[discord.Client, Changes, list[discord.Message]]]:
    """A running client (a plain one unless given) whose messages are recorded in `seen`; `w` wakes on each."""
    client = client or _client()
    w = Changes()
    seen = _collect(client, w)
    async with running(fake, client):
        yield client, w, seen


async def test_login_connect_and_ready(fake: FakeDiscord) -> None:
    """The client logs in, identifies and sees the guild, its channels, the thread and itself."""
    client = _client()
    async with running(fake, client):
        assert client.user is not None and str(client.user.id) == fake.bot_user["id"]
        assert client.application_id == int(fake.application_id)
        guild = client.get_guild(int(fake.guild_id))
        assert guild is not None and not guild.unavailable
        channel = guild.get_channel(int(fake.channel_id))
        assert isinstance(channel, discord.TextChannel) and channel.name == "general"
        assert isinstance(guild.get_channel(int(fake.other_channel_id)), discord.TextChannel)
        thread = guild.get_thread(int(fake.thread_id))
        assert thread is not None and thread.parent_id == int(fake.channel_id)
        assert guild.me is not None and guild.me.id == client.user.id
        assert channel.permissions_for(guild.me).send_messages
        assert fake.identify_count == 1 and fake.resume_count == 0
        assert fake.gateway_connections == ["/"]
        assert fake.heartbeats >= 1
    assert [r[:2] for r in fake.requests[:2]] == [("GET", "/users/@me"), ("GET", "/oauth2/applications/@me")]


async def test_bad_token_is_refused(fake: FakeDiscord) -> None:
    """A wrong token fails at login with 401."""
    client = _client()
    with pytest.raises(discord.LoginFailure):
        await client.login("wrong")
    await client.close()


async def test_guild_message_reaches_on_message(fake: FakeDiscord) -> None:
    """A posted guild message (mentioning the bot) arrives with author, mentions and guild."""
    async with listening(fake) as (client, w, seen):
        ann = fake.user(42_000_000_000_000_001, "ann")
        posted = await fake.post_message(ann, "hello there", mention_bot=True)
        await w.until(lambda: len(seen) == 1)
        message = seen[0]
        assert message.id == int(posted["id"])
        assert message.content == f"<@{fake.bot_user['id']}> hello there"
        assert message.author.id == int(ann["id"]) and isinstance(message.author, discord.Member)
        assert message.guild is not None and message.guild.id == int(fake.guild_id)
        assert client.user is not None and client.user.mentioned_in(message)
        assert isinstance(message.channel, discord.TextChannel) and message.channel.id == int(fake.channel_id)

        await fake.post_message(ann, "in the thread", channel_id=fake.thread_id)
        await w.until(lambda: len(seen) == 2)
        assert isinstance(seen[1].channel, discord.Thread)


async def test_message_content_needs_the_intent(fake: FakeDiscord) -> None:
    """Without the message content intent, guild messages arrive empty unless they mention the bot."""
    async with listening(fake, _client(intents=_intents(message_content=False))) as (_, w, seen):
        ann = fake.user(42_000_000_000_000_001, "ann")
        await fake.post_message(ann, "secret")
        await fake.post_message(ann, "for you", mention_bot=True)
        await fake.post_message(ann, "dm text", dm=True)
        await w.until(lambda: len(seen) == 3)
        assert [m.content for m in seen] == ["", f"<@{fake.bot_user['id']}> for you", "dm text"]


async def test_dm_reaches_on_message(fake: FakeDiscord) -> None:
    """A DM arrives in a DMChannel without a guild; the bot answers in the same channel."""
    async with listening(fake) as (_, w, seen):
        bob = fake.user(42_000_000_000_000_002, "bob")
        posted = await fake.post_message(bob, "psst", dm=True)
        assert "guild_id" not in posted and posted["channel_id"] == fake.dm_channel_id(bob["id"])
        await w.until(lambda: len(seen) == 1)
        assert isinstance(seen[0].channel, discord.DMChannel) and seen[0].guild is None
        await seen[0].channel.send("hi bob")
        dm = await seen[0].author.create_dm()
        assert dm.id == int(posted["channel_id"])
        await fake.wait_sent(1)
        assert fake.sent[0]["channel_id"] == posted["channel_id"] and "guild_id" not in fake.sent[0]


async def test_send_with_view_reply_edit_and_own_echo(fake: FakeDiscord) -> None:
    """A message with a button is recorded with its components, echoes back, can be replied to and edited."""
    async with listening(fake) as (client, w, seen):
        channel = client.get_channel(int(fake.channel_id))
        assert isinstance(channel, discord.TextChannel)
        view = discord.ui.View(timeout=None)
        view.add_item(discord.ui.Button(label="Go", custom_id="go", style=discord.ButtonStyle.primary))
        async with channel.typing():
            sent = await channel.send("pick one", view=view)
        assert fake.typing == [fake.channel_id]
        record = fake.sent[0]
        assert record["id"] == str(sent.id) and record["content"] == "pick one"
        button = record["components"][0]["components"][0]
        assert button["custom_id"] == "go" and button["label"] == "Go" and button["type"] == 2
        assert "allowed_mentions" not in record and record["flags"] == 0  # nothing sent, nothing recorded
        await w.until(lambda: len(seen) == 1)
        assert seen[0].author == client.user  # the bot's own message comes back over the gateway

        reply = await sent.reply("a reply", mention_author=False)
        await fake.wait_sent(2)
        assert fake.sent[1]["message_reference"]["message_id"] == str(sent.id)
        assert fake.sent[1]["type"] == 19 and fake.sent[1]["allowed_mentions"]["replied_user"] is False
        assert reply.reference is not None and reply.reference.message_id == sent.id

        edited = await sent.edit(content="picked", view=None)
        assert edited.content == "picked" and fake.sent[0]["content"] == "picked"
        assert fake.sent[0]["components"] == [] and fake.edits[0]["message_id"] == str(sent.id)
        fetched = await channel.fetch_message(sent.id)
        assert fetched.content == "picked" and fetched.edited_at is not None

        await sent.add_reaction("👍")
        assert fake.reactions == [(str(sent.id), "👍")]
        await sent.delete()
        assert fake.deleted == [str(sent.id)]


async def test_validation_errors(fake: FakeDiscord) -> None:
    """Too long and empty messages are refused like Discord does."""
    client = _client()
    async with running(fake, client):
        channel = client.get_channel(int(fake.channel_id))
        assert isinstance(channel, discord.TextChannel)
        with pytest.raises(discord.HTTPException) as too_long:
            await channel.send("x" * 2001)
        assert too_long.value.status == 400 and too_long.value.code == 50035
        assert "content" in too_long.value.text and "2000" in too_long.value.text
        with pytest.raises(discord.HTTPException) as empty:
            await channel.send()
        assert empty.value.code == 50006
        await channel.send("x" * 2000)
        with pytest.raises(discord.NotFound):
            await channel.fetch_message(1)
        assert len(fake.sent) == 1


async def test_files_both_ways(fake: FakeDiscord) -> None:
    """User attachments can be downloaded; the bot's files go multipart and are recorded."""
    async with listening(fake) as (_, w, seen):
        ann = fake.user(42_000_000_000_000_001, "ann")
        attachment = {"filename": "note.txt", "data": b"hello file", "content_type": "text/plain"}
        await fake.post_message(ann, "see attached", attachments=[attachment])
        await w.until(lambda: len(seen) == 1)
        assert await seen[0].attachments[0].read() == b"hello file"
        sent = await seen[0].channel.send("back", file=discord.File(io.BytesIO(b"abc"), filename="out.bin"))
        assert sent.attachments[0].filename == "out.bin" and sent.attachments[0].size == 3
        assert fake.sent[0]["attachments"][0]["filename"] == "out.bin"


def _tree_client() -> tuple[discord.Client, app_commands.CommandTree[discord.Client], list[str]]:
    """A client whose command tree has /ask (ephemeral answer) and /slow (deferred); the list records questions."""
    client = _client()
    tree: app_commands.CommandTree[discord.Client] = app_commands.CommandTree(client)
    asked: list[str] = []

    @tree.command(name="ask", description="Ask the assistant")
    async def ask(interaction: discord.Interaction, question: str, count: int = 1) -> None:
        asked.append(question)
        await interaction.response.send_message(f"answer to {question} x{count}", ephemeral=True)

    @tree.command(name="slow", description="A slow answer")
    async def slow(interaction: discord.Interaction) -> None:
        await interaction.response.defer(thinking=True)
        await interaction.followup.send("done thinking")
        original = await interaction.original_response()
        await original.edit(content="done thinking (edited)")

    return client, tree, asked


async def test_slash_command_sync_and_ephemeral_answer(fake: FakeDiscord) -> None:
    """A synced command runs when invoked and its ephemeral answer is recorded."""
    client, tree, asked = _tree_client()
    async with running(fake, client):
        synced = await tree.sync()
        assert fake.command_puts == 1 and {c.name for c in synced} == {"ask", "slow"}
        assert [c["name"] for c in fake.commands] == ["ask", "slow"]
        fetched = await tree.fetch_commands()
        assert {c.id for c in fetched} == {int(c["id"]) for c in fake.commands}

        ann = fake.user(42_000_000_000_000_001, "ann")
        it = await fake.slash("ask", {"question": "life", "count": "3"}, ann)
        await it.wait_done()
        assert asked == ["life"]
        assert it.responses[0]["type"] == 4 and it.responses[0]["data"]["flags"] & EPHEMERAL
        assert it.ephemeral and it.texts() == ["answer to life x3"]
        assert it.payload["data"]["options"] == [
            {"name": "question", "type": 3, "value": "life"},
            {"name": "count", "type": 4, "value": 3},
        ]

        dm_it = await fake.slash("ask", {"question": "dm"}, ann, dm=True)
        await dm_it.wait_done()
        assert dm_it.texts() == ["answer to dm x1"]
        with pytest.raises(ValueError, match="not registered"):
            await fake.slash("nope", None, ann)


async def test_deferred_answer_followup_and_edit(fake: FakeDiscord) -> None:
    """A thinking deferral is completed by the followup, then the original is edited."""
    client, tree, _ = _tree_client()
    async with listening(fake, client) as (_, w, seen):
        await tree.sync()
        it = await fake.slash("slow", None, fake.user(42_000_000_000_000_001, "ann"))
        await it.wait_done()
        await fake.wait_for(lambda: len(it.edits) == 1)
        assert [r["type"] for r in it.responses] == [5]
        assert not it.ephemeral
        assert it.texts() == ["done thinking", "done thinking (edited)"]
        assert it.message is not None and it.message["content"] == "done thinking (edited)"
        await w.until(lambda: any(m.interaction_metadata is not None for m in seen))


class _Persistent(discord.ui.View):
    """A persistent view whose button edits the message in place."""

    def __init__(self) -> None:
        """No timeout, fixed custom id."""
        super().__init__(timeout=None)
        self.pressed: list[int] = []

    @discord.ui.button(label="Done", custom_id="persistent:done")
    async def done(self, interaction: discord.Interaction, button: discord.ui.Button[_Persistent]) -> None:
        """Record who pressed it and edit the message to say it is done."""
        self.pressed.append(interaction.user.id)
        await interaction.response.edit_message(content="marked done", view=None)


class _Counter(discord.ui.DynamicItem[discord.ui.Button[discord.ui.View]], template=r"counter:(?P<n>\d+)"):
    """A dynamic button carrying a number in its custom id."""

    def __init__(self, n: int) -> None:
        """A button for n."""
        super().__init__(discord.ui.Button(label=str(n), custom_id=f"counter:{n}"))
        self.n = n

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> _Counter:
        """Rebuild from the custom id."""
        return cls(int(match["n"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        """Answer with the next number."""
        await interaction.response.send_message(f"next is {self.n + 1}", ephemeral=True)


async def test_clicks_reach_persistent_view_and_dynamic_item(fake: FakeDiscord) -> None:
    """Button clicks dispatch to a persistent view (updating the message) and to a DynamicItem."""
    client = _client()
    persistent = _Persistent()
    client.add_view(persistent)
    client.add_dynamic_items(_Counter)
    async with running(fake, client):
        channel = client.get_channel(int(fake.channel_id))
        assert isinstance(channel, discord.TextChannel)
        # a message the bot sent before a restart: only the persistent view registered at startup knows it
        task = await fake.post_message(fake.bot_user, "task", components=_Persistent().to_components())
        counter_view = discord.ui.View(timeout=None)
        counter_view.add_item(_Counter(41))
        await channel.send("count", view=counter_view)
        await fake.wait_sent(1)
        ann = fake.user(42_000_000_000_000_001, "ann")

        it = await fake.click(task, "persistent:done", ann)
        await it.wait_done()
        assert persistent.pressed == [int(ann["id"])]
        assert it.responses[0]["type"] == 7 and it.texts() == ["marked done"]
        assert task["content"] == "marked done" and task["components"] == []
        assert fake.message(task["id"]) is task

        it2 = await fake.click(fake.sent[0], "counter:41", ann)
        await it2.wait_done()
        assert it2.texts() == ["next is 42"] and it2.ephemeral

        with pytest.raises(ValueError, match="no component"):
            await fake.click(fake.sent[0], "counter:99", ann)


async def test_reconnect_resumes_and_replays(fake: FakeDiscord) -> None:
    """After op 7 the client resumes on resume_gateway_url; messages sent meanwhile are replayed."""
    client = _client()
    w = Changes()
    seen = _collect(client, w)
    resumed: list[bool] = []

    async def on_resumed() -> None:
        resumed.append(True)
        await w.notify()

    client.event(on_resumed)
    async with running(fake, client):
        ann = fake.user(42_000_000_000_000_001, "ann")
        await fake.post_message(ann, "before")
        await w.until(lambda: len(seen) == 1)
        await fake.reconnect()
        await fake.post_message(ann, "while away")  # queued: no live connection until the RESUME
        await fake.wait_ready()
        await fake.post_message(ann, "after")
        await w.until(lambda: len(seen) == 3)
        assert [m.content for m in seen] == ["before", "while away", "after"]
        assert fake.resume_count == 1 and fake.identify_count == 1
        assert fake.gateway_connections == ["/", "/resume"]
        await w.until(lambda: resumed == [True])

        await fake.disconnect(4000)  # an abrupt close is resumed as well
        await fake.wait_ready()
        await fake.post_message(ann, "again")
        await w.until(lambda: len(seen) == 4)
        assert fake.resume_count == 2 and fake.identify_count == 1


async def test_rate_limited_send_is_retried(fake: FakeDiscord) -> None:
    """A scripted 429 on POST messages is slept off and retried by discord.py."""
    client = _client()
    async with running(fake, client):
        channel = client.get_channel(int(fake.channel_id))
        assert isinstance(channel, discord.TextChannel)
        fake.rate_limit_next("POST /channels/", retry_after=0.05)
        sent = await channel.send("eventually")
        assert sent.content == "eventually"
        assert fake.rate_limited == [f"POST /channels/{fake.channel_id}/messages"]
        assert len(fake.sent) == 1


async def test_scripted_failures_surface_as_discord_errors(fake: FakeDiscord) -> None:
    """fail_next answers one matching request with a Discord error; discord.py raises the matching exception."""
    client = _client()
    async with running(fake, client):
        channel = client.get_partial_messageable(int(fake.channel_id))
        fake.fail_next("POST /channels/", 403, 50013, "Missing Permissions")
        with pytest.raises(discord.Forbidden) as refused:
            await channel.send("not allowed")
        assert (refused.value.status, refused.value.code, refused.value.text) == (403, 50013, "Missing Permissions")
        fake.fail_next("POST /channels/", 503, 0, "upstream connect error")
        with pytest.raises(discord.DiscordServerError):
            await channel.send("down")
        assert fake.failed == [f"POST /channels/{fake.channel_id}/messages"] * 2 and fake.sent == []
        assert (await channel.send("fine")).content == "fine"


async def test_interaction_callbacks_are_checked(fake: FakeDiscord) -> None:
    """A second answer to one interaction is refused (40060) and surfaces as InteractionResponded or HTTP 400."""
    client = _client()
    tree: app_commands.CommandTree[discord.Client] = app_commands.CommandTree(client)
    errors: list[BaseException] = []
    w = Changes()

    @tree.command(name="twice", description="Answers twice")
    async def twice(interaction: discord.Interaction) -> None:
        await interaction.response.send_message("one")
        try:
            await interaction.response.send_message("two")
        except discord.InteractionResponded as e:
            errors.append(e)
            await w.notify()

    async with running(fake, client):
        await tree.sync()
        it: FakeInteraction = await fake.slash("twice", None, fake.user(42_000_000_000_000_001, "ann"))
        await it.wait_done()
        await w.until(lambda: len(errors) == 1)
        assert it.texts() == ["one"] and not it.ephemeral


class _Feedback(discord.ui.Modal, title="Feedback"):
    """A modal with one text field."""

    text: discord.ui.TextInput[_Feedback] = discord.ui.TextInput(label="Your feedback", custom_id="feedback:text")

    async def on_submit(self, interaction: discord.Interaction) -> None:
        """Thank the user."""
        await interaction.response.send_message(f"thanks: {self.text.value}", ephemeral=True)


async def test_modal_opened_and_submitted(fake: FakeDiscord) -> None:
    """A command answers with a modal; the submitted values reach on_submit."""
    client = _client()
    tree: app_commands.CommandTree[discord.Client] = app_commands.CommandTree(client)

    @tree.command(name="feedback", description="Give feedback")
    async def feedback(interaction: discord.Interaction) -> None:
        await interaction.response.send_modal(_Feedback())

    async with running(fake, client):
        await tree.sync()
        ann = fake.user(42_000_000_000_000_001, "ann")
        opened = await fake.slash("feedback", None, ann)
        await opened.wait_done()
        assert opened.responses[0]["type"] == 9 and opened.responses[0]["data"]["title"] == "Feedback"
        with pytest.raises(ValueError, match="required"):
            await fake.submit_modal(opened, {})
        submitted = await fake.submit_modal(opened, {"feedback:text": "great"})
        await submitted.wait_done()
        assert submitted.texts() == ["thanks: great"] and submitted.ephemeral


async def test_events_before_the_first_identify_are_delivered(fake: FakeDiscord) -> None:
    """A message posted before the client connects arrives right after READY."""
    ann = fake.user(42_000_000_000_000_001, "ann")
    await fake.post_message(ann, "early")
    async with listening(fake) as (_, w, seen):
        await w.until(lambda: len(seen) == 1)
        assert seen[0].content == "early" and seen[0].guild is not None


async def test_gateway_refuses_a_wrong_token(fake: FakeDiscord) -> None:
    """IDENTIFY with a token the gateway does not accept is closed with 4004 and discord.py gives up."""
    client = _client()
    await client.login(fake.token)
    fake.token = "rotated"
    with pytest.raises(discord.ConnectionClosed) as closed:
        await asyncio.wait_for(client.connect(), 5)
    assert closed.value.code == 4004 and fake.gateway_closes == [4004]
    assert fake.identify_count == 0
    await client.close()


async def test_privileged_intents_must_be_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking for a privileged intent the application lacks is closed with 4014."""
    async with FakeDiscord(enabled_intents=0) as server:
        monkeypatch.setattr(discord.http.Route, "BASE", server.api_base)
        monkeypatch.setattr(discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(server.gateway_url))
        client = _client()  # asks for message_content
        await client.login(server.token)
        with pytest.raises(discord.PrivilegedIntentsRequired):
            await asyncio.wait_for(client.connect(), 5)
        await client.close()
        assert server.gateway_closes == [4014]


async def test_shards_identify_apart_and_get_only_their_guilds_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two AutoShardedClients (shard 0 and shard 1 of 2) stay connected side by side; the guild (owned by
    shard 1) and its messages reach only shard 1, DMs only shard 0; a bad shard is closed with 4010."""
    async with FakeDiscord(token="test-token", guild_shard=(1, 2)) as fake:
        monkeypatch.setattr(discord.http.Route, "BASE", fake.api_base)
        monkeypatch.setattr(discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(fake.gateway_url))
        assert fake.shard_of(fake.guild_id) == 0  # before any IDENTIFY the fake knows of one shard
        clients = [
            discord.AutoShardedClient(intents=_intents(), guild_ready_timeout=0.05, shard_count=2, shard_ids=[shard])
            for shard in (0, 1)
        ]
        w = Changes()
        seen = [_collect(c, w) for c in clients]
        async with running(fake, clients[0]), running(fake, clients[1]):
            assert sorted(map(tuple, fake.identified_shards)) == [(0, 2), (1, 2)]  # type: ignore[arg-type]
            assert fake.shard_connected(0) and fake.shard_connected(1) and fake.shard_of(fake.guild_id) == 1
            assert clients[0].get_guild(int(fake.guild_id)) is None
            assert clients[1].get_guild(int(fake.guild_id)) is not None
            alice = fake.user(2001, "Alice")
            await fake.post_message(alice, "in the guild", mention_bot=True)
            await fake.post_message(alice, "a dm", dm=True)
            await w.until(lambda: len(seen[0]) + len(seen[1]) == 2)
            assert [m.content for m in seen[0]] == ["a dm"]
            assert [m.content for m in seen[1]] == [f"<@{fake.bot_user['id']}> in the guild"]
        bad = discord.AutoShardedClient(intents=_intents(), shard_count=2, shard_ids=[0])
        await bad.login(fake.token)
        ws = await bad.http.ws_connect(fake.gateway_url)
        await ws.receive()  # HELLO
        await ws.send_json({"op": 2, "d": {"token": fake.token, "intents": 1, "shard": [2, 2], "properties": {}}})
        closed = await ws.receive()
        assert closed.type is aiohttp.WSMsgType.CLOSE and closed.data == 4010
        await ws.close()
        await bad.close()
