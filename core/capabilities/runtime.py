"""Capabilities at run time: checking and importing their code, worker threads, and their context."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import sys
import threading
import traceback
import types
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

from core.constants import (
    CAPABILITY_LIVE_CALLS,
    CAPABILITY_LIVE_CALLS_PER_USER,
    QUERY_MAX_ARGS,
    QUERY_MAX_ROWS,
    QUERY_TIMEOUT_MS,
)
from core.storage.db import Pool, untrusted_sql_connection
from core.timeutil import Clock, zone
from core.tools.framework import ToolError
from core.types import UserRef

T = TypeVar("T")

READER_FUNCTION = "capability_rows_as_reader(text,text[],integer)"

Problem = dict[str, Any]  # {"error": "syntax_error|import_error|missing_function|invalid_schema", "message": …}


class CapabilityQueryError(Exception):
    """A capability's database query failed (raised inside the capability)."""


# ---- worker threads ------------------------------------------------------------------------------


class ThreadRunner:
    """Runs each job in a fresh daemon thread with its own event loop, so blocking code never stalls the bot.

    CPython cannot kill a thread: a timed-out job is cancelled in its own loop (which stops async code at
    its next await) and otherwise left to finish in the background; at most `limit` jobs live at once,
    and at most `per_user` of one owner's.
    """

    def __init__(self, limit: int = CAPABILITY_LIVE_CALLS, per_user: int = CAPABILITY_LIVE_CALLS_PER_USER) -> None:
        """No jobs yet."""
        self.limit = limit
        self.per_user = per_user
        self.live = 0
        self._owners: dict[str, int] = {}
        self._lock = threading.Lock()

    async def run(self, label: str, job: Callable[[], Coroutine[Any, Any, T]], *, owner: str | None = None) -> T:
        """Run `job()` in a worker thread; cancelling this await cancels the job's task in its loop."""
        with self._lock:
            mine = self._owners.get(owner, 0) if owner is not None else 0
            if owner is not None and mine >= self.per_user:
                raise ToolError(
                    f"you have {mine} capability calls still running (a capability may be stuck in a loop); "
                    "wait until they finish or time out, then try again"
                )
            if self.live >= self.limit:
                raise ToolError(f"{self.live} capability calls are still running; try again later")
            self.live += 1
            if owner is not None:
                self._owners[owner] = mine + 1
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        worker = _Worker(job, loop, done, lambda: self._release(owner))
        threading.Thread(target=worker.main, name=f"capability {label}", daemon=True).start()
        try:
            return await done
        except asyncio.CancelledError:
            worker.cancel()
            raise

    def _release(self, owner: str | None) -> None:
        """A worker thread ended."""
        with self._lock:
            self.live -= 1
            if owner is not None:
                left = self._owners.pop(owner) - 1
                if left:
                    self._owners[owner] = left


@dataclass
class _Worker:
    """One job in one thread: runs it in a new event loop and settles the caller's future."""

    job: Callable[[], Coroutine[Any, Any, Any]]
    caller: asyncio.AbstractEventLoop
    done: asyncio.Future[Any]
    release: Callable[[], None]
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _task: asyncio.Task[Any] | None = field(default=None, init=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)
    _cancelled: bool = field(default=False, init=False)

    def main(self) -> None:
        """The thread's body; the job counts as finished before the caller hears of it."""
        result: Any = None
        error: BaseException | None = None
        try:
            result = asyncio.run(self._guarded())
        except BaseException as e:
            error = e
        self.release()
        self._settle(result, error)

    async def _guarded(self) -> Any:
        """The job as a task of this thread's loop, unless it was cancelled before it started."""
        with self._lock:
            if self._cancelled:
                raise asyncio.CancelledError
            self._task, self._loop = asyncio.current_task(), asyncio.get_running_loop()
        return await self.job()

    def cancel(self) -> None:
        """Cancel the job (from the caller's thread)."""
        with self._lock:
            self._cancelled = True
            if self._task is not None and self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop already closed
                    self._loop.call_soon_threadsafe(self._task.cancel)

    def _settle(self, result: Any, error: BaseException | None) -> None:
        """Hand the outcome to the caller's loop; SystemExit and the like become plain errors."""
        if error is not None and not isinstance(error, Exception | asyncio.CancelledError):
            error = RuntimeError(f"the capability raised {type(error).__name__}")

        def settle() -> None:
            if self.done.done():
                return
            if isinstance(error, asyncio.CancelledError):
                self.done.cancel()
            elif error is not None:
                self.done.set_exception(error)
            else:
                self.done.set_result(result)

        with contextlib.suppress(RuntimeError):  # the bot's loop already closed
            self.caller.call_soon_threadsafe(settle)


