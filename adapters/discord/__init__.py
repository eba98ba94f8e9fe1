"""Discord adapter: discord.py in front of the core (adapter.py), split by job: gateway, commands, buttons, send,
incoming, render, endpoints."""

from adapters.discord.adapter import DiscordAdapter

__all__ = ["DiscordAdapter"]
