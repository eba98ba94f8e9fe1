"""The start/stop shared by the fake servers in tests/: an aiohttp app on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Self

from aiohttp import web


class LoopbackServer:
    """A fake server on 127.0.0.1: `async with Fake() as fake` starts it and stops it again.

    Subclasses route requests on `self._app`; `start()` binds an ephemeral port, `stop()` shuts the server down.
    They call `_notify()` on every change a test may wait for with `wait_for()`.
    """

    # handler_cancellation: a request the client gave up on (e.g. a long poll) ends with its connection
    handler_cancellation = False

    def __init__(self) -> None:
        """An app with no routes yet, not listening."""
        self._app = web.Application()
        self._port: int | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._wakeup = asyncio.Event()

    async def start(self) -> None:
        """Bind 127.0.0.1 on an ephemeral port."""
        await self._listen(0)

    async def stop(self) -> None:
        """Shut the server down."""
        runner, self._runner, self._site = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    async def _listen(self, port: int) -> None:
        """Bind 127.0.0.1:port (0: an ephemeral one) and remember the port."""
        runner = web.AppRunner(
            self._app, access_log=None, shutdown_timeout=0.5, handler_cancellation=self.handler_cancellation
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site
        self._port = int(runner.addresses[0][1])

    @property
    def origin(self) -> str:
        """http://127.0.0.1:PORT, once started."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return f"http://127.0.0.1:{self._port}"

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0, *, what: str = "condition") -> None:
        """Wait until predicate() holds, re-checking it whenever the server notifies a change (the default timeout
        leaves room for a machine whose cores are busy)."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    await self._wakeup.wait()
        except TimeoutError:
            raise TimeoutError(f"{what} not met within {timeout}s; {self._recent()}") from None

    def _notify(self) -> None:
        """Wake everything waiting for a change."""
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    def _recent(self) -> str:
        """What the server saw last, for timeout messages (subclasses)."""
        return "no history kept"

    async def __aenter__(self) -> Self:
        """Start the server."""
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the server."""
        await self.stop()
