"""Slack's sizes (placeholder: the renderer's branch brings the real file)."""

SLACK_TEXT_LIMIT = 3000  # a section block's text at most
