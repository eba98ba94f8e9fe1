"""One turn at a time per chat: a lock per chat key, forgotten once no turn uses or waits for it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class _ChatLock:
    """A per-chat lock with a count of turns using or waiting for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class ChatSlots:
    """The chats' turn slots of this process."""

    def __init__(self) -> None:
        """No chat has a turn yet."""
        self._locks: dict[str, _ChatLock] = {}

    def turn(self, key: str) -> TurnSlot:
        """The one-at-a-time slot of the chat `key`."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _ChatLock()
        return TurnSlot(self._locks, key, entry)

    def __len__(self) -> int:
        """How many chats have a turn running or waiting."""
        return len(self._locks)


class TurnSlot:
    """Async context manager holding a chat's lock; forgets the lock when nobody uses it."""

    def __init__(self, locks: dict[str, _ChatLock], key: str, entry: _ChatLock) -> None:
        """Remember which lock to hold."""
        self.locks, self.key, self.entry = locks, key, entry

    async def __aenter__(self) -> None:
        """Wait for the chat's earlier turns."""
        self.entry.users += 1
        try:
            await self.entry.lock.acquire()
        except BaseException:
            self._release_user()
            raise

    async def __aexit__(self, *exc: object) -> None:
        """Let the chat's next turn run."""
        self.entry.lock.release()
        self._release_user()

    def _release_user(self) -> None:
        """Drop the lock entry when no turn uses or waits for it."""
        self.entry.users -= 1
        if self.entry.users == 0 and self.locks.get(self.key) is self.entry:
            del self.locks[self.key]
