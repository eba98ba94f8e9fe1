"""The agent loop: model → tool calls → results → … → answer, bounded in steps and time."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from core.activity import make_step, step_line
from core.agent.llm import LLM, MALFORMED, LLMReply, LLMTimeout, LLMUnavailable
from core.constants import WRAP_UP_MIN_S
from core.tools.framework import Tool, ToolContext, ToolRegistry, calls_for_prompt, envelope_for_prompt, timed_run
from core.types import Assistant, AssistantDelta, Error, Event, ModelToolCalls, Step, ToolCall, ToolResult

log = logging.getLogger(__name__)

CORRECTIVE_NOTE = (
    "[note from the bot, not the user] Your previous reply was empty or malformed. "
    "Reply to the user now with text, or call one of the tools with a JSON object as arguments."
)
WRAP_UP_NOTE = (
    "[note from the bot, not the user] The step limit is reached: do not call tools. In a few sentences, "
    "tell the user what you did and what is not finished."
)
REFUSED_HINT = "if the conversation is too long for the model, /reset starts a fresh one."
LENGTH_NOTE = "\n\n_(cut short: the model hit its length limit)_"
IMAGES_REFUSED_NOTE = "_(This model can't look at images: I answered from the text alone, and I'll remember that.)_\n\n"
OVER_BUDGET = "over_budget"  # the Error code of a turn refused by a budget before its first model call


class Budget(Protocol):
    """The spending check around each model call of a turn (core/accounts/usage.py)."""

    async def admit(self) -> str | None:
        """Before a model call: None to go ahead, or the line saying which budget is used up (no call then)."""
        ...

    def spent(self, reply: LLMReply | None) -> None:
        """After a model call (None: it failed): record its usage in the background; never raises."""
        ...


@dataclass(frozen=True)
class Limits:
    """Bounds of one turn."""

    max_steps: int
    step_timeout: float
    total_timeout: float


def _valid(reply: LLMReply) -> bool:
    """A reply is usable when it has text or well-formed tool calls."""
    if reply.finish_reason == MALFORMED:
        return False
    if reply.tool_calls:
        return all(c.name for c in reply.tool_calls)
    return bool((reply.content or "").strip())


def _over_budget_text(steps: Sequence[Step], line: str) -> str:
    """The answer of a turn a budget stopped after some steps: the line, then what was done."""
    return "\n".join([line, "What I did before stopping:", *(f"- {step_line(s)}" for s in steps)])


async def _metered(
    llm: LLM, meter: Budget | None, messages: list[dict[str, Any]], schemas: list[dict[str, Any]], **kw: Any
) -> AsyncGenerator[str | LLMReply, None]:
    """One model call (llm.chat's items), its usage handed to `meter` however it ends."""
    reply: LLMReply | None = None
    try:
        async for item in llm.chat(messages, schemas, **kw):
            if isinstance(item, LLMReply):
                reply = item
            yield item
    finally:
        if meter is not None:
            meter.spent(reply)


def _fallback_text(steps: Sequence[Step], reason: str) -> str:
    """A best-effort answer built without the model."""
    lines = [f"I had to stop before finishing: {reason}."]
    if steps:
        lines.append("What I did:")
        lines.extend(f"- {step_line(s)}" for s in steps)
    return "\n".join(lines)


async def run_agent(
    llm: LLM,
    registry: ToolRegistry,
    tools: Sequence[Tool],
    ctx: ToolContext,
    turn_id: int,
    messages: list[dict[str, Any]],
    limits: Limits,
    *,
    stream: bool = False,
    meter: Budget | None = None,
    offer: Callable[[ToolContext], Sequence[Tool]] | None = None,
) -> AsyncGenerator[Event, None]:
    """Run one turn and yield its events (the caller's journal stores them); always ends with Assistant or Error.

    The tools are offered again at every step, so a capability written in this turn can be called in it. `meter`
    is asked before each model call: past a budget the turn stops there, keeping what its steps did. `offer` gives the
    tools again when they change mid-turn (default: what the registry offers the speaker).
    """
    started = time.monotonic()
    deadline = started + limits.total_timeout
    schemas = [t.schema for t in tools]
    revision = registry.revision
    steps: list[Step] = []
    corrected = False
    cut_short: str | None = None
    blind = ""  # the note an answer starts with once the model refused the turn's images
    for _ in range(limits.max_steps):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            cut_short = f"the time limit of {limits.total_timeout:.0f} s for one answer"
            break
        over = await meter.admit() if meter is not None else None
        if over is not None:
            if not steps:  # stored as the turn's answer, like any error answer
                yield Error(OVER_BUDGET, over, turn_id)
                return
            text = _over_budget_text(steps, over)
            yield Assistant(text, turn_id, tuple(steps), time.monotonic() - started, cut_short=over)
            return
        try:
            reply = LLMReply(content=None)
            timeout = min(limits.step_timeout, remaining)
            async with aclosing(_metered(llm, meter, messages, schemas, stream=stream, timeout=timeout)) as items:
                async for item in items:
                    if isinstance(item, str):
                        yield AssistantDelta(item)
                    else:
                        reply = item
        except LLMTimeout as e:
            cut_short = str(e)
            break
        except LLMUnavailable as e:
            if not steps:  # the error is the turn's answer: stored like one, so a redelivery sends this same text
                hint = REFUSED_HINT if e.refused else "please try again in a moment."
                yield Error("llm_unavailable", f"{e} Your message is saved; {hint}", turn_id)
                return
            cut_short = f"the language model stopped answering ({e})"
            break
        if reply.images_refused:
            blind = IMAGES_REFUSED_NOTE
        if not _valid(reply):
            if corrected:
                malformed = reply.finish_reason == MALFORMED
                cut_short = "the model's reply was malformed twice" if malformed else "the model gave no usable answer"
                break
            corrected = True
            messages.append({"role": "user", "content": CORRECTIVE_NOTE})
            continue
        if not reply.tool_calls:
            text = (reply.content or "").strip()
            if reply.finish_reason == "length":
                text += LENGTH_NOTE
            yield Assistant(blind + text, turn_id, tuple(steps), time.monotonic() - started)
            return
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
        yield ModelToolCalls(reply.content, tuple(calls))
        messages.append({"role": "assistant", "content": reply.content, "tool_calls": calls_for_prompt(calls)})
        for c in reply.tool_calls:
            yield ToolCall(c.id, c.name, c.arguments)
            budget = max(0.1, min(limits.step_timeout, deadline - time.monotonic()))
            was_tainted, found = ctx.tainted, len(ctx.found)
            envelope, took = await timed_run(registry, c.name, c.arguments, ctx, budget)
            foreign = ctx.tainted and not was_tainted  # this result brought in others' text: marked for later turns
            if registry.revision != revision or foreign or len(ctx.found) != found:  # a capability came, admin went
                offered = offer(ctx) if offer is not None else registry.offered(ctx.is_admin, ctx.personal)
                schemas, revision = [t.schema for t in offered], registry.revision
            messages.append({"role": "tool", "tool_call_id": c.id, "content": envelope_for_prompt(envelope)})
            step = make_step(c.name, c.arguments, envelope, took)
            steps.append(step)
            yield ToolResult(c.id, step, envelope, foreign)
    else:
        cut_short = f"the step limit ({limits.max_steps} steps)"
    assert cut_short is not None
    text = await _wrap_up(llm, messages, schemas, limits, deadline, steps, cut_short, meter)
    yield Assistant(blind + text, turn_id, tuple(steps), time.monotonic() - started, cut_short=cut_short)


async def _wrap_up(
    llm: LLM,
    messages: list[dict[str, Any]],
    schemas: list[dict[str, Any]],
    limits: Limits,
    deadline: float,
    steps: Sequence[Step],
    reason: str,
    meter: Budget | None = None,
) -> str:
    """A best-effort answer after a limit: the model's summary when time allows (and the budget), always with the
    reason."""
    note = f"\n\n_(Cut short: {reason}.)_"
    remaining = min(limits.step_timeout, deadline - time.monotonic())
    if "step limit" in reason and remaining >= WRAP_UP_MIN_S:
        over = await meter.admit() if meter is not None else None
        if over is not None:
            return _over_budget_text(steps, over)
        try:
            reply = LLMReply(content=None)
            async for item in _metered(
                llm,
                meter,
                [*messages, {"role": "user", "content": WRAP_UP_NOTE}],
                schemas,
                stream=False,
                timeout=remaining,
                tool_choice="none",
            ):
                if isinstance(item, LLMReply):
                    reply = item
            if (reply.content or "").strip() and not reply.tool_calls:
                return (reply.content or "").strip() + note
        except (LLMTimeout, LLMUnavailable) as e:
            log.warning("wrap-up call failed: %s", e)
    return _fallback_text(steps, reason)
