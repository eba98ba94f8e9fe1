"""The chat platforms a start can run, declared once: each one's name, whether the settings turn it on, and its adapter
(imported only when it runs, so a start without it never loads its library)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core import Core, Settings

if TYPE_CHECKING:
    from adapters.base import Adapter


@dataclass(frozen=True)
class Platform:
    """One chat platform: `on` says whether the settings turn it on, `make` builds its adapter."""

    name: str
    on: Callable[[Settings], bool]
    make: Callable[[Core, Settings], Adapter]


def _telegram(core: Core, settings: Settings) -> Adapter:
    from adapters.telegram import TelegramAdapter

    return TelegramAdapter(core, settings)


def _discord(core: Core, settings: Settings) -> Adapter:
    from adapters.discord import DiscordAdapter

    return DiscordAdapter(core, settings)


def _slack(core: Core, settings: Settings) -> Adapter:
    from adapters.slack import SlackAdapter

    return SlackAdapter(core, settings)


def _matrix(core: Core, settings: Settings) -> Adapter:
    from adapters.matrix import MatrixAdapter

    return MatrixAdapter(core, settings)


PLATFORMS = (
    Platform("telegram", lambda s: s.TELEGRAM_BOT_TOKEN is not None, _telegram),
    Platform("discord", lambda s: s.DISCORD_BOT_TOKEN is not None, _discord),
    Platform("slack", lambda s: s.SLACK_BOT_TOKEN is not None, _slack),
    Platform("matrix", lambda s: s.MATRIX_ACCESS_TOKEN is not None or s.MATRIX_PASSWORD is not None, _matrix),
)


def configured(settings: Settings) -> list[Platform]:
    """The platforms this start runs (none: the terminal chat, or `bot serve`)."""
    return [p for p in PLATFORMS if p.on(settings)]
