"""Discord adapter: discord.py in front of the core; Markdown rendering and the HTTP client settings."""

from adapters.discord.adapter import DiscordAdapter

__all__ = ["DiscordAdapter"]
