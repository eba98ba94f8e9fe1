"""Files people send on Matrix (m.file, m.image, m.audio), fetched from the media repository (mxc://) when their
stored message is answered (at most MATRIX_MAX_DOWNLOAD_BYTES); the inbox keeps only the reference."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
from mautrix.client import ClientAPI
from mautrix.errors import MatrixError
from mautrix.types import ContentURI

from adapters.matrix.incoming import StoredFile
from adapters.matrix.limits import MATRIX_DOWNLOAD_TIMEOUT_S, MATRIX_MAX_DOWNLOAD_BYTES
from core import Upload

TOO_BIG = f"the file is too big (at most {MATRIX_MAX_DOWNLOAD_BYTES // 1_000_000} MB)"


def reference(file: StoredFile) -> Upload:
    """A sent file as the core knows it before its bytes."""
    return Upload(file.kind, file.name, file.mime, None, platform_ref=file.url)


def lazy(client: ClientAPI, file: StoredFile) -> Upload:
    """A sent file, downloaded only when the core loads it."""
    return replace(reference(file), load=lambda: fetch(client, file))


async def fetch(client: ClientAPI, file: StoredFile) -> Upload:
    """A sent file's bytes, or one line saying why they could not be had."""
    base = reference(file)
    if file.size > MATRIX_MAX_DOWNLOAD_BYTES:
        return replace(base, refused=TOO_BIG)
    try:
        async with asyncio.timeout(MATRIX_DOWNLOAD_TIMEOUT_S):
            data = await client.download_media(ContentURI(file.url))
    except TimeoutError:
        return replace(base, refused="could not download the file from the homeserver (it took too long)")
    except MatrixError as e:
        return replace(base, refused=f"could not download the file from the homeserver ({e})")
    except aiohttp.ClientResponseError as e:  # mautrix raises this one for an error status
        return replace(base, refused=f"could not download the file from the homeserver (it answered {e.status})")
    except (aiohttp.ClientError, OSError):
        return replace(base, refused="could not download the file from the homeserver (no connection)")
    if len(data) > MATRIX_MAX_DOWNLOAD_BYTES:
        return replace(base, refused=TOO_BIG)
    return replace(base, data=data)
