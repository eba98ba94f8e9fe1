"""Notifications from other processes: LISTEN on a dedicated connection, a callback per notification."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from core.constants import CONNECT_TIMEOUT_S, LISTEN_CHECK_S, LISTEN_RETRY_S

log = logging.getLogger(__name__)

_LOST = object()  # queued when the listening connection closes

Connect = Callable[[], Awaitable[asyncpg.Connection]]
Refresh = Callable[[str | None], Awaitable[object]]


class ChangeListener:
    """Follows a channel on its own connection (a pooled one gets UNLISTEN on release) and reconnects when it drops."""

    def __init__(self, channel: str, connect: Connect, refresh: Refresh) -> None:
        """`refresh(payload)` is called per notification, and with None after each (re)connect: catch up on all."""
        self.channel, self._connect, self._refresh = channel, connect, refresh
        self.listening = asyncio.Event()  # set while LISTEN is active and the catch-up refresh is done
        self.connections = 0  # how many times LISTEN was established
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start following in the background (connecting, too, so a database that is down delays nothing)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"listener for {self.channel}")

    async def stop(self) -> None:
        """Stop following and close the connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.listening.clear()

    async def _run(self) -> None:
        """Follow; on any failure, log a warning, pause and connect again (never ends on its own)."""
        while True:
            try:
                await self._follow()
            except Exception as e:
                log.warning(
                    "the %s listener lost its connection (%s: %s); connecting again in %g s",
                    self.channel,
                    type(e).__name__,
                    e,
                    LISTEN_RETRY_S,
                )
            self.listening.clear()
            await asyncio.sleep(LISTEN_RETRY_S)

    async def _follow(self) -> None:
        """One connection's life: LISTEN, catch up on what was missed, then refresh per notification."""
        queue: asyncio.Queue[object] = asyncio.Queue()

        def notified(_conn: Any, _pid: int, _channel: str, payload: object) -> None:
            queue.put_nowait(payload)

        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            conn = await self._connect()
        try:
            conn.add_termination_listener(lambda _conn: queue.put_nowait(_LOST))
            await conn.add_listener(self.channel, notified)
            self.connections += 1
            await self._refresh(None)  # changes made before LISTEN (at start, or while the connection was down)
            self.listening.set()
            while True:
                try:  # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the cancel from stop()
                    async with asyncio.timeout(LISTEN_CHECK_S):
                        item = await queue.get()
                except TimeoutError:
                    await conn.fetchval("SELECT 1", timeout=CONNECT_TIMEOUT_S)  # a silently dead connection fails
                    continue
                if item is _LOST:
                    raise ConnectionError("the listening connection was closed")
                await self._refresh(str(item))
        finally:
            conn.terminate()
