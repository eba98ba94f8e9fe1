"""Files people send on Telegram: what a message carries (`media_of`, a neutral `Media`) and its bytes (`download`),
fetched from the same Bot API server as every other call, or read from the disk of a local Bot API server run with
--local (its getFile gives an absolute path there, which python-telegram-bot reads directly)."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from telegram import Animation, Audio, Bot, File, Message, PhotoSize, Sticker, VideoNote, Voice
from telegram.error import BadRequest, InvalidToken, NetworkError, TelegramError, TimedOut
from telegram.warnings import PTBDeprecationWarning

from adapters.telegram.limits import TELEGRAM_MAX_DOWNLOAD_BYTES, TELEGRAM_PHOTO_MIMES
from adapters.telegram.request import one_line

MediaKind = Literal["voice", "audio", "photo", "document", "sticker", "animation", "video_note"]


@dataclass(frozen=True)
class Media:
    """What a message carries besides its text, as the core needs it (nothing of Telegram's types in it)."""

    kind: MediaKind
    file_id: str  # what download() fetches
    file_name: str | None = None
    mime_type: str | None = None
    file_size: int | None = None  # bytes, when Telegram says
    duration: int | None = None  # seconds: voice, audio, animation, video_note
    caption: str | None = None
    emoji: str | None = None  # a sticker's


class FileRefused(Exception):
    """A file the bot does not get: too big, refused by Telegram, or its download failed (one line, no token or URL)."""


def media_of(message: Message, *, max_bytes: int = TELEGRAM_MAX_DOWNLOAD_BYTES) -> Media | None:
    """The media a message carries, or None (text only, or a kind not handled such as a video); of a photo, the
    largest size that can be downloaded within max_bytes. A JPEG, PNG or WebP image sent as a file is a photo too."""
    caption = message.caption or None
    if message.voice is not None:
        voice = message.voice
        mime = voice.mime_type or "audio/ogg"  # a voice note is OGG/Opus
        return Media("voice", voice.file_id, None, mime, voice.file_size, _seconds(voice), caption)
    if message.audio is not None:
        song = message.audio
        return Media("audio", song.file_id, song.file_name, song.mime_type, song.file_size, _seconds(song), caption)
    if message.photo:
        size = _photo_size(message.photo, max_bytes)
        return Media("photo", size.file_id, None, "image/jpeg", size.file_size, caption=caption)  # Telegram's are JPEG
    if message.sticker is not None:
        sticker = message.sticker
        return Media("sticker", sticker.file_id, None, _sticker_type(sticker), sticker.file_size, emoji=sticker.emoji)
    if message.animation is not None:  # before document: Telegram sends an animation as a document too
        gif = message.animation
        return Media("animation", gif.file_id, gif.file_name, gif.mime_type, gif.file_size, _seconds(gif), caption)
    if message.video_note is not None:
        note = message.video_note
        return Media("video_note", note.file_id, None, "video/mp4", note.file_size, _seconds(note))
    if message.document is not None:
        doc = message.document
        kind: MediaKind = "photo" if (doc.mime_type or "").lower() in TELEGRAM_PHOTO_MIMES else "document"  # "as file"
        return Media(kind, doc.file_id, doc.file_name, doc.mime_type, doc.file_size, caption=caption)
    return None


async def download(bot: Bot, file_id: str, *, max_bytes: int, size: int | None = None) -> bytes:
    """The bytes of a file someone sent: getFile, then its download from the bot's base_file_url (the Bot API server
    of every other call) or, from a local server run with --local, its file on this machine's disk. FileRefused (one
    line) before any download when its size (`size` from the message, or getFile's) is over max_bytes, when Telegram
    refuses it, and when the download fails."""
    if size is not None and size > max_bytes:
        raise FileRefused(_too_big(size, max_bytes))
    try:
        file = await bot.get_file(file_id)
    except TelegramError as e:
        raise FileRefused(_not_given(e)) from None
    if file.file_size is not None and file.file_size > max_bytes:
        raise FileRefused(_too_big(file.file_size, max_bytes))
    # the server's file_path: PTB put base_file_url before it, unless it names a file on this machine
    path = (file.file_path or "").removeprefix(f"{bot.base_file_url}/")
    if not path:
        raise FileRefused("Telegram gave no path to download the file from")
    data: bytes | None = None
    if os.path.isabs(path):  # a local Bot API server's (--local) file on its disk
        data = await asyncio.to_thread(_read_local, path, max_bytes)
    if data is None:
        data = await _fetch(bot, file, path)
    if len(data) > max_bytes:
        raise FileRefused(_too_big(len(data), max_bytes))
    return data


async def _fetch(bot: Bot, file: File, path: str) -> bytes:
    """Download the server's file_path from base_file_url/<file_path> (built here, so a same-named file in this
    process's working directory is never read instead, as PTB would)."""
    remote = File(file.file_id, file.file_unique_id, file.file_size, f"{bot.base_file_url}/{path}")
    remote.set_bot(bot)
    try:
        return bytes(await remote.download_as_bytearray())
    except TimedOut:
        reason = "it took too long"
    except BadRequest as e:  # (a NetworkError in PTB)
        reason = one_line(e)
    except NetworkError:
        reason = "Telegram could not be reached"
    except InvalidToken:  # a 404 (or 401)
        disk = "the local Bot API server keeps it on a disk this machine cannot read"
        reason = disk if os.path.isabs(path) else "the Bot API server has no such file"
    except TelegramError as e:
        reason = one_line(e)
    raise FileRefused(f"could not download the file from Telegram ({reason})")


def _read_local(path: str, max_bytes: int) -> bytes | None:
    """A local Bot API server's file (in a worker thread): None when this machine has no such file (the server runs
    elsewhere: maybe a web server in front of it serves its files, as PTB then expects)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise FileRefused(_too_big(size, max_bytes))
            return f.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise FileRefused(f"could not read the file the local Bot API server saved ({e.strerror})") from None


def _not_given(e: TelegramError) -> str:
    """The line for a getFile Telegram refused or that failed."""
    if isinstance(e, BadRequest):  # (a NetworkError in PTB)
        if "too big" in e.message.lower():
            limit = _mb(TELEGRAM_MAX_DOWNLOAD_BYTES)
            return f"the file is too big: Telegram lets a bot download files of at most {limit}"
        return f"Telegram would not give the file ({one_line(e)})"
    if isinstance(e, TimedOut):
        return "Telegram took too long to find the file"
    if isinstance(e, NetworkError):
        return "Telegram could not be reached to find the file"
    return f"Telegram would not give the file ({one_line(e)})"


def _too_big(size: int, limit: int) -> str:
    """The line for a file over the limit."""
    return f"the file is too big ({_mb(size)}; at most {_mb(limit)} can be fetched)"


def _mb(size: int) -> str:
    """A size in MB as Telegram counts them (its 20 MB download limit is 20 × 2^20 bytes)."""
    return f"{size / (1 << 20):.1f} MB".replace(".0 MB", " MB")


def _seconds(media: Voice | Audio | Animation | VideoNote) -> int:
    """A media's duration in whole seconds (PTB 22 gives an int with a warning, or a timedelta with PTB_TIMEDELTA)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = media.duration
    return int(value.total_seconds()) if isinstance(value, timedelta) else int(value)


def _photo_size(sizes: Sequence[PhotoSize], max_bytes: int) -> PhotoSize:
    """The largest size within max_bytes (an unknown size counts as within); the smallest when none is."""
    within = [s for s in sizes if s.file_size is None or s.file_size <= max_bytes]
    if not within:
        return min(sizes, key=lambda s: (s.width * s.height, s.file_size or 0))
    return max(within, key=lambda s: (s.width * s.height, s.file_size or 0))


def _sticker_type(sticker: Sticker) -> str:
    """A sticker's MIME type: animated (Lottie in TGS), video (WebM) or a WebP image."""
    if sticker.is_animated:
        return "application/x-tgsticker"
    return "video/webm" if sticker.is_video else "image/webp"
