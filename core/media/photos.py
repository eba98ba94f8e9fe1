"""Photos in the conversation: a photo's message holds its mark ("[photo #12]") where it was sent, and a turn for a
model that sees images gets the newest MEDIA_REPLAY_IMAGES of them back as image parts (older ones stay their mark and
caption, so a long chat does not resend megabytes). Marks are looked up in the turn's own chat only: one typed by hand
can name no one else's photo."""

from __future__ import annotations

import re
from typing import Any

from core.constants import MEDIA_REPLAY_IMAGES
from core.media.images import image_part
from core.storage.db import Pool

MARK = "[photo #{id}]"
_MARK = re.compile(r"\[photo #(\d{1,18})\]")


def mark(attachment_id: int) -> str:
    """The text a photo leaves in its message."""
    return MARK.format(id=attachment_id)


async def with_images(pool: Pool, chat_id: int, messages: list[dict[str, Any]]) -> None:
    """Give the user messages that name the newest photos of the chat those photos as image parts (in place)."""
    wanted: list[tuple[int, int]] = []  # (message index, photo id), newest first
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m["role"] != "user" or not isinstance(m["content"], str) or "[photo #" not in m["content"]:
            continue
        ids = [int(x) for x in _MARK.findall(m["content"])]
        wanted += [(i, pid) for pid in reversed(ids)]
        if len(wanted) >= MEDIA_REPLAY_IMAGES:
            break
    wanted = wanted[:MEDIA_REPLAY_IMAGES]
    if not wanted:
        return
    rows = await pool.fetch(
        "SELECT id, data FROM attachments WHERE chat_id = $1 AND kind = 'photo' AND id = ANY($2::bigint[])"
        " AND data IS NOT NULL",
        chat_id,
        [pid for _, pid in wanted],
    )
    found = {int(r["id"]): bytes(r["data"]) for r in rows}
    parts: dict[int, list[dict[str, Any]]] = {}
    for i, pid in reversed(wanted):  # in the order they were sent
        if pid in found:
            parts.setdefault(i, []).append(image_part(found[pid]))
    for i, images in parts.items():
        messages[i]["content"] = [{"type": "text", "text": messages[i]["content"]}, *images]
