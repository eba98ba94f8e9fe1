"""Telegram adapter: python-telegram-bot in front of the core. `config_problem` checks the settings without loading
python-telegram-bot (bot/ runs it before starting anything); TelegramAdapter is imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adapters.telegram.config import config_problem

if TYPE_CHECKING:
    from adapters.telegram.adapter import TelegramAdapter

__all__ = ["TelegramAdapter", "config_problem"]


def __getattr__(name: str) -> Any:
    """TelegramAdapter, imported with python-telegram-bot only when asked for (a module __getattr__, PEP 562)."""
    if name == "TelegramAdapter":
        from adapters.telegram.adapter import TelegramAdapter

        return TelegramAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
