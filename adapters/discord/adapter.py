"""The Discord adapter (discord.py 2): messages and slash commands → Incoming, core events → Markdown replies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import aclosing
from typing import Any, Literal, cast

import aiohttp
import discord
import yarl
from discord import app_commands
from discord.abc import Messageable
from discord.gateway import DiscordWebSocket
from discord.shard import Shard

from adapters.discord.endpoints import (
    EndpointHTTP,
    Endpoints,
    GatewayUnreachable,
    reason_of,
    scope_webhooks,
    use_endpoints,
)
from adapters.discord.limits import (
    DISCORD_CUT_NOTE_S,
    DISCORD_IDENTIFY_SPACING_S,
    DISCORD_MESSAGE_LIMIT,
    DISCORD_READY_TIMEOUT_S,
    DISCORD_RETRY_FIRST_S,
    DISCORD_RETRY_MAX_S,
    DISCORD_TYPING_EVERY_S,
)
from adapters.discord.render import render_reply, split_markdown, steps_text, with_steps, without_steps
from core import (
    EXIT_UNREACHABLE,
    MEMORY_WIPE_CONFIRM,
    RESTARTING,
    Assistant,
    CommandArgs,
    CommandName,
    Core,
    DeliveryRefused,
    Error,
    Incoming,
    Quoted,
    ReminderMessage,
    Settings,
    StartupError,
    summary_line,
)

log = logging.getLogger(__name__)

TEXT_ONLY = "I can only read text for now — please type your message (text next to an attachment works too)."
FAILED = "Sorry, something went wrong on my side. Please try again in a moment."
WIPE_LABEL = "Yes, wipe my memory"
NOT_YOUR_BUTTON = "This button is not for you: use /memory action:wipe to erase your own memory."
BUTTON_LABELS = {"done": "✅ Done", "snooze10": "😴 10 min", "snooze60": "😴 1 h"}
CUT_SHORT = "Sorry — I was restarting and had to stop working on that. Please ask again in a minute."
NO_MENTIONS = discord.AllowedMentions.none()  # every send pings nobody (not even the author it replies to) …
# permanent refusals of a reminder send (Discord JSON error codes) → the reason shown in /tasks
REFUSALS = {
    10003: "the channel no longer exists",
    50001: "the bot has no access to the channel",
    50013: "the bot lacks permission to post in the channel",
    50007: "the user does not accept direct messages from the bot",
}
_MENTION = re.compile(r"<@!?(\d+)>")
UNKNOWN_AUTHOR = "an unknown author"
# the slash commands work in servers and in a user's DM with the bot, through the server install only: never in a
# group DM or another DM (a user install), where a person's private answers would be seen by others
COMMAND_CONTEXTS = app_commands.AppCommandContext(guild=True, dm_channel=True, private_channel=False)
COMMAND_INSTALLS = app_commands.AppInstallationType(guild=True, user=False)


def owner_ping(owner_id: str) -> discord.AllowedMentions:
    """… except a reminder, which pings its owner and nobody else."""
    return discord.AllowedMentions(
        everyone=False, roles=False, replied_user=False, users=[discord.Object(int(owner_id))]
    )


class StepsButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=r"steps:(?P<turn>\d+)(?P<shown>:shown)?"):
    """The persistent "Show steps" button; its custom id carries the turn id (and the DM toggle state)."""

    def __init__(self, turn_id: int, shown: bool = False) -> None:
        """A Show (or, when shown, Hide) button for one turn."""
        super().__init__(
            discord.ui.Button(
                label="Hide steps" if shown else "Show steps",
                emoji="🔧",
                style=discord.ButtonStyle.secondary,
                custom_id=f"steps:{turn_id}{':shown' if shown else ''}",
            )
        )
        self.turn_id, self.shown = turn_id, shown

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> StepsButton:
        """Rebuild the button from a pressed custom id (works after restarts)."""
        return cls(int(match["turn"]), bool(match["shown"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        """Show the steps (ephemeral in servers, toggled in place in DMs)."""
        adapter = _adapter_of(interaction)
        await adapter.guard(interaction, adapter.show_steps(interaction, self.turn_id, self.shown))


class ReminderButton(
    discord.ui.DynamicItem[discord.ui.Button[Any]], template=r"rem:(?P<action>done|snooze10|snooze60):(?P<task>\d+)"
):
    """Done / Snooze on a reminder; the custom id carries the action and the task id."""

    def __init__(self, action: str, task_id: int) -> None:
        """One reminder button."""
        style = discord.ButtonStyle.success if action == "done" else discord.ButtonStyle.secondary
        super().__init__(
            discord.ui.Button(label=BUTTON_LABELS[action], style=style, custom_id=f"rem:{action}:{task_id}")
        )
        self.action, self.task_id = action, task_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> ReminderButton:
        """Rebuild the button from a pressed custom id."""
        return cls(match["action"], int(match["task"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        """Only the owner may press; the reminder is edited to show what happened."""
        adapter = _adapter_of(interaction)
        await adapter.guard(interaction, adapter.press_reminder(interaction, self.action, self.task_id))


class WipeButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=r"mem:wipe:(?P<owner>\d+)"):
    """The wipe confirmation under /memory action:wipe; the custom id names who it was offered to (a press by
    anyone else does nothing: the core always acts on the presser's own memory)."""

    def __init__(self, owner_id: int) -> None:
        """The button for one person."""
        super().__init__(
            discord.ui.Button(
                label=WIPE_LABEL, emoji="🗑", style=discord.ButtonStyle.danger, custom_id=f"mem:wipe:{owner_id}"
            )
        )
        self.owner_id = owner_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> WipeButton:
        """Rebuild the button from a pressed custom id."""
        return cls(int(match["owner"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        """Wipe the presser's memory when it is theirs to wipe."""
        adapter = _adapter_of(interaction)
        await adapter.guard(interaction, adapter.press_wipe(interaction, self.owner_id))


def _adapter_of(interaction: discord.Interaction) -> DiscordAdapter:
    """The adapter behind the client that received the interaction."""
    return cast(_Client, interaction.client).adapter


def _view(*items: discord.ui.Item[Any]) -> discord.ui.View:
    """A view made of persistent items (never expires; not tracked per message by discord.py)."""
    view = discord.ui.View(timeout=None)
    for item in items:
        view.add_item(item)
    return view


def _canonical(commands: Sequence[dict[str, Any]]) -> list[Any]:
    """The parts of application commands that matter for deciding whether to sync."""

    def opt(o: dict[str, Any]) -> tuple[Any, ...]:
        return (o.get("name"), o.get("description"), o.get("type"), bool(o.get("required", False)),
                tuple(opt(x) for x in o.get("options") or []))  # fmt: skip

    return sorted(
        (c.get("name"), c.get("description"), c.get("type", 1), tuple(opt(o) for o in c.get("options") or []),
         tuple(sorted(c.get("contexts") or ())), tuple(sorted(c.get("integration_types") or ())))
        for c in commands
    )  # fmt: skip


class _Client(discord.Client):
    """discord.Client that hands every event to the adapter."""

    def __init__(
        self, adapter: DiscordAdapter, intents: discord.Intents, guild_ready_timeout: float, endpoints: Endpoints,
        **shards: Any,
    ) -> None:  # fmt: skip
        """A client with no default mentions, our endpoints and a command tree (`shards`: shard_count, shard_ids)."""
        super().__init__(
            intents=intents, allowed_mentions=NO_MENTIONS, guild_ready_timeout=guild_ready_timeout,
            chunk_guilds_at_startup=False, **shards,
        )  # fmt: skip
        use_endpoints(self, endpoints)  # before the command tree keeps a reference to client.http
        self.adapter = adapter
        self.tree: app_commands.CommandTree[_Client] = app_commands.CommandTree(
            self, allowed_contexts=COMMAND_CONTEXTS, allowed_installs=COMMAND_INSTALLS
        )
        self.tree.on_error = adapter.on_command_error  # type: ignore[method-assign]

    async def setup_hook(self) -> None:
        """Once per login: persistent buttons, slash commands (synced only when they changed)."""
        self.add_dynamic_items(StepsButton, ReminderButton, WipeButton)
        self.adapter.add_commands(self.tree)
        if self.adapter.syncs_commands:
            await self.adapter.sync_commands(self)

    async def on_ready(self) -> None:
        """Connected (or reconnected without resuming)."""
        self.adapter.ready(self)

    async def on_resumed(self) -> None:
        """Reconnected and resumed the session."""
        self.adapter.ready(self)

    async def on_disconnect(self) -> None:
        """The gateway connection dropped; discord.py reconnects on its own."""
        self.adapter.disconnected("reconnecting")

    async def on_message(self, message: discord.Message) -> None:
        """Every message the bot can see."""
        await self.adapter.on_message(message)


class _ShardedClient(_Client, discord.AutoShardedClient):
    """The same client running the gateway shards DISCORD_SHARD_COUNT / DISCORD_SHARD_IDS name: Discord sends
    each shard the events of its own servers ((guild id >> 22) % count) and shard 0 the direct messages;
    on_ready comes once every shard of this process is ready."""

    async def on_shard_ready(self, shard_id: int) -> None:
        """A shard identified again after start (on_ready comes only once all shards are ready together)."""
        if self.adapter.started:
            self.adapter.ready(self)

    async def launch_shard(self, gateway: yarl.URL, shard_id: int, *, initial: bool = False) -> None:
        """discord.py retries a shard that cannot connect every 5 s forever, logging each try as an error; while
        starting, the failure ends connect() instead (start() reports it in one line)."""
        if not (isinstance(self.http, EndpointHTTP) and self.http.fail_fast):
            await super().launch_shard(gateway, shard_id, initial=initial)
            return
        connecting = DiscordWebSocket.from_client(self, initial=initial, gateway=gateway, shard_id=shard_id)
        ws = await asyncio.wait_for(connecting, timeout=self.shard_connect_timeout)
        # what discord.py's launch_shard does after connecting (its shard table and event queue are private)
        shards: dict[int, Shard] = getattr(self, "_AutoShardedClient__shards")  # noqa: B009
        queue: asyncio.PriorityQueue[Any] = getattr(self, "_AutoShardedClient__queue")  # noqa: B009
        shards[shard_id] = shard = Shard(ws, self, queue.put_nowait)
        shard.launch()


class DiscordAdapter:
    """Runs the bot on Discord inside the caller's event loop."""

    platform = "discord"

    def __init__(
        self, core: Core, settings: Settings, *, guild_ready_timeout: float = 2.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:  # fmt: skip
        """Prepare the client (not connected yet); `sleep` waits between reconnection attempts."""
        assert settings.DISCORD_BOT_TOKEN is not None
        self.core = core
        self.token = settings.DISCORD_BOT_TOKEN.get_secret_value()
        self.endpoints = Endpoints(settings.DISCORD_API_BASE_URL, settings.DISCORD_GATEWAY_URL)
        self.channels = settings.discord_channels
        self.shards = settings.discord_shards  # (count, this process's ids), None: one unsharded connection
        # one process uploads the slash commands: the one running shard 0 (or the only one, unsharded)
        self.syncs_commands = self.shards is None or 0 in self.shards[1]
        self.grace = settings.SHUTDOWN_GRACE_SECONDS
        self.guild_ready_timeout = guild_ready_timeout
        self._sleep = sleep
        self._message_content = True
        self.client = self._make_client()
        self._runner: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stopping = False  # stop() began: new messages are turned away, running answers finish
        self._work: set[asyncio.Task[Any]] = set()  # tasks answering a message or an interaction
        self._down_since: str | None = None
        self._retry_s = DISCORD_RETRY_FIRST_S
        self._pausing = False  # the gateway task waits before connecting a new client

    def _make_client(self) -> _Client:
        """A fresh client (a closed client cannot connect again)."""
        intents = discord.Intents.default()
        intents.message_content = self._message_content
        if self.shards is None:
            return _Client(self, intents, self.guild_ready_timeout, self.endpoints)
        count, ids = self.shards
        return _ShardedClient(
            self, intents, self.guild_ready_timeout, self.endpoints, shard_count=count, shard_ids=list(ids)
        )

    # ---- connection ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Log in, connect as a background task and wait for READY; a failure is a StartupError (one line,
        naming DISCORD_BOT_TOKEN or the host, never the token) after closing what was started."""
        self._stopping = False
        self._ready.clear()
        try:
            await self._start()
        except BaseException as e:
            await self._close_connection()
            startup = _startup_error(e, self.endpoints)
            if startup is None:
                raise
            raise startup from None

    async def _start(self) -> None:
        """Login, then the gateway until READY (an unreachable gateway fails at once instead of retrying)."""
        _fail_fast(self.client, True)
        await self.client.login(self.token)
        self._runner = asyncio.create_task(self._run(), name="discord-gateway")
        waiter = asyncio.create_task(self._ready.wait())
        limit = self.ready_timeout
        try:
            done, _ = await asyncio.wait({self._runner, waiter}, timeout=limit, return_when="FIRST_COMPLETED")
        finally:
            waiter.cancel()
        if self._ready.is_set():
            return
        gateway = self.endpoints.gateway_host
        if self._runner in done:
            self._runner.result()  # raises why the connection failed
            raise StartupError(
                f"Discord: the gateway connection at {gateway} ended before READY", exit_code=EXIT_UNREACHABLE
            )
        raise StartupError(
            f"Discord: the gateway at {gateway} did not say READY within {limit:.0f} s",
            exit_code=EXIT_UNREACHABLE,
        )

    async def _run(self) -> None:
        """The gateway connection for the adapter's lifetime. discord.py reconnects and resumes on its own; when
        a connection ends for good (a fatal close code, an error it does not handle), a new client replaces it
        after a growing pause (DISCORD_RETRY_FIRST_S doubling to DISCORD_RETRY_MAX_S) and /status says since
        when it is down."""
        scope_webhooks(self.endpoints)  # interaction answers of the clients' event tasks (spawned from here)
        fresh = False
        while True:
            try:
                if fresh:
                    self.client = self._make_client()
                    await self.client.login(self.token)
                await self._connect()
                why = "the gateway connection ended"
            except Exception as e:
                if not self._ready.is_set():
                    raise  # still starting: start() reports it
                why = _describe(e)
                if not isinstance(e, (discord.DiscordException, OSError, aiohttp.ClientError, TimeoutError)):
                    log.error("Discord gateway task failed", exc_info=e)
            if self._stopping:
                return
            with contextlib.suppress(Exception):
                await self.client.close()
            delay, self._retry_s = self._retry_s, min(self._retry_s * 2, DISCORD_RETRY_MAX_S)
            self.disconnected(why)
            log.error("Discord connection lost (%s); connecting a new client in %.0f s", why, delay)
            self._pausing = True
            try:
                await self._sleep(delay)
            finally:
                self._pausing = False
            if self._stopping:
                return
            fresh = True

    async def _connect(self) -> None:
        """Run the current client's gateway; without the Message Content intent, fall back to mentions and DMs."""
        try:
            await self.client.connect(reconnect=True)
        except discord.PrivilegedIntentsRequired:
            log.warning(
                "Discord refused the Message Content intent: enable it in the Developer Portal (Bot → Privileged "
                "Gateway Intents). Running without it: only DMs and messages that @mention the bot are read."
            )
            await self.client.close()  # discord.py raises this without closing its HTTP session
            self._message_content = False
            self.client = self._make_client()
            _fail_fast(self.client, not self._ready.is_set())
            await self.client.login(self.token)
            await self.client.connect(reconnect=True)

    async def stop(self) -> None:
        """Stop taking new messages, let running answers finish and be sent (at most SHUTDOWN_GRACE_SECONDS;
        later ones are cut with a short note), then close the connection."""
        self._stopping = True
        await self._drain()
        await self._close_connection()
        self.core.report_state("discord", None)

    async def _drain(self) -> None:
        """Wait for the running answers up to the grace time, then cancel the rest (they say so briefly)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        while self._work and (left := deadline - loop.time()) > 0:
            await asyncio.wait(set(self._work), timeout=left)
        late = set(self._work)
        if not late:
            return
        log.warning(
            "%d Discord answer(s) still running after SHUTDOWN_GRACE_SECONDS=%g were cut", len(late), self.grace
        )
        for task in late:
            task.cancel()
        await asyncio.wait(late, timeout=DISCORD_CUT_NOTE_S + 1.0)

    async def _close_connection(self) -> None:
        """Close the client and end the gateway task (whatever state they are in)."""
        self._stopping = True
        with contextlib.suppress(Exception):
            await self.client.close()
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if not self._pausing:  # a closed client ends connect(); give it a moment to return on its own
            await asyncio.wait({runner}, timeout=5.0)
        if not runner.done():
            runner.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await runner

    @property
    def ready_timeout(self) -> float:
        """How long start() waits for READY: the shards of a process identify one after another, 5 s apart."""
        more = 0 if self.shards is None else len(self.shards[1]) - 1
        return DISCORD_READY_TIMEOUT_S + DISCORD_IDENTIFY_SPACING_S * more

    @property
    def started(self) -> bool:
        """Whether the first READY came (start() is done waiting)."""
        return self._ready.is_set()

    def ready(self, client: _Client) -> None:
        """Record the connection for /status and wake start()."""
        _fail_fast(client, False)
        self.core.report_state("discord", f"{client.user} in {len(client.guilds)} server(s){self._shards_text()}")
        self._down_since, self._retry_s = None, DISCORD_RETRY_FIRST_S
        self._ready.set()

    def _shards_text(self) -> str:
        """What /status adds when sharded, e.g. ", shards 0,1 of 4" (empty when not)."""
        if self.shards is None:
            return ""
        count, ids = self.shards
        return f", shards {','.join(map(str, ids))} of {count}"

    def disconnected(self, why: str) -> None:
        """Show in /status since when the gateway is down and why."""
        if self._stopping or not self._ready.is_set():
            return
        if self._down_since is None:
            self._down_since = self.core.now().strftime("%Y-%m-%d %H:%M UTC")
        self.core.report_state("discord", f"disconnected since {self._down_since}: {why}{self._shards_text()}")

    # ---- work in progress ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _tracked(self) -> Iterator[None]:
        """Count the current task as running work until the block ends (stop() waits for it)."""
        task = asyncio.current_task()
        if task is not None:
            self._work.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._work.discard(task)

    # ---- slash commands ------------------------------------------------------------------------

    def add_commands(self, tree: app_commands.CommandTree[_Client]) -> None:
        """/ask /tasks /timezone /memory /reset /status /help."""

        @tree.command(name="ask", description="Ask the assistant something")
        @app_commands.describe(message="What you want to ask or tell me")
        async def ask(interaction: discord.Interaction, message: str) -> None:
            await self.guard(interaction, self._on_ask(interaction, message))

        @tree.command(name="tasks", description="Your open tasks")
        async def tasks(interaction: discord.Interaction) -> None:
            await self._answer_command(interaction, "tasks", private=True)

        @tree.command(name="timezone", description="Show or set your time zone")
        @app_commands.describe(zone="An IANA time zone such as Europe/Berlin (leave empty to see yours)")
        async def timezone(interaction: discord.Interaction, zone: str | None = None) -> None:
            await self._answer_command(interaction, "timezone", zone or "", private=True)

        @tree.command(name="memory", description="What I remember about you; forget a line or wipe it all")
        @app_commands.describe(
            action="show (default), forget one line, or wipe everything (asks to confirm)",
            block="forget: the block, e.g. human",
            line="forget: the line number shown by /memory",
            confirm="wipe: True erases at once, without asking",
        )
        async def memory(
            interaction: discord.Interaction,
            action: Literal["show", "forget", "wipe"] = "show",
            block: str | None = None,
            line: int | None = None,
            confirm: bool = False,
        ) -> None:
            args = {"action": action, "block": block or "", "line": "" if line is None else str(line)}
            args["confirm"] = "true" if confirm else "false"
            view = _view(WipeButton(interaction.user.id)) if action == "wipe" and not confirm else None
            await self._answer_command(interaction, "memory", args, private=True, view=view)

        @tree.command(name="reset", description="Start a fresh conversation in this channel")
        async def reset(interaction: discord.Interaction) -> None:
            await self._answer_command(interaction, "reset", private=False)

        @tree.command(name="status", description="How the bot is doing")
        async def status(interaction: discord.Interaction) -> None:
            await self._answer_command(interaction, "status", private=True)

        @tree.command(name="help", description="What I can do")
        async def help_(interaction: discord.Interaction) -> None:
            await self._answer_command(interaction, "help", private=True)

    async def sync_commands(self, client: _Client) -> None:
        """Upload the slash commands only when Discord's set differs from ours (not on every start/reconnect)."""
        app_id = client.application_id
        if app_id is None:
            return
        try:
            remote = await client.http.get_global_commands(app_id)
            local = [c.to_dict(client.tree) for c in client.tree.get_commands()]
            if _canonical(cast(list[dict[str, Any]], remote)) != _canonical(local):
                await client.tree.sync()
                log.info("Discord slash commands synced (%d)", len(local))
        except discord.HTTPException as e:
            log.warning("could not sync Discord slash commands (they may be out of date): %s", e)

    async def _answer_command(
        self,
        interaction: discord.Interaction,
        name: CommandName,
        arg: CommandArgs | str = "",
        *,
        private: bool,
        view: discord.ui.View | None = None,
    ) -> None:
        """A command answered without the LLM; personal answers are ephemeral (a refusal always is); `view`
        (buttons) goes under the last part."""

        async def run() -> None:
            inc = self._interaction_incoming(interaction, "")
            answer = await self.core.command(inc, name, arg, must_answer=True)
            if isinstance(answer, Error) or answer is None:
                await self._refuse_interaction(interaction, inc)
                return
            parts = split_markdown(answer)
            last: Any = view or discord.utils.MISSING  # buttons under the last part only
            await interaction.response.send_message(
                parts[0], ephemeral=private, allowed_mentions=NO_MENTIONS,
                view=last if len(parts) == 1 else discord.utils.MISSING,
            )  # fmt: skip
            for i, part in enumerate(parts[1:], 2):
                await interaction.followup.send(
                    part, ephemeral=private, allowed_mentions=NO_MENTIONS,
                    view=last if i == len(parts) else discord.utils.MISSING,
                )  # fmt: skip

        await self.guard(interaction, run())

    async def _on_ask(self, interaction: discord.Interaction, text: str) -> None:
        """/ask: a full turn, answered in the channel like a mention."""
        inc = self._interaction_incoming(interaction, text)
        if not self.core.is_allowed(inc):
            await self._refuse_interaction(interaction, inc)
            return
        await interaction.response.defer(thinking=True)
        answered = False
        async with aclosing(self.core.handle(inc)) as events:
            async for event in events:
                if isinstance(event, Assistant):
                    parts = render_reply(event.text, event.steps, event.elapsed_s)
                    view = _view(StepsButton(event.turn_id)) if event.steps and event.turn_id else None
                    await self._followups(interaction, parts, view)
                    answered = True
                elif isinstance(event, Error):
                    await self._followups(interaction, split_markdown(event.message), None)
                    answered = True
        if not answered:  # a duplicate delivery of the same interaction
            await interaction.followup.send("Already answered.", ephemeral=True, allowed_mentions=NO_MENTIONS)

    async def _followups(
        self, interaction: discord.Interaction, parts: Sequence[str], view: discord.ui.View | None
    ) -> None:
        """Send parts as interaction follow-ups (the first replaces "thinking…"); the view goes on the last."""
        for i, part in enumerate(parts):
            if view is not None and i == len(parts) - 1:
                await interaction.followup.send(part, view=view, allowed_mentions=NO_MENTIONS)
            else:
                await interaction.followup.send(part, allowed_mentions=NO_MENTIONS)

    async def _refuse_interaction(self, interaction: discord.Interaction, inc: Incoming) -> None:
        """Interactions always get an answer (only the user sees it)."""
        await interaction.response.send_message(
            self.core.refusal_text(inc), ephemeral=True, allowed_mentions=NO_MENTIONS
        )

    async def on_command_error(self, interaction: discord.Interaction, error: app_commands.AppCommandError, /) -> None:
        """Errors of the command tree itself go through the same funnel."""
        await self._fail(interaction, error)

    # ---- translation -------------------------------------------------------------------------

    def _bot_id(self) -> int:
        """The bot's own user id."""
        return self.client.user.id if self.client.user else 0

    def _addressed(self, message: discord.Message) -> bool:
        """DMs always; elsewhere a mention, a reply to the bot, or a listed channel."""
        if _dm_message(message):
            return True
        me = self._bot_id()
        if any(u.id == me for u in message.mentions):
            return True
        ref = message.reference
        if ref is not None and isinstance(ref.resolved, discord.Message) and ref.resolved.author.id == me:
            return True
        channel = message.channel
        parent = channel.parent_id if isinstance(channel, discord.Thread) else None
        return channel.id in self.channels or parent in self.channels

    def _text(self, message: discord.Message) -> str:
        """The message text without the bot's mention; other mentions become @names."""
        me = self._bot_id()
        names = {u.id: getattr(u, "display_name", u.name) for u in message.mentions}

        def repl(m: re.Match[str]) -> str:
            uid = int(m.group(1))
            return "" if uid == me else f"@{names.get(uid, 'someone')}"

        return _MENTION.sub(repl, message.content).strip()

    def _where(self, channel: Any, guild_id: int | None) -> tuple[str, str, str]:
        """(chat id, thread id, title): a thread is its own conversation inside its parent channel."""
        name = getattr(channel, "name", None) or ""
        if isinstance(channel, discord.Thread):
            return str(channel.parent_id), str(channel.id), f"#{name}"
        return str(channel.id), "", f"#{name}" if guild_id else ""

    def _incoming(self, message: discord.Message, text: str) -> Incoming:
        """The core's view of a Discord message (a forwarded message is someone else's text: quoted)."""
        ref = message.reference
        replied = ref is not None and ref.type == discord.MessageReferenceType.reply and ref.message_id
        return self._make_incoming(
            message.author, message.channel, message.channel.id, message.guild.id if message.guild else None, text,
            str(message.id), private=_dm_message(message), reply_to=str(ref.message_id) if ref and replied else None,
            attachments=tuple(a.filename for a in message.attachments), quoted=self._forwarded(message),
        )  # fmt: skip

    def _interaction_incoming(self, interaction: discord.Interaction, text: str) -> Incoming:
        """The core's view of a slash command or button press."""
        return self._make_incoming(
            interaction.user, interaction.channel, interaction.channel_id, interaction.guild_id, text,
            f"interaction:{interaction.id}", private=_private_interaction(interaction),
        )  # fmt: skip

    def _make_incoming(
        self, author: discord.User | discord.Member, channel: Any, channel_id: int | None, guild_id: int | None,
        text: str, message_id: str, *, private: bool, reply_to: str | None = None, attachments: tuple[str, ...] = (),
        quoted: tuple[Quoted, ...] = (),
    ) -> Incoming:  # fmt: skip
        """An Incoming for a user speaking in a channel (a thread is its own conversation in its parent); only a
        real DM with the bot is a private chat."""
        where = self._where(channel, guild_id) if channel is not None else (str(channel_id), "", "")
        return Incoming(
            platform="discord", user_id=str(author.id), chat_id=where[0], thread_id=where[1],
            chat_kind="private" if private else "group", chat_title=where[2], text=text,
            user_name=author.display_name, message_id=message_id, reply_to=reply_to, attachments=attachments,
            quoted=quoted,
        )  # fmt: skip

    def _forwarded(self, message: discord.Message) -> tuple[Quoted, ...]:
        """The text of the messages a forward carries (Discord sends a snapshot without its author: named when
        the bot saw the original, else by its channel)."""
        ref = message.reference
        if ref is None or ref.type != discord.MessageReferenceType.forward:
            return ()
        out = []
        for snapshot in message.message_snapshots:
            text = _MENTION.sub(self._mention_name, snapshot.content).strip()
            if text:
                out.append(Quoted("forward", self._forward_origin(snapshot, ref.channel_id), text))
        return tuple(out)

    def _forward_origin(self, snapshot: discord.MessageSnapshot, channel_id: int | None) -> str:
        """Who wrote a forwarded message, as far as the bot can tell."""
        original = snapshot.cached_message
        if original is not None:
            return original.author.display_name
        channel = self.client.get_channel(channel_id) if channel_id else None
        name = getattr(channel, "name", None)
        return f"someone in #{name}" if name else UNKNOWN_AUTHOR

    def _mention_name(self, mention: re.Match[str]) -> str:
        """A user mention in someone else's text as @name."""
        uid = int(mention.group(1))
        user = self.client.user if uid == self._bot_id() else self.client.get_user(uid)
        return f"@{user.display_name}" if user is not None else "@someone"

    # ---- messages ------------------------------------------------------------------------------

    async def on_message(self, message: discord.Message) -> None:
        """A message: a turn when addressed; the bot's own and other bots' messages are ignored."""
        if message.author.bot or message.type not in (discord.MessageType.default, discord.MessageType.reply):
            return
        if not self._addressed(message):
            return
        with self._tracked():
            try:
                text = self._text(message)
                inc = self._incoming(message, text)
                if self._stopping:  # a new session would not see it again: ask for it later
                    if self.core.is_allowed(inc):
                        await self._send_parts(message, [RESTARTING])
                elif not text and not inc.quoted:
                    if not self.core.is_allowed(inc):
                        await self._refuse(inc, message)
                    elif _has_media(message):
                        await self._send_parts(message, [TEXT_ONLY])
                else:
                    await self._turn(inc, message)
            except asyncio.CancelledError:  # only a shutdown cancels an answer (stop() or the core's drain)
                await _briefly(self._send_parts(message, [CUT_SHORT]))
                raise
            except Exception as e:
                await self._fail_message(message, e)

    async def _turn(self, inc: Incoming, message: discord.Message) -> None:
        """Run the core on one message with typing shown, then send the reply."""
        typing = asyncio.create_task(self._keep_typing(message.channel))
        try:
            async with aclosing(self.core.handle(inc)) as events:
                async for event in events:
                    if isinstance(event, Assistant):
                        await _stop(typing)
                        parts = render_reply(event.text, event.steps, event.elapsed_s)
                        view = _view(StepsButton(event.turn_id)) if event.steps and event.turn_id else None
                        await self._send_parts(message, parts, view)
                    elif isinstance(event, Error):
                        await _stop(typing)
                        await self._send_parts(message, split_markdown(event.message))
        finally:
            await _stop(typing)

    async def _keep_typing(self, channel: Messageable) -> None:
        """Refresh the typing indicator until cancelled (failures only cost the indicator)."""
        while True:
            with contextlib.suppress(discord.HTTPException):
                await channel.typing()
            await asyncio.sleep(DISCORD_TYPING_EVERY_S)

    async def _refuse(self, inc: Incoming, message: discord.Message) -> None:
        """The polite refusal with the user's id (at most once per chat per hour)."""
        refusal = await self.core.refusal(inc)
        if refusal is not None:
            await self._send_parts(message, [refusal.message])

    async def _send_parts(
        self, message: discord.Message, parts: Sequence[str], view: discord.ui.View | None = None
    ) -> list[discord.Message]:
        """Send parts in order to the message's channel; in servers the first replies to the author."""
        sent = []
        for i, part in enumerate(parts):
            kwargs: dict[str, Any] = {"allowed_mentions": NO_MENTIONS}  # the reply shows whom it answers, silently
            if i == 0 and message.guild is not None:
                kwargs["reference"] = message.to_reference(fail_if_not_exists=False)
            if view is not None and i == len(parts) - 1:
                kwargs["view"] = view
            sent.append(await message.channel.send(part, **kwargs))
        return sent

    # ---- buttons -------------------------------------------------------------------------------

    async def show_steps(self, interaction: discord.Interaction, turn_id: int, shown: bool) -> None:
        """Load a turn's steps from PostgreSQL; ephemeral in servers, toggled in place in DMs."""
        found = await self.core.turn_steps(self._interaction_incoming(interaction, ""), turn_id)
        if isinstance(found, Error):  # gone, not theirs, or not allowed
            await interaction.response.send_message(found.message, ephemeral=True, allowed_mentions=NO_MENTIONS)
            return
        message = interaction.message
        if _private_interaction(interaction) and message is not None:
            content = without_steps(message.content) if shown else with_steps(message.content, found.steps)
            view = _view(StepsButton(turn_id, shown=not shown))
            await interaction.response.edit_message(content=content, view=view, allowed_mentions=NO_MENTIONS)
            return
        head = f"**Steps** — {summary_line(found.steps, found.elapsed_s)}\n"
        text = head + steps_text(found.steps, DISCORD_MESSAGE_LIMIT - len(head))
        await interaction.response.send_message(text, ephemeral=True, allowed_mentions=NO_MENTIONS)

    async def press_reminder(self, interaction: discord.Interaction, action: str, task_id: int) -> None:
        """Done / Snooze: only the owner; the reminder message shows the outcome and loses its buttons."""
        ok, text = await self.core.press_reminder(self._interaction_incoming(interaction, ""), task_id, action)
        if not ok or interaction.message is None:
            await interaction.response.send_message(text, ephemeral=True, allowed_mentions=NO_MENTIONS)
            return
        content = f"{interaction.message.content}\n\n{text}"[:DISCORD_MESSAGE_LIMIT]
        await interaction.response.edit_message(content=content, view=None, allowed_mentions=NO_MENTIONS)

    async def press_wipe(self, interaction: discord.Interaction, owner_id: int) -> None:
        """A press of "Yes, wipe my memory": only by the person it was offered to; the message shows what went."""
        if interaction.user.id != owner_id:
            await interaction.response.send_message(NOT_YOUR_BUTTON, ephemeral=True, allowed_mentions=NO_MENTIONS)
            return
        inc = self._interaction_incoming(interaction, "")
        answer = await self.core.command(inc, "memory", MEMORY_WIPE_CONFIRM, must_answer=True)
        if isinstance(answer, Error) or answer is None:
            await self._refuse_interaction(interaction, inc)
            return
        await interaction.response.edit_message(content=answer, view=None, allowed_mentions=NO_MENTIONS)

    # ---- reminders -----------------------------------------------------------------------------

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Push a reminder into its channel (pinging only its owner, in servers) with Done / Snooze buttons on its
        last part, each part recorded as it is accepted; a permanent refusal (channel gone, no access, DMs closed)
        raises DeliveryRefused. Returns the id of the message with the buttons (None when all was sent before)."""
        channel = self.client.get_partial_messageable(int(msg.thread_id or msg.chat_id))
        body, mentions = msg.text, NO_MENTIONS
        if msg.chat_kind == "group":
            body = f"<@{int(msg.owner_id)}> {body}"
            mentions = owner_ping(msg.owner_id)
        parts = split_markdown(body)
        view = _view(*(ReminderButton(b, msg.task_id) for b in msg.buttons))
        sent: discord.Message | None = None
        try:
            for i in range(msg.sent_parts, len(parts)):  # a retry sends only the parts Discord does not have
                if i == len(parts) - 1:  # the buttons go on the last part
                    sent = await channel.send(parts[i], allowed_mentions=mentions, view=view)
                else:
                    sent = await channel.send(parts[i], allowed_mentions=mentions)
                await msg.mark_sent(i + 1)
        except (discord.NotFound, discord.Forbidden) as e:
            if e.code in REFUSALS:  # permanent: the engine marks the occurrence failed with this reason
                raise DeliveryRefused(f"Discord: {REFUSALS[e.code]} ({e.code} {e.text})") from e
            raise  # anything else (network, 5xx, rate limits, other codes) is transient and retried
        return str(sent.id) if sent is not None else None

    # ---- the error funnel ----------------------------------------------------------------------

    async def guard(self, interaction: discord.Interaction, work: Coroutine[Any, Any, None]) -> None:
        """Run an interaction's work as running work for stop(); any failure is logged and answered briefly;
        while stopping, new work is turned away."""
        if self._stopping:
            work.close()
            await self._tell(interaction, RESTARTING)
            return
        with self._tracked():
            try:
                await work
            except asyncio.CancelledError:  # only a shutdown cancels an answer (stop() or the core's drain)
                await _briefly(self._tell(interaction, CUT_SHORT))
                raise
            except Exception as e:
                await self._fail(interaction, e)

    async def _fail(self, interaction: discord.Interaction, error: BaseException) -> None:
        """Log with the traceback and tell the user briefly (only they see it)."""
        log.error("Discord interaction failed", exc_info=error)
        await self._tell(interaction, FAILED)

    async def _tell(self, interaction: discord.Interaction, text: str) -> None:
        """A short ephemeral note: the response, or a follow-up when the interaction was answered already."""
        with contextlib.suppress(discord.HTTPException):
            if interaction.response.is_done():
                await interaction.followup.send(text, ephemeral=True, allowed_mentions=NO_MENTIONS)
            else:
                await interaction.response.send_message(text, ephemeral=True, allowed_mentions=NO_MENTIONS)

    async def _fail_message(self, message: discord.Message, error: BaseException) -> None:
        """Log with the traceback and answer the message briefly."""
        log.error("Discord message handler failed", exc_info=error)
        with contextlib.suppress(discord.HTTPException):
            await message.channel.send(FAILED, allowed_mentions=NO_MENTIONS)


def _dm_message(message: discord.Message) -> bool:
    """Whether a message was sent in a DM with the bot (not a group DM)."""
    return message.guild is None and getattr(message.channel, "type", None) == discord.ChannelType.private


def _private_interaction(interaction: discord.Interaction) -> bool:
    """Whether a slash command or button press comes from the user's own DM with the bot through the server
    install; a group DM, another DM or a user install is never private (others may see the answers)."""
    kind = interaction.context
    return (
        interaction.guild_id is None
        and getattr(interaction.channel, "type", None) == discord.ChannelType.private
        and kind.dm_channel
        and not kind.private_channel
        and not interaction.is_user_integration()
    )


def _has_media(message: discord.Message) -> bool:
    """Whether a message (or a message it forwards) holds attachments or stickers."""
    forwarded = any(s.attachments or s.stickers for s in message.message_snapshots)
    return bool(message.attachments or message.stickers or forwarded)


async def _briefly(send: Awaitable[Any]) -> None:
    """Best effort, bounded by DISCORD_CUT_NOTE_S: a note to a user whose answer a shutdown cut."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DISCORD_CUT_NOTE_S):
            await send


async def _stop(task: asyncio.Task[None]) -> None:
    """Cancel a helper task and wait for it."""
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _fail_fast(client: discord.Client, on: bool) -> None:
    """While starting, an unreachable gateway ends connect() at once (discord.py would retry it forever)."""
    if isinstance(client.http, EndpointHTTP):
        client.http.fail_fast = on


def _describe(error: BaseException) -> str:
    """Why a gateway connection ended, in a few words (never the token)."""
    if isinstance(error, discord.ConnectionClosed):
        return f"the gateway closed the connection with code {error.code}"
    if isinstance(error, discord.LoginFailure):
        return "DISCORD_BOT_TOKEN was rejected"
    if isinstance(error, discord.HTTPException):
        return f"the Discord API answered {error.status}"
    return f"{type(error).__name__}: {reason_of(error)}"


def _startup_error(error: BaseException, endpoints: Endpoints) -> StartupError | None:
    """A start-up failure as one line for the operator (None: not a connection problem, raise it as it is).
    A rejected token or close code is a setting to fix (exit 2); an unreachable or failing Discord may pass (3)."""
    api, gateway, down = endpoints.api_host, endpoints.gateway_host, EXIT_UNREACHABLE
    rejected = f"Discord ({api}) rejected DISCORD_BOT_TOKEN: copy it again from the Developer Portal (Bot → Token)"
    if isinstance(error, discord.LoginFailure):
        return StartupError(rejected)
    if isinstance(error, discord.ConnectionClosed):
        if error.code == 4004:
            return StartupError(rejected)
        return StartupError(f"the Discord gateway ({gateway}) closed the connection at start with code {error.code}")
    if isinstance(error, GatewayUnreachable):
        hint = " and DISCORD_GATEWAY_URL" if endpoints.gateway is not None else ""
        why = f"Discord: cannot reach the gateway at {error.host} ({error.reason}); check the network{hint}"
        return StartupError(why, exit_code=down)
    if isinstance(error, discord.HTTPException):
        return StartupError(f"the Discord API at {api} failed at start with HTTP {error.status}", exit_code=down)
    if isinstance(error, (OSError, aiohttp.ClientError)):
        hint = " and DISCORD_API_BASE_URL" if endpoints.api_base is not None else ""
        why = f"Discord: cannot reach the API at {api} ({reason_of(error)}); check the network{hint}"
        return StartupError(why, exit_code=down)
    if isinstance(error, TimeoutError):
        return StartupError(f"Discord: the API at {api} did not answer in time; check the network", exit_code=down)
    return error if isinstance(error, StartupError) else None
