"""The connection pool: connections that know what ran on them, retries of dropped calls, start-up checks."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg

from core.constants import CONNECT_TIMEOUT_S, DISCARD_CLOSE_TIMEOUT_S, DROP_RETRY_DELAYS, POOL_MAX_SIZE, POOL_MIN_SIZE
from core.settings import EXIT_CONFIG, EXIT_UNREACHABLE, StartupError
from core.textsafe import clean_json

log = logging.getLogger(__name__)

Pool = asyncpg.Pool
Conn = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy  # one connection, e.g. inside a transaction
T = TypeVar("T")
# Added to asyncpg's reset query: RESET ALL leaves the role alone, and a temp table (pg_temp is searched
# first) would shadow our tables for the next user of the connection.
_RESET_EXTRA = "SET SESSION AUTHORIZATION DEFAULT;\nRESET ROLE;\nDISCARD TEMP;\n"

# Errors that mean "this connection is gone" (failover, restart, pg_terminate_backend), not "this statement is wrong".
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.AdminShutdownError,
    asyncpg.CannotConnectNowError,
    ConnectionError,
    OSError,
)
# A connection whose server already sent "terminating connection" but whose socket close has not been
# seen yet is still handed out by the pool; using it fails with these messages (asyncpg's own errors).
_DROPPED_MESSAGES = ("cannot switch to state", "connection is closed")


def affected(status: str) -> int:
    """The row count of a command status such as `DELETE 12` or `UPDATE 3`."""
    return int(status.rsplit(" ", 1)[-1])


def is_dropped(e: BaseException) -> bool:
    """Whether `e` means the connection was lost, rather than that the statement was wrong."""
    if isinstance(e, CONNECTION_ERRORS):
        return True
    return isinstance(e, asyncpg.InternalClientError | asyncpg.InterfaceError) and any(
        m in str(e) for m in _DROPPED_MESSAGES
    )


# Errors that say "not now" about the server rather than "never" about the statement: out of connections, disk or
# memory, cancelled or shutting down, a deadlock or serialization failure, a read-only server during a failover.
_TRANSIENT: tuple[type[BaseException], ...] = (
    TimeoutError,
    asyncpg.InsufficientResourcesError,
    asyncpg.OperatorInterventionError,
    asyncpg.TransactionRollbackError,
    asyncpg.ReadOnlySQLTransactionError,
)


def is_transient(e: BaseException) -> bool:
    """Whether the same statement may well succeed later (the database is away or busy), so it is worth retrying."""
    return is_dropped(e) or isinstance(e, _TRANSIENT)


async def retry_dropped(
    op: Callable[[], Awaitable[T]],
    what: str = "database call",
    *,
    pool: Pool | None = None,
    again: Callable[[], Awaitable[T]] | None = None,
) -> T:
    """Run `op`; if its connection was dropped, run it (or `again`) on a fresh pooled connection, up to
    three more times with short pauses (a failover or restart takes a moment), then give up.

    With `pool`, its idle connections are expired first: after a failover or pg_terminate_backend they
    are all dead, and the retry must not pick the next dead one. `again` is the idempotent form of an
    INSERT for when an earlier attempt may have committed before its answer was lost.
    """
    try:
        return await op()
    except Exception as e:
        if not is_dropped(e):
            raise
        error: Exception = e
    for delay in DROP_RETRY_DELAYS:
        log.warning("%s lost its database connection (%s); retrying", what, type(error).__name__)
        if delay:
            await asyncio.sleep(delay)
        if pool is not None:
            await pool.expire_connections()
        try:
            return await (again or op)()
        except Exception as e:
            if not is_dropped(e):
                raise
            error = e
    raise error


class BotConnection(asyncpg.Connection):
    """A pooled connection that knows whether SQL we did not write (admin SQL, capability queries) ran on it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """A fresh connection has no session state."""
        super().__init__(*args, **kwargs)
        self.needs_reset = False
        self.discard = False

    def mark_untrusted(self, discard: bool) -> None:
        """Foreign SQL runs here: reset the whole session (or close the connection) before it is reused."""
        self.needs_reset = True
        self.discard = self.discard or discard


def untrusted_sql_connection(conn: Any, *, discard: bool = False) -> None:
    """Mark a pooled connection (proxy or raw) that is about to run SQL the bot did not write.

    With `discard` it is closed on release instead of reset (arbitrary admin SQL may even DEALLOCATE the
    statements asyncpg has cached on it); the pool opens a fresh one when needed."""
    conn.mark_untrusted(discard)  # a PoolConnectionProxy forwards the call to its BotConnection


def json_for_pg(value: Any) -> str:
    """JSON text PostgreSQL takes: a U+0000 or a lone surrogate anywhere in `value` (say, a platform payload) is
    cleaned away instead of failing the statement (checked on the dumped text: the common case costs one scan)."""
    text = json.dumps(value, ensure_ascii=False)
    if "\\u0000" in text or not _utf8_ok(text):
        text = json.dumps(clean_json(value), ensure_ascii=False)
    return text


