"""Slack adapter: slack_sdk (async) in front of the core (adapter.py), split by job: incoming, reply, send, buttons,
commands, files, render. `config_problem` checks the settings without loading slack_sdk (bot/ runs it before
starting anything); SlackAdapter is imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adapters.slack.config import config_problem

if TYPE_CHECKING:
    from adapters.slack.adapter import SlackAdapter

__all__ = ["SlackAdapter", "config_problem"]


def __getattr__(name: str) -> Any:
    """SlackAdapter, imported with slack_sdk only when asked for (a module __getattr__, PEP 562)."""
    if name == "SlackAdapter":
        from adapters.slack.adapter import SlackAdapter

        return SlackAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
