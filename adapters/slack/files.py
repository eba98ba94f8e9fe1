"""Files people share on Slack, fetched with the bot token when their stored message is answered (at most
SLACK_MAX_DOWNLOAD_BYTES)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp

from adapters.slack.incoming import StoredFile
from adapters.slack.limits import SLACK_DOWNLOAD_TIMEOUT_S, SLACK_MAX_DOWNLOAD_BYTES
from core import Upload


def reference(file: StoredFile) -> Upload:
    """A shared file as the core knows it before its bytes."""
    return Upload(file.kind, file.name, file.mime, None, platform_ref=f"slack:{file.id}")


def lazy(token: str, file: StoredFile) -> Upload:
    """A shared file, downloaded only when the core loads it."""
    return replace(reference(file), load=lambda: fetch(token, file))


async def fetch(token: str, file: StoredFile) -> Upload:
    """A shared file's bytes, or one line saying why they could not be had."""
    base = reference(file)
    if file.size > SLACK_MAX_DOWNLOAD_BYTES:
        return replace(base, refused=f"the file is too big (at most {SLACK_MAX_DOWNLOAD_BYTES // 1_000_000} MB)")
    try:
        async with asyncio.timeout(SLACK_DOWNLOAD_TIMEOUT_S), aiohttp.ClientSession() as session:
            headers = {"Authorization": f"Bearer {token}"}
            async with session.get(file.url, headers=headers) as resp:
                if resp.status != 200:
                    return replace(base, refused=f"could not download the file from Slack (HTTP {resp.status})")
                data = await resp.content.read(SLACK_MAX_DOWNLOAD_BYTES + 1)
    except TimeoutError:
        return replace(base, refused="could not download the file from Slack (it took too long)")
    except (aiohttp.ClientError, OSError):
        return replace(base, refused="could not download the file from Slack (no connection)")
    if len(data) > SLACK_MAX_DOWNLOAD_BYTES:
        return replace(base, refused="the file is too big")
    return replace(base, data=data)
