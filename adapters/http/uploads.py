"""Files sent through the HTTP API: a message's file parts (base64 in the JSON body) and the OpenAI-compatible content
parts (data: URLs, input_audio) become the core's Uploads, as Telegram's files do (audio → a transcript, a photo, a
document → its text)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import mimetypes
import re
from collections.abc import Sequence
from dataclasses import dataclass

from adapters.http.limits import HTTP_UPLOAD_MAX_BYTES, HTTP_UPLOAD_MAX_FILES, SCAN_STEP_BYTES
from adapters.http.models import SPACE, SPACE_CHARS, FilePartIn, TextPartIn
from core import Upload, UploadKind, strip_nul

VOICE_MIMES = frozenset({"audio/ogg", "audio/opus", "audio/webm"})  # what phones and browsers record voice notes as
BAD_BASE64 = "{where}: not valid base64."
EMPTY = "{where}: the file is empty."
TOO_MANY = f"At most {HTTP_UPLOAD_MAX_FILES} files in one message."
TOO_BIG = "The files hold {n:,} bytes; a message's files may hold {most:,} bytes in all."
NOTHING = "The message has neither text nor a file."
NOT_FETCHED = "Links are not fetched: send the file itself, as a data: URL (data:image/png;base64,…)."
NOT_BASE64_URL = "{where}: a data: URL must be base64-encoded (data:<type>;base64,<data>)."
_SPACE = re.compile(SPACE + "+")  # as the description's BASE64 pattern counts white space


class UploadRefused(Exception):
    """Files the API refuses: the HTTP status (400, or 413 for too many bytes) and one line saying why."""

    def __init__(self, status: int, message: str) -> None:
        """Remember what to answer."""
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Sent:
    """A file as the request carried it: where in the request (for errors), its name, media type and base64 data."""

    where: str
    name: str
    mime: str | None
    data: str


def kind_of(mime: str | None) -> UploadKind:
    """What the core makes of a file of this media type: audio (a voice note as phones record them), a photo, or
    else a document."""
    base = (mime or "").partition(";")[0].strip().lower()
    if base.startswith("audio/"):
        return "voice" if base in VOICE_MIMES else "audio"
    return "photo" if base.startswith("image/") else "document"


def _in_steps(data: str) -> bytes:
    """Strict base64 decoded SCAN_STEP_BYTES (a multiple of 4) at a time: each step is one short call that holds the
    GIL, so the event loop runs between them (one call for 20 MB would hold it for about 0.1 s)."""
    step = SCAN_STEP_BYTES
    return b"".join(base64.b64decode(data[i : i + step], validate=True) for i in range(0, len(data), step))


def decode(data: str, where: str) -> bytes:
    """A file's base64 data (lines wrapped as `base64` prints them are fine); 400 when it is not base64."""
    try:
        raw = _in_steps(data)
    except (binascii.Error, ValueError):
        try:
            step = SCAN_STEP_BYTES
            raw = _in_steps("".join(_SPACE.sub("", data[i : i + step]) for i in range(0, len(data), step)))
        except (binascii.Error, ValueError):
            raise UploadRefused(400, BAD_BASE64.format(where=where)) from None
    if not raw:
        raise UploadRefused(400, EMPTY.format(where=where))
    return raw


def data_url(url: str, where: str) -> tuple[str | None, str]:
    """The media type and base64 data of a `data:` URL (400 for any other URL: the bot fetches no links)."""
    if not url.startswith("data:"):
        raise UploadRefused(400, NOT_FETCHED)
    meta, comma, data = url[5:].partition(",")
    mime, *params = meta.split(";")
    if not comma or "base64" not in (p.strip(SPACE_CHARS).lower() for p in params):
        raise UploadRefused(400, NOT_BASE64_URL.format(where=where))
    return mime.strip() or None, data


def message_files(content: str | Sequence[TextPartIn | FilePartIn], field: str) -> tuple[str, list[Sent]]:
    """A message's text and files from its `content` (400 when it holds neither)."""
    if isinstance(content, str):
        return content, []
    text = "\n".join(p.text for p in content if isinstance(p, TextPartIn) and p.text)
    files = [
        Sent(f"{field}[{i}].data", p.name, p.mime, p.data) for i, p in enumerate(content) if isinstance(p, FilePartIn)
    ]
    if not text.strip() and not files:
        raise UploadRefused(400, NOTHING)
    return text, files


async def uploads_of(sent: Sequence[Sent], also_check: Sequence[Sent] = ()) -> tuple[Upload, ...]:
    """The core's uploads of the files sent, decoded off the event loop (400: too many files or bad base64; 413:
    more bytes than HTTP_UPLOAD_MAX_BYTES in all); `also_check`: files only checked to be base64 (a resent history)."""
    if len(sent) > HTTP_UPLOAD_MAX_FILES:
        raise UploadRefused(400, TOO_MANY)
    if not sent and not also_check:
        return ()

    def decoded() -> list[bytes]:
        for s in also_check:  # one at a time, let go at once
            decode(s.data, s.where)
        return [decode(s.data, s.where) for s in sent]

    datas = await asyncio.to_thread(decoded)
    total = sum(len(d) for d in datas)
    if total > HTTP_UPLOAD_MAX_BYTES:
        raise UploadRefused(413, TOO_BIG.format(n=total, most=HTTP_UPLOAD_MAX_BYTES))
    uploads = []
    for s, data in zip(sent, datas, strict=True):
        mime = s.mime or mimetypes.guess_type(s.name)[0]
        name = " ".join(strip_nul(s.name).split())[:255] or "file"
        uploads.append(Upload(kind_of(mime), name, mime, data))  # Upload drops NUL from the type itself
    return tuple(uploads)
