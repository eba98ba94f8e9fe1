"""What a platform front end is: the `Adapter` protocol every platform adapter satisfies (Telegram, Discord), and the
`Limits` it keeps. Each message it answers goes to `Core.answer` with a reply port of its own (the core's `Reply`,
in the adapter's reply.py). The shared behaviour tests every adapter passes against its own fake are in
tests/adapter_kit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core import Outbox


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
