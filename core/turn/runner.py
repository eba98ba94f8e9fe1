"""Running one message's turn: the access check, the size limit, the files taken in, the chat's slot, the journal's
start, whose words the context holds, the agent, and the answer sent through the front end's reply port."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from core.access import Access, all_by, refusal_text
from core.accounts.usage import Spending
from core.agent.llm import LLM
from core.agent.loop import Limits, run_agent
from core.agent.prompt import system_prompt
from core.agent.providers import ModelChoice, chosen_model
from core.agent.replay import build_replay
from core.capabilities.manager import CapabilityManager
from core.constants import DUE_SOON, DUE_SOON_LINES
from core.inbox import Delivery, Inbox
from core.mcp_servers import confirm as mcp_confirm
from core.mcp_servers.hub import Hub
from core.media import intake, speaking
from core.media import store as media_store
from core.media.audio import Audio
from core.media.photos import with_images
from core.media.tools import READ_ATTACHMENT
from core.memory.blocks import render_prompt_section
from core.memory.tools import SAVE_FILE
from core.metrics import Metrics
from core.settings import Settings
from core.storage import conversations
from core.storage.db import Pool
from core.texts import NO_MODEL, NO_MODEL_HOW, RESTARTING, STEPS_GONE, STEPS_NOT_YOURS
from core.timeutil import Clock, zone
from core.tools.framework import Caps, Tool, ToolContext, ToolRegistry
from core.turn import journal
from core.turn.citations import cited
from core.turn.reply import Reply, send_through
from core.turn.slots import ChatSlots
from core.types import API as API_PLATFORM
from core.types import Assistant, Error, Event, Incoming, ModelToolCalls, Step, ToolResult, TurnSteps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnParts:
    """What a turn works with, made once by the core."""

    settings: Settings
    pool: Pool
    llm: LLM
    models: tuple[ModelChoice, ...]
    registry: ToolRegistry
    capabilities: CapabilityManager
    mcp: Hub
    spending: Spending
    audio: Audio
    inbox: Inbox
    metrics: Metrics
    access: Access
    clock: Clock
    limits: Limits
    caps: Caps
    tasks_changed: Callable[[], None]  # tools made or moved a task: the reminder scheduler looks again
    request_exit: Callable[[int], None]  # a turn asked the bot to stop (restart mode full), once its answer is out


class Turns:
    """The turns of this process: one at a time per chat, each answered once."""

    def __init__(self, parts: TurnParts) -> None:
        """Run turns with `parts`."""
        self.parts = parts
        self.slots = ChatSlots()
        self.draining = False  # set by the lifecycle's drain(): new turns are turned away while running ones finish
        self.tasks: set[asyncio.Task[Any]] = set()  # tasks that run (or wait for) a turn, for drain()

    async def answer(self, inc: Incoming, reply: Reply, *, delivery: Delivery | None = None) -> None:
        """Answer one incoming message through `reply` (`delivery`: the stored update it came in); every part the
        platform accepts of an update's answer is recorded, so a process taking it again sends only the rest."""
        async with reply.working(), aclosing(self.handle(inc, stream=reply.streams, delivery=delivery)) as events:
            journaled = await send_through(self.parts.pool, events, reply, record=delivery is not None)
        if delivery is not None:
            delivery.journaled = journaled  # the inbox marks it done without waiting for the disk (inbox_table.finish)

    async def handle(
        self, inc: Incoming, *, stream: bool = False, delivery: Delivery | None = None
    ) -> AsyncGenerator[Event, None]:
        """The events of one incoming message's turn; nothing for a duplicate or an ignored message."""
        p = self.parts
        if not p.access.is_allowed(inc):
            refusal = await p.access.refusal(inc)
            if refusal is not None:
                yield refusal
            return
        heard: tuple[Step, ...] = ()
        kept: list[int] = []
        llm: LLM | None = None  # the model, once the speaker is known
        answered: Assistant | None = None  # the answer to a voice note, read aloud after the turn (/voice on)
        if inc.uploads:  # voice notes and documents first become words (core/media/intake.py)
            inc, llm, heard, notes, kept = await self._take_in(inc)
            if notes and not inc.text.strip() and not inc.quoted:  # nothing of it could be read
                yield Error("media", "\n".join(notes))
                return
        if not inc.text.strip() and not any(q.text.strip() for q in inc.quoted):
            return
        size, most = len(inc.text.strip()) + sum(len(q.text) for q in inc.quoted), p.settings.MAX_MESSAGE_CHARS
        if size > most:
            yield Error(
                "too_long",
                f"That message is {size:,} characters long; I can take up to {most:,}. "
                "Please send it in smaller parts.",
            )
            return
        if self.draining:
            yield Error("restarting", RESTARTING)
            return
        self._track()
        started, counted = time.monotonic(), False
        try:
            async with self.slots.turn(inc.chat_key), aclosing(self._turn(inc, stream, delivery, llm)) as events:
                async for event in events:
                    if isinstance(event, Assistant | Error) and delivery is not None:  # taken over: nothing sent
                        await p.inbox.confirm(delivery)
                    counted = self._measure(event, started) or counted
                    if heard and isinstance(event, Assistant):  # what was heard shows first among the steps
                        event = answered = replace(event, steps=(*heard, *event.steps))
                    if kept and isinstance(event, Assistant | Error) and event.turn_id is not None:
                        await media_store.link_turn(p.pool, kept, event.turn_id)  # for "Show steps" later
                    yield event
        except BaseException as e:  # a turn that ended without its final event
            if not counted:
                p.metrics.turn("failed" if isinstance(e, Exception) else "interrupted", time.monotonic() - started)
            raise
        if answered is not None and (spoken := await speaking.read_aloud(p.pool, p.audio, inc, answered)):
            yield spoken  # outside the chat's slot: the next message need not wait for the speech server

    async def answer_text(self, inc: Incoming) -> str | None:
        """Run one turn and return its final answer text (None when it failed or was a duplicate)."""
        async with aclosing(self.handle(inc)) as events:
            async for event in events:
                if isinstance(event, Assistant):
                    return event.text if event.cut_short is None else None
        return None

    async def steps(self, inc: Incoming, turn_id: int) -> TurnSteps | Error:
        """A turn's steps for its "Show steps" button: only the user who asked (or an admin) may see them."""
        if not self.parts.access.is_allowed(inc):
            return Error("not_allowed", refusal_text(inc))
        found = await conversations.turn_steps(self.parts.pool, turn_id)
        if found is None or found.platform != inc.platform:
            return Error("gone", STEPS_GONE)
        if inc.user_id != found.user_id and not self.parts.access.is_admin(inc):
            return Error("not_yours", STEPS_NOT_YOURS)
        return found

    def _track(self) -> None:
        """Remember the task running this turn until it ends (it also sends the reply), for drain()."""
        task = asyncio.current_task()
        if task is not None and task not in self.tasks:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _take_in(self, inc: Incoming) -> tuple[Incoming, LLM, tuple[Step, ...], list[str], list[int]]:
        """The message with what its files said (a transcript as the person's words, a document as quoted text), the
        speaker's model, the steps that show it, and one line for each file that could not be read (kept as a
        platform reference)."""
        p = self.parts
        user, chat = await conversations.identify(p.pool, inc, p.settings.DEFAULT_TIMEZONE)
        llm = p.llm.using(chosen_model(p.models, inc.model or user.model))
        if await conversations.recent_messages(p.pool, user.id) >= p.settings.USER_MESSAGES_PER_MINUTE:
            # past the person's rate: nothing is fetched, transcribed or extracted; the turn's start says so (once)
            kinds = ", ".join(sorted({up.kind for up in inc.uploads}))
            return replace(inc, text=inc.text or f"[{kinds} not read]", uploads=()), llm, (), [], []
        cap = p.settings.MEDIA_MAX_MB * 1_000_000
        owner = intake.Owner(user.account_id, user.id, chat.id, p.clock(), cap, self._sees_images(llm))
        got = await intake.take_in(p.pool, p.audio, inc.uploads, owner)
        said = got.message(inc.text)
        if said or got.quoted:  # the model answers what could be read, and says what could not
            said = "\n\n".join([said, *(f"[{note}]" for note in got.notes)]).strip()
        taken = replace(inc, text=said, quoted=(*inc.quoted, *got.quoted), uploads=())
        return taken, llm, tuple(got.steps), got.notes, got.kept

    def _sees_images(self, llm: LLM) -> bool:
        """Whether photos go to this model as images: LLM_VISION on, or auto while the model has refused none."""
        vision = self.parts.settings.LLM_VISION
        return vision == "on" or (vision == "auto" and llm.sees_images())

    def _measure(self, event: Event, started: float) -> bool:
        """Count a tool call or the end of a turn (True) in the metrics: only names the registry holds, no user data."""
        metrics = self.parts.metrics
        if isinstance(event, ToolResult):
            step = event.step
            known = step.name if self.parts.registry.get(step.name) is not None else None
            metrics.tool_call(known, None if step.ok else step.error_code or "tool_error")
        elif isinstance(event, Assistant | Error):
            outcome = event.code if isinstance(event, Error) else "ok" if event.cut_short is None else "cut_short"
            metrics.turn(outcome, time.monotonic() - started)
            return True
        return False

    async def _answer_again(self, inc: Incoming) -> Assistant | Error | None:
        """The answer stored for a redelivered message, with its steps, to send what of it did not go out (its first
        process died after answering); an error answer (one part) only when it did not go out; None when none."""
        pool = self.parts.pool
        stored = await conversations.stored_answer(pool, inc)
        if stored is None:
            return None
        if stored.error_code is not None:
            if stored.sent_parts:
                log.info("error answer of turn %d was sent before its process died; not sent again", stored.turn_id)
                return None
            return Error(stored.error_code, stored.text, stored.turn_id)
        found = await conversations.turn_steps(pool, stored.turn_id)
        steps, elapsed = (found.steps, found.elapsed_s) if found is not None else ((), 0.0)
        return Assistant(stored.text, stored.turn_id, steps, elapsed, sent_parts=stored.sent_parts)

    async def _turn(
        self, inc: Incoming, stream: bool, delivery: Delivery | None, llm: LLM | None
    ) -> AsyncGenerator[Event, None]:
        """One turn inside the chat's slot."""
        p = self.parts
        now = p.clock()
        # Personal memory (prompt and tools) only outside groups: private chats, the terminal, jobs posted there; not in
        # a job whose prompt was written with others' text around (it comes as a "job" quote).
        admin, group = p.access.is_admin(inc), inc.chat_kind == "group"
        personal = not group and not any(q.kind == "job" for q in inc.quoted)
        start = await journal.begin(
            p.pool,
            inc,
            delivery,
            default_tz=p.settings.DEFAULT_TIMEZONE,
            history=p.settings.HISTORY_MESSAGES,
            due_before=now + DUE_SOON,
            due_limit=DUE_SOON_LINES,
            authors=group,
            memory=personal,
            budget=p.spending.admission(now),
        )
        user, chat, turn_id, rows, due = start.user, start.chat, start.turn_id, start.history, start.due
        if turn_id is None:  # stored before: a duplicate, or a redelivery whose turn ended (answered or not)
            again = await self._answer_again(inc) if delivery is not None and delivery.redelivered else None
            if again is not None:
                yield again
            else:
                log.info("duplicate platform message %s in %s ignored", inc.message_id, inc.chat_key)
            return
        # the budget check before each model call (accounts/usage.py); the last call's usage is stored with the answer
        meter = p.spending.meter(user, start.budget, defer=True)
        writes = journal.TurnJournal(p.pool, chat, turn_id, delivery, meter)
        flood = p.access.flood(inc, start.user_recent, start.chat_recent)
        if flood is not None:  # stored, not answered: the note (once) is the turn's answer, resent on a redelivery
            meter.close()
            note = Error("rate_limited", flood, turn_id) if flood else None
            await writes.fail(note)
            if note is not None:
                yield note
            return
        if p.settings.model_off:  # LLM_PROVIDER=none, or the terminal before a model is set: stored, not answered
            meter.close()
            operator = admin or inc.platform == "console"  # the person at this machine, also on its local page
            note = Error("no_model", NO_MODEL + (NO_MODEL_HOW if operator else ""), turn_id)
            await writes.fail(note)
            yield note
            return
        # Whose words the context holds: in a private chat the speaker's unless something quoted (a forward, an
        # untrusted job) is in it; in a group only when every replayed message is the speaker's. Admin tools need a
        # context of admins' own words; tasks written without own words never get admin or memory powers later.
        foreign = any(r.get("quoted_kind") for r in rows)
        own_words = not foreign and (not group or all_by(inc, rows))
        is_admin = admin and not foreign and (not group or p.access.admins_only(inc.platform, rows))
        ctx = ToolContext(
            p.pool,
            user,
            chat,
            is_admin,
            p.clock,
            p.limits.step_timeout,
            p.tasks_changed,
            personal=personal,
            own_words=own_words,
            caps=p.caps,
        )
        files = any(r.get("quoted_kind") == "file" for r in rows)  # file tools only with a document in context

        def offer(ctx: ToolContext) -> list[Tool]:
            """The tools of this turn for the speaker as they stand now (asked again when they change mid-turn)."""
            tools = p.registry.offered(ctx.is_admin, ctx.personal)
            tools = tools if files else [t for t in tools if t.name not in (READ_ATTACHMENT.name, SAVE_FILE)]
            return p.mcp.offer(tools, ctx)  # the MCP servers' tools this speaker may use, or mcp_search

        tools = offer(ctx)
        caps = p.capabilities.summaries()
        memory = None if start.memory is None else render_prompt_section(start.memory, p.settings.MEMORY_BLOCK_WORDS)
        prompt = system_prompt(user, chat, zone(user.timezone), now, due, caps, memory)
        messages = [
            {"role": "system", "content": prompt},
            *build_replay(rows, group=chat.kind == "group"),
        ]
        # the message's model (the API checked it is on offer), else the account's if still on offer (chosen once)
        llm = llm or p.llm.using(chosen_model(p.models, inc.model or user.model))
        try:
            if self._sees_images(llm):  # the newest photos named in the conversation go as images
                await with_images(p.pool, chat.id, messages)
            async for event in run_agent(
                llm, p.registry, tools, ctx, turn_id, messages, p.limits, stream=stream, meter=meter, offer=offer
            ):
                if isinstance(event, Assistant) and ctx.sources:  # it used the web: where it came from, at its end
                    event = replace(event, text=cited(event.text, ctx.sources))
                if isinstance(event, Assistant) and ctx.parked:  # calls waiting for the person's OK: a button each
                    buttons = inc.chat_platform not in ("console", API_PLATFORM)  # a chat's; the terminal: /mcp allow
                    http = inc.chat_platform == API_PLATFORM  # the HTTP API: its route allows it
                    event = await mcp_confirm.asking(p.pool, event, ctx.parked, buttons=buttons, http=http)
                await writes.record(event)
                if isinstance(event, Assistant):  # with the tokens its model calls used (all reported by now)
                    event = replace(event, tokens=meter.used)
                if not isinstance(event, ModelToolCalls):  # the journal's business only
                    yield event
        except BaseException as e:  # cancelled at shutdown, closed by the adapter, or a failure: not `running`
            await writes.close_unfinished("failed" if isinstance(e, Exception) else "cut_short")
            raise
        finally:  # runs once the adapter consumed the answer (or closed the turn after it)
            meter.close()
            if ctx.requested_exit is not None:
                p.request_exit(ctx.requested_exit)
