"""Files people send on Discord: which attachments of a message the core takes in (`files_of`: voice messages, audio,
photos and documents; a GIF is said in words, never fetched), kept in the inbox by reference only (`StoredFile`:
its id, name, size, type and URL, never its bytes), and fetched when the stored message is answered (`fetch`,
through discord.py's `Attachment.read()`, at most DISCORD_MAX_DOWNLOAD_BYTES)."""

from __future__ import annotations

import asyncio
import mimetypes
from dataclasses import asdict, dataclass, replace
from typing import Any

import aiohttp
import discord

from adapters.discord.limits import (
    DISCORD_DOWNLOAD_TIMEOUT_S,
    DISCORD_GIF_MIME,
    DISCORD_MAX_DOWNLOAD_BYTES,
    DISCORD_PHOTO_MIMES,
)
from core import Upload, UploadKind

GENERIC = "application/octet-stream"  # Discord's type for a file it does not recognise


@dataclass(frozen=True)
class StoredFile:
    """An attachment the core takes in, as the inbox keeps it (enough for any process to download it)."""

    id: str
    kind: UploadKind  # voice (a voice message), audio, photo or document
    name: str  # its file name (a photo's: the message's text when it has one)
    size: int  # bytes, as Discord says
    url: str
    mime: str | None = None  # the content type without its parameters
    duration_s: float | None = None  # a voice message's

    @property
    def ref(self) -> str:
        """The platform reference kept for the file: its CDN URL without the signature that expires."""
        return self.url.partition("?")[0]

    def to_json(self) -> dict[str, Any]:
        """The JSON kept in the inbox."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StoredFile:
        """A stored file back from the inbox's JSON."""
        return cls(**data)


def files_of(message: discord.Message, caption: str = "") -> tuple[StoredFile, ...]:
    """The attachments of a message the core takes in: audio (a voice message's is "voice"), a JPEG, PNG or WebP image
    as a photo (named by `caption`, the message's text, else its file name), and any other file but an image (by its
    type, or its name when Discord gives none) as a document (the core says which it cannot read). A GIF is not
    fetched: gif_names() says it in words."""
    out = []
    for a in message.attachments:
        mime = _mime(a)
        name = a.filename
        kind: UploadKind = "document"
        if mime in DISCORD_PHOTO_MIMES:
            kind, name = "photo", caption or a.filename
        elif mime is not None and mime.startswith("image/"):
            continue
        elif mime is not None and mime.startswith("audio/"):
            kind = "voice" if message.flags.voice or a.is_voice_message() else "audio"
        out.append(StoredFile(str(a.id), kind, name, a.size, a.url, mime, a.duration))
    return tuple(out)


def gif_names(message: discord.Message) -> list[str]:
    """The file names of a message's GIF attachments (by their type, or their name when Discord gives none)."""
    return [a.filename for a in message.attachments if _mime(a) == DISCORD_GIF_MIME]


async def fetch(client: discord.Client, file: StoredFile) -> Upload:
    """A stored file as the core takes it: its bytes, or one line saying why they could not be had (one over
    DISCORD_MAX_DOWNLOAD_BYTES is not downloaded at all)."""
    base = reference(file)
    if file.size > DISCORD_MAX_DOWNLOAD_BYTES:
        return replace(base, refused=_too_big(file.size))
    payload: Any = {"id": file.id, "filename": file.name, "size": file.size, "url": file.url, "proxy_url": file.url}
    # discord.py's own Attachment (its state only lends it the client's HTTP session, as the message's would)
    attachment = discord.Attachment(data=payload, state=client._connection)
    try:
        async with asyncio.timeout(DISCORD_DOWNLOAD_TIMEOUT_S):
            data = await attachment.read()
    except TimeoutError:
        return replace(base, refused="could not download the file from Discord (it took too long)")
    except discord.NotFound:
        return replace(base, refused="the file is gone from Discord (was its message deleted?)")
    except discord.HTTPException as e:
        return replace(base, refused=f"could not download the file from Discord (HTTP {e.status})")
    except (aiohttp.ClientError, OSError):  # the connection failed
        return replace(base, refused="could not download the file from Discord (no connection)")
    if len(data) > DISCORD_MAX_DOWNLOAD_BYTES:
        return replace(base, refused=_too_big(len(data)))
    return replace(base, data=data)


def lazy(client: discord.Client, file: StoredFile) -> Upload:
    """A stored file as the core takes it, downloaded (see fetch) only when the core loads it."""
    return replace(reference(file), load=lambda: fetch(client, file))


def reference(file: StoredFile) -> Upload:
    """A stored file as the core knows it before its bytes: its kind, name, type and Discord's reference."""
    return Upload(file.kind, file.name, file.mime, None, platform_ref=file.ref, duration_s=file.duration_s)


def _mime(attachment: discord.Attachment) -> str | None:
    """An attachment's type without its parameters ("; charset=utf-8"): Discord's, else (none, or the generic
    application/octet-stream) guessed from its name."""
    given = (attachment.content_type or "").partition(";")[0].strip().lower()
    if given in ("", GENERIC):
        return mimetypes.guess_type(attachment.filename)[0] or given or None
    return given


def _too_big(size: int) -> str:
    """The line for a file over the limit."""
    return f"the file is too big ({_mb(size)}; at most {_mb(DISCORD_MAX_DOWNLOAD_BYTES)} can be fetched)"


def _mb(size: int) -> str:
    """A size in MB (of 2^20 bytes, as Discord counts its limits)."""
    return f"{size / (1 << 20):.1f} MB".replace(".0 MB", " MB")
