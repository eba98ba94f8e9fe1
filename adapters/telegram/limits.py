"""Telegram's fixed numbers: message sizes, preview pacing, polling and the Bot API connection pool."""

from __future__ import annotations

from telegram.constants import FileSizeLimit, MessageLimit

from adapters.base import Limits

TELEGRAM_MESSAGE_LIMIT = int(MessageLimit.MAX_TEXT_LENGTH)  # 4096, in UTF-16 code units of the text after tags
TELEGRAM_UPLOAD_LIMIT = int(FileSizeLimit.FILESIZE_UPLOAD)  # 50 MB: the largest file a bot may send
# the largest file a bot may download from api.telegram.org: the Bot API server's MAX_DOWNLOAD_FILE_SIZE (20 MiB; PTB's
# FileSizeLimit.FILESIZE_DOWNLOAD says 20e6); a local Bot API server run with --local has no such limit
TELEGRAM_MAX_DOWNLOAD_BYTES = 20 << 20
# a file sent "as a file" of these types is taken as a photo (others stay documents: the core says what it cannot read)
TELEGRAM_PHOTO_MIMES = frozenset({"image/jpeg", "image/png", "image/webp"})
TELEGRAM_UPLOAD_TIMEOUT_S = 120.0  # sending a file (an export) may take this long before it counts as failed
TELEGRAM_BUTTON_LABEL = 64  # an "Allow" button's label at most (a long tool name is cut)
TELEGRAM_ACTIVITY_CHARS = 1500  # the activity block is capped so the answer keeps most of the last part
TELEGRAM_DRAFT_CHARS = 4000  # a streamed draft shows at most the last this many characters
TELEGRAM_TYPING_EVERY_S = 4.0  # Telegram shows "typing…" for about 5 s
TELEGRAM_TYPING_AFTER_S = 0.3  # an answer faster than this needs no "typing…" (saves a Bot API call per quick turn)
TELEGRAM_DRAFT_EVERY_S = 0.6  # at most this often a streamed draft is updated
TELEGRAM_PREVIEW_TIMEOUT_S = 2.0  # a typing action or draft that takes longer is not worth waiting for
TELEGRAM_POLL_TIMEOUT_S = 30  # long polling: getUpdates waits up to this long for an update
TELEGRAM_REQUEST_TIMEOUT_S = 5.0  # read and connect timeout of a Bot API call (a poll gets its own wait on top)
TELEGRAM_POLL_RETRY_MAX_S = 30.0  # a failing getUpdates is retried at once, then after 1, 2, 4… s up to this
TELEGRAM_POLL_READ_MARGIN_S = 10.0  # a poll's read timeout is its long-poll wait plus this
TELEGRAM_CONNECTIONS = 64  # the Bot API connection pool
# the fleet sends at most this share of Telegram's 30 messages a second per bot, as a leaky bucket: 27 at once and
# 27 a second (PTB's AIORateLimiter: 30 and 30); the tenth left over lets sends reach Telegram up to 0.11 s closer
# together than they left (network, a busy event loop) without the bot going past 30 at once and 30 a second there
TELEGRAM_SEND_SHARE = 0.9
TELEGRAM_FLEET_REFRESH_S = 2.0  # each process re-reads how many processes share the bot's messages this often
TELEGRAM_FLEET_STALE_S = 20.0  # a fleet view older than this (database away) halves the process's share
TELEGRAM_LIMITS = Limits(TELEGRAM_MESSAGE_LIMIT, TELEGRAM_UPLOAD_LIMIT, TELEGRAM_BUTTON_LABEL)  # the Adapter protocol's