# ---- checking and importing code -----------------------------------------------------------------


def module_name(name: str, version: int | str) -> str:
    """A module name no other load ever used, so a new version never meets the import cache."""
    return f"capability_{name}_v{version}_{uuid.uuid4().hex[:8]}"


def error_line(error: BaseException, filename: str) -> int | None:
    """The line of the capability's own code where `error` was raised, if any."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == filename]
    return frames[-1].lineno if frames else None


def describe_error(error: BaseException, filename: str) -> str:
    """`ZeroDivisionError: division by zero (line 3)`."""
    line = error_line(error, filename)
    text = f"{type(error).__name__}: {error}"
    return text if line is None else f"{text} (line {line})"


def syntax_problem(code: str, filename: str) -> tuple[types.CodeType | None, Problem | None]:
    """Compile the code; on failure the `syntax_error` problem with line and offset."""
    try:
        return compile(code, filename, "exec"), None
    except SyntaxError as e:
        return None, {"error": "syntax_error", "message": e.msg, "line": e.lineno, "offset": e.offset}
    except ValueError as e:  # e.g. a NUL byte in the source
        return None, {"error": "syntax_error", "message": str(e), "line": None, "offset": None}


def exec_fresh(code: types.CodeType, name: str) -> types.ModuleType:
    """Execute compiled code as a new module that is never left in sys.modules."""
    unique = module_name(name, "check")
    module = types.ModuleType(unique)
    module.__file__ = code.co_filename
    sys.modules[unique] = module  # dataclasses and typing look the module up while it runs
    try:
        exec(code, module.__dict__)
    finally:
        sys.modules.pop(unique, None)
    return module


def import_file(path: Path, name: str, version: int) -> types.ModuleType:
    """Import a materialised capability file as a module of its own (removed again if it fails)."""
    unique = module_name(name, version)
    spec = importlib.util.spec_from_file_location(unique, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(unique, None)
        raise
    return module


Entry = Callable[..., Awaitable[Any]]


def entry_point(module: types.ModuleType, name: str) -> tuple[Entry | None, bool, Problem | None]:
    """The capability's `async def name(params[, ctx])`, whether it takes the context, or a problem."""

    def missing(message: str) -> tuple[None, bool, Problem]:
        return None, False, {"error": "missing_function", "message": message}

    fn = getattr(module, name, None)
    if fn is None:
        return missing(f"the code defines no function named {name!r}; define `async def {name}(params, ctx)`")
    if not inspect.iscoroutinefunction(fn):
        return missing(f"{name!r} must be a coroutine function: `async def {name}(params, ctx)`")
    sig = inspect.signature(fn)
    for args, takes_context in (((None, None), True), ((None,), False)):
        try:
            sig.bind(*args)
        except TypeError:
            continue
        return fn, takes_context, None
    return missing(f"{name}{sig} must take (params: dict) and optionally a context argument")