def _utf8_ok(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


async def create_pool(dsn: str, *, min_size: int = POOL_MIN_SIZE, max_size: int = POOL_MAX_SIZE) -> Pool:
    """Create the asyncpg pool with JSON codecs for json/jsonb."""

    async def init(conn: asyncpg.Connection) -> None:

        for typ in ("json", "jsonb"):
            await conn.set_type_codec(typ, encoder=json_for_pg, decoder=json.loads, schema="pg_catalog")

    async def reset(conn: asyncpg.Connection) -> None:
        # asyncpg's default reset (advisory unlock, CLOSE ALL, UNLISTEN *, RESET ALL) plus what it misses:
        # admin SQL may have run SET ROLE / SET SESSION AUTHORIZATION or created temp tables here.
        if isinstance(conn, BotConnection) and conn.discard:
            await conn.close(timeout=DISCARD_CLOSE_TIMEOUT_S)  # the pool's next acquire of this slot connects afresh
        elif isinstance(conn, BotConnection) and conn.needs_reset:
            await conn.execute(_RESET_EXTRA + conn.get_reset_query())
            conn.needs_reset = False

    # On release asyncpg always rolls back an open transaction; the full session reset (one round trip) runs
    # only where SQL we did not write ran (marked with untrusted_sql_connection): our own statements leave no
    # session state (SET LOCAL only, advisory locks unlocked in `finally`), so no SET, SET ROLE, search_path,
    # advisory lock or LISTEN passes from one user's turn to the next; tests/test_security.py pins it.
    pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=init, reset=reset, connection_class=BotConnection
    )
    assert pool is not None
    return pool


async def connect_like(pool: Pool) -> asyncpg.Connection:
    """A connection outside the pool to the pool's server, with its connect arguments (for LISTEN: the pool's
    reset would UNLISTEN a pooled connection on release)."""
    # asyncpg keeps what create_pool was given here; there is no public accessor for it
    kept: Any = pool
    args, kwargs = kept._connect_args, kept._connect_kwargs
    conn: asyncpg.Connection = await asyncpg.connect(*args, **{"timeout": CONNECT_TIMEOUT_S, **kwargs})
    return conn


DEFAULT_PORT = 5432


def dsn_target(dsn: str) -> str:
    """Where a PostgreSQL URL points (`host:port`, hosts, or socket directory), without user or password."""
    parts = urlsplit(dsn)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        return parse_qs(parts.query).get("host", ["the default local server"])[0]
    if "," not in hosts and ":" not in hosts.rpartition("]")[2]:
        hosts += f":{DEFAULT_PORT}"
    return hosts


def dsn_problem(dsn: str) -> str | None:
    """What is wrong with the shape of a PostgreSQL URL (scheme, port), or None."""
    try:
        parts = urlsplit(dsn)
    except ValueError as e:  # e.g. an unclosed `[` around an IPv6 host
        return f"is not a valid URL ({e})"
    if parts.scheme not in ("postgresql", "postgres"):
        shown = f"'{parts.scheme}://'" if parts.scheme else "no scheme"
        return f"must start with postgresql:// or postgres:// (got {shown})"
    for host in parts.netloc.rpartition("@")[2].split(","):
        _, colon, port = host.rpartition("]")[2].partition(":")
        if colon and port and not (port.isdigit() and 1 <= int(port) <= 65535):
            return f"port {port} is not a valid port number (1-65535)"
    return None


def connect_failure(dsn: str, e: BaseException, timeout: float) -> StartupError:
    """One line naming DATABASE_URL and why connecting failed, with the URL's password removed."""
    target = dsn_target(dsn)
    code = EXIT_UNREACHABLE
    if isinstance(e, socket.gaierror):
        why = f"cannot resolve the host of {target} ({e.strerror})"
    elif isinstance(e, TimeoutError):
        why = f"cannot connect to {target} (no answer within {timeout:g} s)"
    elif isinstance(e, ConnectionRefusedError):
        why = f"cannot connect to {target} (connection refused)"
    elif isinstance(e, OSError):
        why = f"cannot connect to {target} ({e.strerror or e})"
    elif isinstance(e, asyncpg.InvalidCatalogNameError):
        why, code = f"{e} on {target}", EXIT_CONFIG
    elif isinstance(e, asyncpg.CannotConnectNowError | asyncpg.TooManyConnectionsError):
        why = f"{target} cannot take connections now ({e})"
    elif isinstance(e, asyncpg.PostgresError):
        why, code = f"{target} refused the login ({e})", EXIT_CONFIG
    elif isinstance(e, ValueError):  # asyncpg's ClientConfigurationError: the URL itself is malformed
        why, code = f"is not a valid URL ({e})", EXIT_CONFIG
    else:
        why = f"cannot connect to {target} ({type(e).__name__}: {e})"
    password = urlsplit(dsn).password or ""
    line = " ".join(f"DATABASE_URL: {why}".split())
    for secret in (password, unquote(password)):
        if len(secret) >= 3:
            line = line.replace(secret, "***")
    return StartupError(line, exit_code=code)


async def check_database(dsn: str, *, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Connect once before building the pool: a bad DATABASE_URL becomes one StartupError line."""
    problem = dsn_problem(dsn)
    if problem is not None:
        raise StartupError(f"DATABASE_URL: {problem}")
    try:
        conn = await asyncpg.connect(dsn, timeout=timeout)
    except Exception as e:
        raise connect_failure(dsn, e, timeout) from None
    await conn.close()
