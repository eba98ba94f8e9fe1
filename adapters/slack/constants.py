"""The Slack adapter's names (its numbers are in limits.py)."""

COMMAND = "/assistant"  # the one slash command: `/assistant <command> <options>`
