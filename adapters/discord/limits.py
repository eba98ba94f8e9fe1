"""Discord's fixed numbers: message sizes, typing pacing and gateway supervision."""

from __future__ import annotations

from discord.utils import DEFAULT_FILE_SIZE_LIMIT_BYTES

from adapters.base import Limits

DISCORD_MESSAGE_LIMIT = 2000  # Discord's content limit per message
DISCORD_UPLOAD_LIMIT = DEFAULT_FILE_SIZE_LIMIT_BYTES  # 10 MiB: the largest file a bot may send anywhere
DISCORD_BUTTON_LABEL = 80  # a button's label at most (a longer one is refused)
DISCORD_LONG_LINE = DISCORD_MESSAGE_LIMIT - 100  # longer lines are cut into pieces (room for a fence reopened)
DISCORD_TYPING_EVERY_S = 8.0  # Discord shows "typing…" for about 10 s
DISCORD_READY_TIMEOUT_S = 60.0  # start-up gives up on a gateway that does not say READY within this
DISCORD_CUT_NOTE_S = 3.0  # at most this long to tell a user their answer was cut by a shutdown
DISCORD_RETRY_FIRST_S = 2.0  # first pause before a new client replaces a gateway connection that died
DISCORD_RETRY_MAX_S = 300.0  # the pause doubles up to this
DISCORD_IDENTIFY_SPACING_S = 5.0  # discord.py waits this long before each further shard of a process identifies
DISCORD_MAX_DOWNLOAD_BYTES = 20 << 20  # 20 MB: the largest attachment the bot downloads for the core (bigger: one line)
DISCORD_PHOTO_MIMES = frozenset({"image/jpeg", "image/png", "image/webp"})  # image attachments taken as photos
DISCORD_GIF_MIME = "image/gif"  # a GIF attachment is described in words (its file name), never downloaded
DISCORD_DOWNLOAD_TIMEOUT_S = 60.0  # an attachment's download gives up after this
DISCORD_LIMITS = Limits(DISCORD_MESSAGE_LIMIT, DISCORD_UPLOAD_LIMIT, DISCORD_BUTTON_LABEL)  # the Adapter protocol's