def schema_problem(schema: Any) -> Problem | None:
    """None when `schema` is a valid JSON Schema for an object, else the `invalid_schema` problem."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return {"error": "invalid_schema", "message": 'parameters_schema must be a JSON Schema with "type": "object"'}
    from jsonschema import Draft202012Validator  # loaded by the first schema checked
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.path) or "(root)"
        return {"error": "invalid_schema", "message": f"{where}: {e.message}"}
    return None


def materialise(directory: Path, name: str, version: int, code: str) -> Path:
    """Write a version's code to `directory/name_vN.py` (atomically; unchanged files are left alone)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}_v{version}.py"
    if not path.exists() or path.read_text(encoding="utf-8") != code:
        tmp = path.with_suffix(f".{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(code, encoding="utf-8")
        tmp.replace(path)
    return path


# ---- the context a capability receives -----------------------------------------------------------


QueryFn = Callable[[str, tuple[Any, ...]], Coroutine[Any, Any, list[dict[str, Any]]]]


@dataclass(frozen=True)
class CapabilityContext:
    """What a capability may know and do: the speaking user, their time zone, and read-only queries."""

    user_id: str  # the platform's user id
    user_name: str
    platform: str
    timezone: str
    is_admin: bool
    _clock: Clock = field(repr=False)
    _query: QueryFn = field(repr=False)
    _loop: asyncio.AbstractEventLoop = field(repr=False)

    @property
    def tz(self) -> ZoneInfo:
        """The user's time zone."""
        return zone(self.timezone)

    def now(self) -> datetime:
        """The current time in the user's time zone."""
        return self._clock().astimezone(self.tz)

    async def query(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        """Run one read-only SELECT as this user may (admins: everything; others: their own rows)."""
        future = asyncio.run_coroutine_threadsafe(self._query(sql, args), self._loop)
        return await asyncio.wrap_future(future)


def _as_text(value: Any) -> str | None:
    """A query argument as text (the SQL casts it: `$1::int`)."""
    if value is None:
        return None
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


async def run_query(
    pool: Pool,
    user: UserRef,
    is_admin: bool,
    timeout_s: float,
    sql: str,
    args: tuple[Any, ...],
    *,
    personal: bool = False,
    task_chat: int | None = None,
) -> list[dict[str, Any]]:
    """One read-only statement wrapped as `SELECT to_json(r) FROM (<sql>) r`, as the user may see it (capped rows).

    A non-admin sees their memory rows only in a `personal` turn (sql/015: a flag signed for this user), and with
    `task_chat` only their tasks of that chat (sql/017; None: all of theirs)."""
    import asyncpg

    if len(args) > QUERY_MAX_ARGS:
        raise CapabilityQueryError(f"at most {QUERY_MAX_ARGS} query arguments")
    text_args = [_as_text(a) for a in args]
    ms = max(100, min(QUERY_TIMEOUT_MS, int(timeout_s * 1000)))
    async with pool.acquire() as conn, conn.transaction(readonly=True):
        untrusted_sql_connection(conn)
        reader_ok = await conn.fetchval(
            "SELECT to_regprocedure($3) IS NOT NULL FROM (SELECT set_config('statement_timeout', $1, true),"
            " set_config('app.user_id', $2, true), set_config('app.user_sig', capability_sign($2), true),"
            " set_config('app.personal', $4, true), set_config('app.personal_sig', capability_sign($2 || ':personal:'"
            " || $4), true), set_config('app.task_chat', $5, true),"
            " set_config('app.task_chat_sig', capability_sign($2 || ':chat:' || $5), true)) s",
            str(ms),
            str(user.account_id),  # capability_user_id(): the account (sql/020)
            READER_FUNCTION,
            "on" if personal else "off",
            "" if task_chat is None else str(task_chat),
        )
        if not is_admin and not reader_ok:
            raise CapabilityQueryError(
                "database queries for non-admin users are off: the bot's database user may not create roles"
            )
        function = "capability_rows" if is_admin else "capability_rows_as_reader"
        try:
            # The function counts rows outside the query's text (sql/005); the LIMIT here is a second fence.
            rows = await conn.fetch(
                f"SELECT * FROM {function}($1, $2::text[], $3) LIMIT $3",
                sql.strip().rstrip(";"),
                text_args,
                QUERY_MAX_ROWS,
            )
        except asyncpg.PostgresError as e:
            raise CapabilityQueryError(f"{type(e).__name__}: {e}") from None
    return [r[0] for r in rows]
