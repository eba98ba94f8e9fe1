"""Slack's fixed numbers for rendering: the size of one message's mrkdwn text."""

from __future__ import annotations

# One message part's mrkdwn text, counted as its raw characters (entities such as `&amp;` count in full, a character
# outside the BMP counts 2, as UTF-16 counts). 3,000 is the most a section block's mrkdwn text object takes (Block Kit:
# "Maximum length for the text in this field is 3000 characters"; a longer one is refused with invalid_blocks), so
# a part fits a section block as well as a message's top-level `text` (truncated only after 40,000 characters, see
# api.slack.com/changelog/2018-04-truncating-really-long-messages, and kept under the ~4,000 beyond which Slack may
# break a message into several by itself).
SLACK_TEXT_LIMIT = 3000
SLACK_MIN_LIMIT = 16  # split() needs room for a code block closed and reopened around at least one character

# the adapter's own numbers
SLACK_UPLOAD_BYTES = 1_000_000_000  # files.upload v2 takes files up to 1 GB
SLACK_BUTTON_LABEL = 75  # a button's text at most
SLACK_MAX_DOWNLOAD_BYTES = 50_000_000  # a file people share that the bot fetches, at most
SLACK_DOWNLOAD_TIMEOUT_S = 60.0  # fetching one shared file
SLACK_RATE_BUDGET_S = 30.0  # how long one Web API call waits out Retry-After in all before the caller retries later
SLACK_RETRY_AFTER_DEFAULT_S = 1.0  # a 429 without Retry-After
SLACK_CONNECT_TIMEOUT_S = 30.0  # opening Socket Mode's websocket at start
SLACK_CUT_NOTE_S = 2.0  # sending the "cut short" note at a stop
SLACK_THREADS_KEPT = 4096  # threads the bot knows it is part of, kept in memory (else asked of conversations.replies)
SLACK_NAMES_KEPT = 4096  # people's names and time zones kept in memory
SLACK_HOME_BLOCKS = 50  # Slack's limit of blocks in a view (the header takes one)
