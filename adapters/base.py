"""What a platform front end is: the `Adapter` protocol every platform adapter satisfies (Telegram, Discord, Slack),
the `Limits` it keeps, and `RunningAnswers`, the answers it lets finish at stop. Each message it answers goes to
`Core.answer` with a reply port of its own (the core's `Reply`, in the adapter's reply.py). The shared behaviour tests
every adapter passes against its own fake are in tests/adapter_kit."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from core import COMMANDS, Incoming, Outbox, Quoted

log = logging.getLogger(__name__)

_NAMES = sorted({name for c in COMMANDS for name in (c.name, *c.aliases)}, key=len, reverse=True)
_NAMED = re.compile(r"(?<![\w/<!])/(" + "|".join(_NAMES) + r")\b")  # a /command named in a text, not a path's part


def hashed_id(key: str) -> int:
    """An inbox update id for a platform whose message ids are not integers: 63 bits of a hash of `key`."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


def stored_incoming(fields: dict[str, Any]) -> Incoming:
    """An Incoming back from an inbox payload's JSON (its uploads are not stored: an adapter adds them again)."""
    attachments, quoted = tuple(fields["attachments"]), tuple(Quoted(**q) for q in fields["quoted"])
    return Incoming(**{**fields, "attachments": attachments, "quoted": quoted, "uploads": ()})


def renamed(text: str, typed: Callable[[str], str]) -> str:
    """The catalogue's `/tasks`, `/remind …` named in an answer as the platform has them typed (`typed`: a command's
    name → its form there, e.g. `/assistant tasks` on Slack, `!tasks` on Matrix)."""
    return _NAMED.sub(lambda m: typed(m.group(1)), text)


@dataclass(frozen=True)
class Limits:
    """The platform's fixed sizes that shape what the bot sends there (the numbers live in its limits.py)."""

    message_chars: int  # one message's text at most, counted as the platform counts it (Telegram: UTF-16 units)
    upload_bytes: int  # the largest file the bot may send
    button_label: int  # a button's label at most


class Adapter(Outbox, Protocol):
    """A platform front end, run by bot/ inside its event loop: it takes the platform's updates to the core and sends
    the answers, and delivers reminders into its chats (the core's Outbox: `send_reminder`)."""

    @property
    def platform(self) -> str:
        """The platform's name, as in identities (`telegram:123`) and reminders."""
        ...

    @property
    def limits(self) -> Limits:
        """The platform's limits this adapter keeps."""
        ...

    async def start(self) -> None:
        """Connect and start answering; a failure is a one-line StartupError after undoing what was started."""
        ...

    async def stop(self) -> None:
        """Stop taking updates, let running answers finish within the grace, then disconnect."""
        ...


class RunningAnswers:
    """The answers an adapter is running, as tasks: stop() lets them finish within the grace and cuts the rest (a cut
    one says so briefly, within `cut_note_s`)."""

    def __init__(self, platform: str, grace: float, cut_note_s: float) -> None:
        """None running yet; `platform` names them in the log line of a cut."""
        self.platform, self.grace, self.cut_note_s = platform, grace, cut_note_s
        self.stopping = False  # stop() began: new messages are turned away, running answers finish
        self.cutting = False  # stop() is cutting what outlasted the grace
        self.tasks: set[asyncio.Task[Any]] = set()

    def restart(self) -> None:
        """A new start: take messages again."""
        self.stopping = self.cutting = False

    def add(self, task: asyncio.Task[Any]) -> None:
        """Count `task` as running work until it ends."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @contextlib.contextmanager
    def tracked(self) -> Iterator[None]:
        """Count the current task as running work until the block ends (stop() waits for it)."""
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
        try:
            yield
        finally:
            if task is not None:
                self.tasks.discard(task)

    async def drain(self) -> None:
        """Wait for the running answers up to the grace time, then cancel the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        while self.tasks and (left := deadline - loop.time()) > 0:
            await asyncio.wait(set(self.tasks), timeout=left)
        late = set(self.tasks)
        if not late:
            return
        log.warning(
            "%d %s answer(s) still running after SHUTDOWN_GRACE_SECONDS=%g were cut",
            len(late),
            self.platform,
            self.grace,
        )
        self.cutting = True
        for task in late:
            task.cancel()
        await asyncio.wait(late, timeout=self.cut_note_s + 1.0)
