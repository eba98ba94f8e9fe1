"""The Slack settings checked before anything starts (no slack_sdk import): the tokens' shapes, and a way to hear
Slack (Socket Mode's app token or the Events API's signing secret)."""

from __future__ import annotations

from core import Settings

SHAPES = (("SLACK_BOT_TOKEN", "xoxb-", "the Bot User OAuth Token"), ("SLACK_APP_TOKEN", "xapp-", "an app-level token"))


def config_problem(settings: Settings) -> str | None:
    """One line naming what is wrong with the Slack settings, or None (also when Slack is off)."""
    for name, prefix, what in SHAPES:
        token = getattr(settings, name)
        if token is not None and not token.get_secret_value().strip().startswith(prefix):
            return f"{name}: does not look like {what} (expected {prefix}…, as the Slack app's settings show it)"
    if settings.SLACK_BOT_TOKEN is None:
        return None
    if settings.SLACK_APP_TOKEN is None and settings.SLACK_SIGNING_SECRET is None:
        return (
            "SLACK_BOT_TOKEN needs SLACK_APP_TOKEN (Socket Mode, no public URL) or SLACK_SIGNING_SECRET (the Events "
            "API on PORT)"
        )
    return None
