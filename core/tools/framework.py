"""The tool framework: typed parameters, the per-call context, and the result envelope."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ValidationError

from core.constants import (
    TOOL_ARGUMENTS_PROMPT_CHARS,
    TOOL_NAME_CHARS,
    TOOL_NAMES_SHOWN,
    TOOL_RESULT_PROMPT_CHARS,
    VALIDATION_PROBLEMS_SHOWN,
)
from core.quoting import truncate
from core.storage.db import Pool
from core.textsafe import clean_json
from core.timeutil import Clock, zone
from core.types import ChatRef, Source, UserRef

if TYPE_CHECKING:  # jsonschema loads with the first tool whose arguments are a JSON Schema (capabilities, MCP)
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError as JsonSchemaError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Caps:
    """Per-account limits the tools enforce (from the settings; the defaults are the settings' defaults)."""

    max_open_tasks: int = 200
    job_min_interval_minutes: int = 15


@dataclass
class ToolContext:
    """What every tool call receives: the database, the speaking user and chat, their role, a clock."""

    pool: Pool
    user: UserRef
    chat: ChatRef
    is_admin: bool  # admin tools are allowed in this turn: an admin speaks AND only admins wrote its context
    clock: Clock
    step_timeout: float = 60.0
    on_tasks_changed: Callable[[], None] = field(default=lambda: None)
    requested_exit: int | None = None  # restart(mode="full") sets it: the process exits after this turn's reply
    personal: bool = True  # personal tools (memory) are allowed: not in a group chat
    own_words: bool = False  # the turn's context holds only the speaker's own words (no one else's, nothing quoted)
    caps: Caps = field(default_factory=lambda: Caps())

    tainted: bool = False  # a tool result of this turn brought in someone else's text (see taint)
    found: list[str] = field(default_factory=list)  # tools a search (mcp_search) added for the rest of the turn
    parked: list[int] = field(default_factory=list)  # calls waiting for the person's OK (core/mcp_servers/confirm.py)
    sources: list[Source] = field(default_factory=list)  # web pages searched or read: the answer cites them

    def taint(self) -> None:
        """A tool result carries someone else's text (e.g. a job written in a group): the rest of the turn holds
        others' words, so no admin tools, and tasks written now are not the owner's own."""
        self.tainted, self.own_words, self.is_admin = True, False, False

    @property
    def task_chat(self) -> int | None:
        """The chat whose tasks this turn may see and change: the current one in a group or with others' text in the
        context (a group must not read or rewrite the speaker's private tasks); None: all of the speaker's tasks."""
        return self.chat.id if self.chat.kind == "group" or not self.own_words else None

    @property
    def tz(self) -> ZoneInfo:
        """The speaking user's time zone."""
        return zone(self.user.timezone)

    def now(self) -> datetime:
        """The current time (aware, UTC) from the injectable clock."""
        return self.clock()


class ToolError(Exception):
    """A failure the model should read and can often fix (becomes a `tool_error` envelope)."""

    def __init__(self, message: str, details: dict[str, Any] | None = None, *, code: str = "tool_error") -> None:
        """The message, optional structured details the model can act on, and the envelope's error code."""
        super().__init__(message)
        self.details = details
        self.code = code


Handler = Callable[[Any, ToolContext], Awaitable[Any]]


def _strip_titles(node: Any) -> Any:
    """Keep pydantic's tool schemas lean for the prompt: no `title` keys, and an optional field (`X | None = None`)
    shown as plain X (it is not required; pydantic still accepts null)."""
    if isinstance(node, dict):
        options = node.get("anyOf")
        if "default" in node and node["default"] is None and isinstance(options, list) and {"type": "null"} in options:
            rest = [o for o in options if o != {"type": "null"}]
            if len(rest) == 1:
                node = {**{k: v for k, v in node.items() if k not in ("anyOf", "default")}, **rest[0]}
        return {k: _strip_titles(v) for k, v in node.items() if k != "title"}
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


@dataclass(frozen=True)
class Tool:
    """A tool offered to the model: a pydantic params model (or a raw JSON Schema) + async handler.

    With a JSON Schema the handler receives the arguments as a dict, validated against the schema.
    """

    name: str
    description: str
    params: type[BaseModel] | dict[str, Any]
    handler: Handler
    admin_only: bool = False
    personal: bool = False  # acts on the speaker's personal memory: offered only where that stays private
    timeout: float | None = None  # a tighter limit than the step timeout (capabilities)
    schema: dict[str, Any] = field(init=False, repr=False, compare=False)
    _validator: Draft202012Validator | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Generate the OpenAI function schema once."""
        if isinstance(self.params, dict):
            parameters = self.params
        else:
            parameters = _strip_titles(self.params.model_json_schema())
            parameters.pop("description", None)  # the params model's docstring: the tool's description says it
        object.__setattr__(
            self,
            "schema",
            {
                "type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": parameters},
            },
        )

    def parse(self, data: dict[str, Any]) -> Any:
        """The handler's first argument from the decoded arguments; raises ValueError with a readable text."""
        if not isinstance(self.params, dict):
            try:
                return self.params.model_validate(data)
            except ValidationError as e:
                raise ValueError(_validation_message(e)) from None
        problems = sorted(self._json_validator(self.params).iter_errors(data), key=lambda e: [str(p) for p in e.path])
        if problems:
            raise ValueError(_schema_message(problems))
        return data

    def _json_validator(self, schema: dict[str, Any]) -> Draft202012Validator:
        """The validator of `schema` (the params), made on the first call (jsonschema loads with the first)."""
        if self._validator is None:
            from jsonschema import Draft202012Validator

            object.__setattr__(self, "_validator", Draft202012Validator(schema))
        assert self._validator is not None
        return self._validator


def ok(result: Any) -> dict[str, Any]:
    """A success envelope."""
    return {"ok": True, "result": result}


def err(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """An error envelope; code is one of invalid_args|unknown_function|tool_error|timeout|forbidden."""
    error: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        error["details"] = details
    return {"ok": False, "error": error}


def _validation_message(e: ValidationError) -> str:
    """A compact, model-readable list of what is wrong with the arguments."""
    parts = []
    for item in e.errors()[:VALIDATION_PROBLEMS_SHOWN]:
        where = ".".join(str(p) for p in item["loc"]) or "arguments"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def _schema_message(problems: list[JsonSchemaError]) -> str:
    """A compact, model-readable list of JSON Schema violations."""
    parts = []
    for e in problems[:VALIDATION_PROBLEMS_SHOWN]:
        where = ".".join(str(p) for p in e.path) or "arguments"
        parts.append(f"{where}: {e.message}")
    return "; ".join(parts)


def envelope_for_prompt(envelope: dict[str, Any], limit: int = TOOL_RESULT_PROMPT_CHARS) -> str:
    """The envelope as JSON for the model, cut to `limit` characters with a marker."""
    return truncate(json.dumps(envelope, ensure_ascii=False, default=str), limit)


def arguments_for_prompt(arguments: str, limit: int = TOOL_ARGUMENTS_PROMPT_CHARS) -> str:
    """A call's arguments for the prompt: oversized ones become a small JSON object (still valid JSON)."""
    if len(arguments) <= limit:
        return arguments
    note = f"arguments of {len(arguments)} characters cut from the conversation (the call ran with all of them)"
    return json.dumps({"_truncated": note})


def calls_for_prompt(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored assistant tool calls with oversized arguments and names cut (the stored list itself is left alone)."""
    out = []
    for call in calls:
        fn = call.get("function") or {}
        args, name = fn.get("arguments"), fn.get("name")
        if isinstance(args, str) and len(args) > TOOL_ARGUMENTS_PROMPT_CHARS:
            fn = {**fn, "arguments": arguments_for_prompt(args)}
        if isinstance(name, str) and len(name) > TOOL_NAME_CHARS:
            fn = {**fn, "name": name[:TOOL_NAME_CHARS]}
        out.append({**call, "function": fn} if fn is not call.get("function") else call)
    return out


class ToolRegistry:
    """The set of tools; offers only what the speaking user may use and runs calls into envelopes."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        """Register the given tools."""
        self._tools: dict[str, Tool] = {}
        self.revision = 0  # changes whenever a tool is added or removed (capabilities come and go)
        for t in tools:
            self.add(t)

    def add(self, tool: Tool) -> None:
        """Register (or replace) a tool."""
        self._tools[tool.name] = tool
        self.revision += 1

    def remove(self, name: str) -> None:
        """Unregister a tool (if present)."""
        if self._tools.pop(name, None) is not None:
            self.revision += 1

    def get(self, name: str) -> Tool | None:
        """The tool of that name, if any."""
        return self._tools.get(name)

    def offered(self, is_admin: bool, personal: bool = True) -> list[Tool]:
        """The tools the speaking user may see: admin tools only for admins, personal ones only in personal turns."""
        return [t for t in self._tools.values() if (is_admin or not t.admin_only) and (personal or not t.personal)]

    async def run(self, name: str, raw_args: str, ctx: ToolContext, timeout: float) -> dict[str, Any]:
        """Run one call and always return an envelope, never raise."""
        tool = self._tools.get(name)
        if tool is not None and tool.personal and not ctx.personal:
            tool = None  # not offered here, so it does not exist here (not even its name is confirmed)
        if tool is None or (tool.admin_only and not ctx.is_admin):
            if tool is not None:
                return err("forbidden", f"{name} is only available to admins")
            offered = [t.name for t in self.offered(ctx.is_admin, ctx.personal)]
            names = ", ".join(offered[:TOOL_NAMES_SHOWN]) + (", …" if len(offered) > TOOL_NAMES_SHOWN else "")
            return err("unknown_function", f"there is no tool named '{name}'; available: {names}")
        try:
            data = clean_json(json.loads(raw_args)) if raw_args.strip() else {}  # a \u0000 escape: not stored
        except json.JSONDecodeError as e:
            return err("invalid_args", f"arguments are not valid JSON ({e.msg} at position {e.pos})")
        if not isinstance(data, dict):
            return err("invalid_args", "arguments must be a JSON object")
        try:
            params = tool.parse(data)
        except ValueError as e:
            return err("invalid_args", str(e))
        if tool.timeout is not None:
            timeout = min(timeout, tool.timeout)
        try:
            result = await asyncio.wait_for(tool.handler(params, ctx), timeout)
        except TimeoutError:
            return err("timeout", f"{name} did not finish within {timeout:.3g} s")
        except ToolError as e:
            return err(e.code, str(e), e.details)
        except Exception as e:
            log.exception("tool %s failed", name)
            return err("tool_error", f"{type(e).__name__}: {e}")
        return ok(result)


async def timed_run(
    registry: ToolRegistry, name: str, raw_args: str, ctx: ToolContext, timeout: float
) -> tuple[dict[str, Any], float]:
    """Run a call and measure how long it took (seconds)."""
    start = time.perf_counter()
    envelope = await registry.run(name, raw_args, ctx, timeout)
    return envelope, time.perf_counter() - start
