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
