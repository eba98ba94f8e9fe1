"""The async-context shape shared by the fake servers in tests/."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class LoopbackServer:
    """A fake server on 127.0.0.1: `async with Fake() as fake` starts it and stops it again."""

    async def start(self) -> None:
        """Start listening (subclasses)."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Stop listening (subclasses)."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        """Start the server."""
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the server."""
        await self.stop()
