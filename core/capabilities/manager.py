"""Self-built capabilities: the agent writes, checks, stores (versioned, in PostgreSQL) and hot-loads tools.

Admin tools: `write_capability`, `manage_capability` (list, show, rollback, disable, enable) and `restart`.
Every allowed user may call the enabled capabilities, which are ordinary tools in the Core's registry.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, Field

from core.capabilities import store
from core.capabilities.runtime import (
    CapabilityContext,
    Problem,
    ThreadRunner,
    describe_error,
    entry_point,
    exec_fresh,
    import_file,
    materialise,
    run_query,
    schema_problem,
    syntax_problem,
)
from core.constants import CAPABILITY_RESULT_CHARS
from core.quoting import truncate
from core.storage.db import Pool, connect_like
from core.storage.listen import ChangeListener
from core.timeutil import Clock
from core.tools.framework import Tool, ToolContext, ToolError, ToolRegistry

log = logging.getLogger(__name__)

NAME_PATTERN = r"^[a-z][a-z0-9_]{1,47}$"
CHANNEL = "capability_changed"  # sql/007_fleet.sql's trigger notifies it on every committed change
EXIT_RESTART = 42  # restart(mode="full") exits with this code; bot/loop.sh and Procfile platforms start again

CODE_HELP = (
    "Python module defining `async def <name>(params: dict, ctx)`. ctx: user_id, user_name, platform, "
    "timezone, tz (ZoneInfo), now() (aware, user's zone), is_admin, `await ctx.query(sql, *args)` → list of "
    "dicts (one read-only SELECT; args arrive as text, cast them: $1::int; admins see all rows, others only "
    "their rows of users, tasks, occurrences, and of memory_blocks, archival_memory only in a private chat; "
    "capability_user_id() is the speaker's account id, the owner in tasks.user_id and memory_blocks.user_id). "
    "Return JSON-serialisable data. Blocking code is fine (own thread)."
)


def materialised_dir(data_dir: Path) -> Path:
    """DATA_DIR/capabilities, made absolute now (a relative DATA_DIR counts from the start's cwd): the run-time code
    is written there, never into the source tree, so a read-only deploy still works."""
    return (data_dir / "capabilities").resolve()


def changed_name(payload: str) -> str | None:
    """The capability a change notification names, or None for "reload them all" (also for a payload we cannot read)."""
    try:
        name = json.loads(payload).get("name")
    except (ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def _filename(name: str) -> str:
    """The pseudo file name of code being checked (tracebacks point at it)."""
    return f"<capability {name}>"


class LoadError(Exception):
    """A stored capability could not be loaded; the message says why."""


@dataclass(frozen=True)
class Loaded:
    """A capability version imported and ready to call."""

    name: str
    version: int
    description: str
    schema: dict[str, Any]
    fn: Callable[..., Awaitable[Any]] = field(repr=False)
    takes_context: bool
    filename: str


class WriteCapabilityParams(BaseModel):
    """Parameters of write_capability."""

    name: str = Field(pattern=NAME_PATTERN, description="snake_case; the tool's and the async function's name")
    description: str = Field(min_length=1, max_length=300, description="one line: what it does, when to use it")
    code: str = Field(min_length=1, max_length=50000, description=CODE_HELP)
    parameters_schema: dict[str, Any] = Field(description='JSON Schema of params: {"type": "object", …}')


class ManageCapabilityParams(BaseModel):
    """Parameters of manage_capability."""

    action: Literal["list", "show", "rollback", "disable", "enable"]
    name: str | None = Field(default=None, description="the capability (all but list)")
    version: int | None = Field(default=None, ge=1, description="show: that version; rollback: required")


class RestartParams(BaseModel):
    """Parameters of restart."""

    mode: Literal["reload", "full"] = Field(description="reload: capabilities from the database; full: the process")


@dataclass
class LoadReport:
    """What a (re)load did."""

    loaded: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def as_result(self) -> dict[str, Any]:
        """The tool result."""
        summary = f"{len(self.loaded)} loaded" + (f", {len(self.failed)} failed" if self.failed else "")
        return {"loaded": self.loaded, "failed": self.failed, "summary": summary}


class CapabilityManager:
    """The capabilities of one Core: loads them into its registry and serves the admin tools."""

    def __init__(self, pool: Pool, registry: ToolRegistry, directory: Path, timeout: float, clock: Clock) -> None:
        """Wire the manager; `install()` adds its admin tools, `load_all()` the stored capabilities."""
        self.pool, self.registry, self.directory, self.timeout, self.clock = pool, registry, directory, timeout, clock
        self.loaded: dict[str, Loaded] = {}
        self.runner = ThreadRunner()
        self.listener = ChangeListener(CHANNEL, lambda: connect_like(pool), self.notified)
        self._refresh_lock = asyncio.Lock()  # notifications are applied one at a time, in order

    def install(self) -> None:
        """Add the admin tools to the registry."""
        self.registry.add(
            Tool(
                "write_capability",
                "Admin only: create or replace a capability (your own Python tool): checked, stored as a new "
                "version, usable at once; errors come back as JSON with what to fix.",
                WriteCapabilityParams,
                self.write,
                admin_only=True,
            )
        )
        self.registry.add(
            Tool(
                "manage_capability",
                "Admin only: list capabilities with versions, show one's code, roll back to a version, "
                "disable or enable one.",
                ManageCapabilityParams,
                self.manage,
                admin_only=True,
            )
        )
        self.registry.add(
            Tool(
                "restart",
                "Admin only: reload capabilities from the database, or restart the whole bot after this answer.",
                RestartParams,
                self.restart,
                admin_only=True,
            )
        )

    def summaries(self) -> list[tuple[str, str]]:
        """(name, one-line description) of the loaded capabilities, by name."""
        return [(c.name, c.description.splitlines()[0]) for c in sorted(self.loaded.values(), key=lambda c: c.name)]

    def builtin_names(self) -> set[str]:
        """Names of the registry's tools that are not capabilities (a capability may not take them)."""
        return {t.name for t in self.registry.offered(True)} - set(self.loaded)

    # ---- loading ---------------------------------------------------------------------------------

    async def load_all(self) -> LoadReport:
        """Materialise and load every enabled capability; a broken one is logged and skipped."""
        report = LoadReport()
        versions = await store.enabled_current(self.pool)
        for gone in set(self.loaded) - {v.name for v in versions}:
            self._unregister(gone)
        for v in versions:
            try:
                cap = await self._load(v)
            except LoadError as e:
                log.error("capability %s v%d could not be loaded: %s", v.name, v.version, e)
                report.failed[v.name] = str(e)
                self._unregister(v.name)
                continue
            self._register(cap)
            report.loaded.append(f"{v.name} v{v.version}")
        return report

    async def notified(self, payload: str | None) -> None:
        """A change notification (None: the listener (re)connected): refresh what it names."""
        await self.refresh(None if payload is None else changed_name(payload))

    async def refresh(self, name: str | None = None) -> None:
        """Bring the loaded capabilities (one, or all) in line with the database: load new current versions, drop
        disabled or removed ones; one already loaded at its current version is left alone (so a process's own
        change, notified back to it, costs one query)."""
        async with self._refresh_lock:
            if name is None:
                versions = await store.enabled_current(self.pool)
                gone = set(self.loaded) - {v.name for v in versions}
            else:
                v = await store.get_version(self.pool, name)
                versions = [v] if v is not None and v.enabled else []
                gone = set() if versions else {name}
            for stale in gone:
                self._unregister(stale)
            for v in versions:
                current = self.loaded.get(v.name)
                if current is not None and current.version == v.version:
                    continue
                try:
                    self._register(await self._load(v))
                except LoadError as e:
                    log.error("capability %s v%d could not be loaded: %s", v.name, v.version, e)
                    self._unregister(v.name)

    @asynccontextmanager
    async def following(self) -> AsyncIterator[ChangeListener]:
        """While inside, changes committed by any process (NOTIFY) are loaded here within moments."""
        self.listener.start()
        try:
            yield self.listener
        finally:
            await self.listener.stop()

    async def _load(self, v: store.Version) -> Loaded:
        """Write the version to the directory and import it in a worker thread (under the timeout)."""
        if v.name in self.builtin_names():
            raise LoadError(f"the name {v.name!r} is taken by a built-in tool")
        path = await asyncio.to_thread(materialise, self.directory, v.name, v.version, v.code)

        async def job() -> Any:
            return import_file(path, v.name, v.version)

        try:
            module = await asyncio.wait_for(self.runner.run(f"load {v.name}", job), self.timeout)
        except TimeoutError:
            raise LoadError(f"importing did not finish within {self.timeout:.3g} s") from None
        except Exception as e:
            raise LoadError(describe_error(e, str(path))) from None
        fn, takes_context, problem = entry_point(module, v.name)
        problem = problem or schema_problem(v.parameters_schema)
        if problem is not None or fn is None:
            raise LoadError(str((problem or {}).get("message")))
        return Loaded(v.name, v.version, v.description, v.parameters_schema, fn, takes_context, str(path))

    def _register(self, cap: Loaded) -> None:
        """Offer the capability as a tool (replacing an earlier version, whose module is forgotten)."""
        previous = self.loaded.get(cap.name)
        if previous is not None and previous.fn.__module__ != cap.fn.__module__:
            sys.modules.pop(previous.fn.__module__, None)
        self.loaded[cap.name] = cap
        handler = functools.partial(self._call, cap)
        self.registry.add(Tool(cap.name, cap.description, cap.schema, handler, timeout=self.timeout))

    def _unregister(self, name: str) -> None:
        """Stop offering a capability."""
        cap = self.loaded.pop(name, None)
        if cap is not None:
            sys.modules.pop(cap.fn.__module__, None)
            self.registry.remove(name)

    # ---- calling ---------------------------------------------------------------------------------

    async def _call(self, cap: Loaded, params: dict[str, Any], ctx: ToolContext) -> Any:
        """Run one call in a worker thread (the registry applies the timeout); errors become tool errors."""
        loop = asyncio.get_running_loop()

        async def query(sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
            return await run_query(
                ctx.pool,
                ctx.user,
                ctx.is_admin,
                self.timeout,
                sql,
                args,
                personal=ctx.personal,
                task_chat=ctx.task_chat,
            )

        cap_ctx = CapabilityContext(
            ctx.user.platform_user_id,
            ctx.user.display_name,
            ctx.user.platform,
            ctx.user.timezone,
            ctx.is_admin,
            self.clock,
            query,
            loop,
        )
        args = (dict(params), cap_ctx) if cap.takes_context else (dict(params),)

        async def job() -> Any:
            return await cap.fn(*args)

        try:
            result = await self.runner.run(cap.name, job, owner=f"{ctx.user.platform}:{ctx.user.platform_user_id}")
        except ToolError:
            raise
        except Exception as e:
            log.warning("capability %s v%d raised %s", cap.name, cap.version, describe_error(e, cap.filename))
            raise ToolError(describe_error(e, cap.filename)) from None
        return _limited(result)

    # ---- the admin tools -------------------------------------------------------------------------

    async def write(self, p: WriteCapabilityParams, ctx: ToolContext) -> dict[str, Any]:
        """write_capability: check, store as a new version, load; a problem comes back as structured JSON."""
        if p.name in self.builtin_names():
            _fail({"error": "invalid_name", "message": f"{p.name!r} is a built-in tool; choose another name"})
        problem = await self.check(p.name, p.code, p.parameters_schema)
        if problem is not None:
            _fail(problem)
        by = f"{ctx.user.platform}:{ctx.user.platform_user_id}"
        version = await store.save_version(self.pool, p.name, p.description, p.code, p.parameters_schema, by)
        v = store.Version(p.name, version, p.description, p.code, p.parameters_schema)
        try:
            self._register(await self._load(v))
        except LoadError as e:
            raise ToolError(f"stored as version {version} but it could not be loaded: {e}") from None
        return {"name": p.name, "version": version, "summary": f"{p.name} v{version} saved and loaded"}

    async def check(self, name: str, code: str, schema: dict[str, Any]) -> Problem | None:
        """The validation pipeline: syntax → import in a fresh module → async function → schema."""
        compiled, problem = syntax_problem(code, _filename(name))
        if compiled is None:
            return problem

        async def job() -> Any:
            return exec_fresh(compiled, name)

        try:
            module = await asyncio.wait_for(self.runner.run(f"check {name}", job), self.timeout)
        except TimeoutError:
            return {"error": "import_error", "message": f"importing did not finish within {self.timeout:.3g} s"}
        except ToolError:
            raise
        except Exception as e:
            return {"error": "import_error", "message": describe_error(e, _filename(name))}
        _, _, problem = entry_point(module, name)
        return problem or schema_problem(schema)

    async def manage(self, p: ManageCapabilityParams, ctx: ToolContext) -> Any:
        """manage_capability: list, show, rollback, disable, enable."""
        if p.action == "list":
            caps = await store.listing(self.pool)
            return {"capabilities": caps, "summary": f"{len(caps)} capabilit{'y' if len(caps) == 1 else 'ies'}"}
        if p.name is None:
            raise ToolError(f"{p.action} needs the capability's name")
        current = await store.get_version(self.pool, p.name)
        if current is None:
            raise ToolError(f"there is no capability named {p.name!r}")
        by = f"{ctx.user.platform}:{ctx.user.platform_user_id}"
        if p.action == "show":
            return await self._show(p.name, p.version or current.version, current)
        if p.action == "disable":
            await store.set_enabled(self.pool, p.name, False, by)
            self._unregister(p.name)
            return {"summary": f"{p.name} disabled"}
        if p.action == "enable":
            cap = await self._load_or_fail(current)
            await store.set_enabled(self.pool, p.name, True, by)
            self._register(cap)
            return {"summary": f"{p.name} v{current.version} enabled"}
        return await self._rollback(p.name, p.version, current, by)

    async def _show(self, name: str, version: int, current: store.Version) -> dict[str, Any]:
        """One version's code, description and schema."""
        v = await store.get_version(self.pool, name, version)
        if v is None:
            raise ToolError(f"{name} has no version {version}")
        return {
            "name": name,
            "version": v.version,
            "current_version": current.version,
            "enabled": current.enabled,
            "description": v.description,
            "parameters_schema": v.parameters_schema,
            "code": v.code,
            "summary": f"{name} v{v.version}",
        }

    async def _rollback(self, name: str, version: int | None, current: store.Version, by: str) -> dict[str, Any]:
        """Make an older version current again (loaded first, so a broken one changes nothing)."""
        if version is None:
            raise ToolError("rollback needs the version to go back to")
        v = await store.get_version(self.pool, name, version)
        if v is None:
            raise ToolError(f"{name} has no version {version}")
        cap = await self._load_or_fail(v) if current.enabled else None
        await store.set_current(self.pool, name, version, by)
        if cap is not None:
            self._register(cap)
        return {"summary": f"{name} rolled back to v{version} (was v{current.version})"}

    async def _load_or_fail(self, v: store.Version) -> Loaded:
        """Load a version, or tell the model why it cannot be."""
        try:
            return await self._load(v)
        except LoadError as e:
            raise ToolError(f"{v.name} v{v.version} could not be loaded: {e}") from None

    async def restart(self, p: RestartParams, ctx: ToolContext) -> dict[str, Any]:
        """restart: reload capabilities now, or exit with code 42 once this answer has been sent."""
        if p.mode == "reload":
            return (await self.load_all()).as_result()
        ctx.requested_exit = EXIT_RESTART
        return {"summary": "the bot restarts right after this answer is sent"}


def _fail(problem: Problem) -> NoReturn:
    """Raise the tool error that carries a validation problem as its details."""
    raise ToolError(f"{problem['error']}: {problem['message']}", problem)


def _limited(result: Any) -> Any:
    """The result, or its text (JSON unless a string) cut to CAPABILITY_RESULT_CHARS with a marker when too long."""
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
    return result if len(text) <= CAPABILITY_RESULT_CHARS else truncate(text, CAPABILITY_RESULT_CHARS)
