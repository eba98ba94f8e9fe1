"""A tool result from an MCP server made safe for the prompt and the database: someone else's text, with its invisible
characters (and U+0000, which PostgreSQL refuses) stripped, its structured content as compact JSON, its embedded text
resources' text, its images kept as bytes, and the whole cut at a cap with its head and tail kept."""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.constants import MCP_LINE_CHARS, MCP_RESULT_CHARS
from core.quoting import truncate
from core.textsafe import clean_json, strip_nul

if TYPE_CHECKING:
    from mcp import types

# Invisible characters that can hide instructions from the person reading along: Unicode tag characters (U+E0000 to
# U+E007F, "ASCII smuggling"), the variation selectors supplement (U+E0100 to U+E01EF, data hidden in emoji), zero-width
# and bidi controls, and C0/C1 control characters other than tab and line feed.
_INVISIBLE = re.compile(
    "[\U000e0000-\U000e007f\U000e0100-\U000e01ef"
    "\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\u061c\u180e\ufff9-\ufffb"
    "\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


_NOT_JSON = object()
_PNG = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Outcome:
    """One call's result, already made safe for the prompt."""

    ok: bool  # False: the server said is_error
    text: str  # text blocks joined, structured content as compact JSON, invisible characters stripped, cut at a cap
    images: tuple[tuple[bytes, str], ...] = ()  # (data, mime) of image blocks


def clean(text: str) -> str:
    """`text` without tag characters, zero-width and bidi controls or other invisible control characters, and holding
    nothing PostgreSQL refuses."""
    return strip_nul(_INVISIBLE.sub("", text))


def cap(text: str, limit: int = MCP_RESULT_CHARS) -> str:
    """`text` at most `limit` characters: a longer one keeps its head and tail around "[… N characters cut …]"."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    while True:  # the marker's own length counts against the limit
        marker = f"\n[… {cut} characters cut …]\n"
        keep = max(limit - len(marker), 0)
        if len(text) - keep == cut:
            break
        cut = len(text) - keep
    head = keep * 2 // 3
    return text[:head] + marker + text[len(text) - (keep - head) :]


def outcome(result: types.CallToolResult, limit: int = MCP_RESULT_CHARS) -> Outcome:
    """The Outcome of a CallToolResult."""
    from mcp import types

    given = result.structured_content
    texts = [b.text for b in result.content if isinstance(b, types.TextContent)]
    copies = {i for i, text in enumerate(texts) if given is not None and _json_of(text) == given}
    structured = clean_json(given)  # JSON would keep a U+0000 as \u0000, which jsonb refuses
    parts: list[str] = []
    images: list[tuple[bytes, str]] = []
    seen = 0
    for block in result.content:
        if isinstance(block, types.TextContent):
            if seen not in copies:  # the JSON copy of the structured content goes once, compact, below
                parts.append(block.text)
            seen += 1
        elif isinstance(block, types.ImageContent):
            data = _decoded(block.data)
            if data is not None and data.startswith(_PNG):
                data = _png_mended(data)
            if data is None:
                parts.append(f"[an image ({_flat(block.mime_type)}) that could not be read]")
            else:
                images.append((data, block.mime_type))
                parts.append(f"[image {len(images)}: {_flat(block.mime_type)}]")
        elif isinstance(block, types.AudioContent):
            parts.append(f"[audio ({_flat(block.mime_type)}), not shown]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link: {_flat(block.name)} {_flat(block.uri)}]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            mime = f" ({_flat(resource.mime_type)})" if resource.mime_type else ""
            parts.append(f"[resource: {_flat(resource.uri)}{mime}]")
            if isinstance(resource, types.TextResourceContents):  # a binary one stays its line
                parts.append(resource.text)
    if structured is not None and (copies or not _wraps(given, texts)):
        parts.append(json.dumps(structured, ensure_ascii=False, separators=(",", ":"), default=str))
    return Outcome(ok=not result.is_error, text=cap(clean("\n".join(parts)), limit), images=tuple(images))


def _json_of(text: str) -> Any:
    """`text` parsed as JSON, or a value equal to nothing a server sends when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON


def _wraps(structured: Any, texts: list[str]) -> bool:
    """Whether `structured` only wraps the text, as {"result": text} (servers wrap a plain return value so)."""
    if not (isinstance(structured, dict) and len(structured) == 1 and texts):
        return False
    value = next(iter(structured.values()))
    joined = "\n".join(texts)
    return bool(value == joined or value == _json_of(joined))


def _decoded(data: str) -> bytes | None:
    """The bytes of a base64 block, or None when it is not base64."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def _png_mended(data: bytes) -> bytes:
    """A PNG without its ancillary chunks whose checksum is wrong (e.g. a colour profile, iCCP), which image viewers
    skip so where Pillow refuses the whole file; the same bytes when none is wrong."""
    kept, pos, dropped = [data[: len(_PNG)]], len(_PNG), False
    while pos + 12 <= len(data):
        end = pos + 12 + int.from_bytes(data[pos : pos + 4], "big")
        if end > len(data):
            break
        ancillary = data[pos + 4] & 0x20  # a lower-case first letter: the image can do without it
        if ancillary and zlib.crc32(data[pos + 4 : end - 4]) != int.from_bytes(data[end - 4 : end], "big"):
            dropped = True
        else:
            kept.append(data[pos:end])
        pos = end
    return b"".join([*kept, data[pos:]]) if dropped else data


def _flat(text: str) -> str:
    """A name or URI on one line, at most MCP_LINE_CHARS characters."""
    return truncate(text, MCP_LINE_CHARS, one_line=True)
