"""Telegram adapter: python-telegram-bot in front of the core; HTML rendering and the HTTP request layer."""

from adapters.telegram.adapter import TelegramAdapter

__all__ = ["TelegramAdapter"]
