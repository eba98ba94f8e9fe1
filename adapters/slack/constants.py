"""The Slack adapter's own numbers (the text limit is in limits.py, with the renderer)."""

SLACK_UPLOAD_BYTES = 1_000_000_000  # files.upload v2 takes files up to 1 GB
SLACK_SECTION_CHARS = 3000  # a section block's text at most (a longer part goes into several sections)
SLACK_BUTTON_LABEL = 75  # a button's text at most
SLACK_MAX_DOWNLOAD_BYTES = 50_000_000  # a file people share that the bot fetches, at most
SLACK_DOWNLOAD_TIMEOUT_S = 60.0  # fetching one shared file
SLACK_RATE_BUDGET_S = 30.0  # how long one Web API call waits out Retry-After in all before the caller retries later
SLACK_RETRY_AFTER_DEFAULT_S = 1.0  # a 429 without Retry-After
SLACK_CONNECT_TIMEOUT_S = 30.0  # opening Socket Mode's websocket at start
SLACK_CUT_NOTE_S = 2.0  # sending the "cut short" note at a stop
SLACK_THREADS_KEPT = 4096  # threads the bot knows it is part of, kept in memory (else asked of conversations.replies)
SLACK_NAMES_KEPT = 4096  # people's names and time zones kept in memory
COMMAND = "/assistant"  # the one slash command: `/assistant <command> <options>`
