"""Slack adapter: slack_sdk (async) in front of the core (adapter.py), split by job: socket (Socket Mode), events
(the HTTP Events API), incoming, reply, send, buttons, commands, files, render."""

from adapters.slack.adapter import SlackAdapter

__all__ = ["SlackAdapter"]
