"""In-process fake of the Telegram Bot API for tests that drive the real python-telegram-bot."""

from __future__ import annotations

import asyncio
import copy
import errno
import itertools
import json
import math
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

from aiohttp import ClientConnectorError, ClientError, ClientSession, ClientTimeout, ServerDisconnectedError, web

from tests.loopback import LoopbackServer

__all__ = [
    "BLOCKED",
    "CHAT_NOT_FOUND",
    "DEACTIVATED",
    "FILE_TOO_BIG",
    "INVALID_FILE_ID",
    "KICKED",
    "MAX_DOWNLOAD_SIZE",
    "MAX_TEXT_LENGTH",
    "NOT_STARTED",
    "SECRET_HEADER",
    "TOKEN",
    "UPDATE_TYPES",
    "WEBHOOK_CONFLICT",
    "FakeTelegram",
    "HtmlError",
    "auto_entities",
    "parse_html",
    "utf16_len",
]

MAX_TEXT_LENGTH = 4096  # UTF-16 code units after entity parsing
CALLBACK_DATA_MAX_BYTES = 64
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are exactly "
    "the same as a current content and reply markup of the message"
)
QUERY_TOO_OLD = "Bad Request: query is too old and response timeout expired or query ID is invalid"
CONFLICT = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"
)
SET_WEBHOOK_CONFLICT = "Conflict: terminated by setWebhook request"  # a waiting getUpdates when a webhook is set
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# Update types in the Bot API server's order (its getWebhookInfo lists allowed_updates in this order)
UPDATE_TYPES = (
    "message",
    "edited_message",
    "channel_post",
    "edited_channel_post",
    "inline_query",
    "chosen_inline_result",
    "callback_query",
    "custom_event",
    "custom_query",
    "shipping_query",
    "pre_checkout_query",
    "poll",
    "poll_answer",
    "my_chat_member",
    "chat_member",
    "chat_join_request",
    "chat_boost",
    "removed_chat_boost",
    "message_reaction",
    "message_reaction_count",
    "business_connection",
    "business_message",
    "edited_business_message",
    "deleted_business_messages",
    "purchased_paid_media",
    "managed_bot",
    "guest_message",
)
_ALL_TYPES = frozenset(UPDATE_TYPES)
# without allowed_updates a bot gets every type but these
_DEFAULT_ALLOWED = _ALL_TYPES - {"chat_member", "message_reaction", "message_reaction_count"}
_WEBHOOK_PORTS = frozenset({80, 88, 443, 8443})
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})  # accepted (even http) so tests can receive
_CHAT_QUEUE = frozenset({"message", "edited_message", "channel_post", "edited_channel_post"})  # one queue per chat
_SECRET_RE = re.compile(r"[A-Za-z0-9_-]*")
SECRET_TOKEN_MAX = 256
DEFAULT_MAX_CONNECTIONS = 40
MAX_CONNECTIONS = 100
# Telegram's refusals of a chat (for refuse_chat)
BLOCKED = "Forbidden: bot was blocked by the user"
NOT_STARTED = "Forbidden: bot can't initiate conversation with a user"
KICKED = "Forbidden: bot was kicked from the supergroup chat"
DEACTIVATED = "Forbidden: user is deactivated"
CHAT_NOT_FOUND = "Bad Request: chat not found"
TOKEN = "123:AAHfake-Token_for-the-tests-0123456789"  # the shape of a real token (bot id 123)
_CHAT_METHODS = frozenset(
    {"sendmessage", "sendchataction", "sendmessagedraft", "editmessagetext", "senddocument", "sendvoice"}
)
MAX_CAPTION_LENGTH = 1024  # UTF-16 code units after entity parsing
FLOOD_METHODS = frozenset({"sendmessage", "editmessagetext"})  # what counts against the flood limits (lower case)
FLOOD_PEAK_WINDOW_S = 1.0  # flood_peak counts within this window when only flood_bucket is on
BOT_MESSAGES_PER_S = 30  # Telegram: "no more than 30 messages per second or so" per bot (limit_floods)
# getFile: the Bot API server's MAX_DOWNLOAD_FILE_SIZE (20 << 20) and its refusals (not applied with --local)
MAX_DOWNLOAD_SIZE = 20 << 20
FILE_TOO_BIG = "Bad Request: file is too big"
INVALID_FILE_ID = "Bad Request: invalid file_id"

# parameters that are plain strings on the wire (never JSON-decoded even when they look like numbers)
_STRING_PARAMS = frozenset(
    {
        "text",
        "caption",
        "parse_mode",
        "callback_query_id",
        "action",
        "language_code",
        "url",
        "inline_message_id",
        "business_connection_id",
        "message_effect_id",
        "description",
        "short_description",
        "name",
        "query",
        "secret_token",
        "ip_address",
        "emoji",
        "custom_emoji_id",
        "title",
        "first_name",
        "last_name",
        "question",
        "explanation",
        "address",
        "payload",
        "currency",
        "provider_token",
        "start_parameter",
        "error_message",
        "shipping_query_id",
        "pre_checkout_query_id",
        "result_id",
        "web_app_query_id",
        "invite_link",
        "switch_pm_text",
        "switch_pm_parameter",
        "file_id",
    }
)
_CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)
_BUTTON_ACTIONS = frozenset(
    {
        "url",
        "callback_data",
        "web_app",
        "login_url",
        "switch_inline_query",
        "switch_inline_query_current_chat",
        "switch_inline_query_chosen_chat",
        "copy_text",
        "callback_game",
        "pay",
    }
)
_COMMAND_RE = re.compile(r"[a-z0-9_]{1,32}")
_STRIP = " \t\r\n"

# ---------------------------------------------------------------------------------------------------------
# HTML parse mode (modelled on tdlib's parse_html, with the stricter rules documented on parse_html)

_TAGS = frozenset(
    {
        "b",
        "strong",
        "i",
        "em",
        "u",
        "ins",
        "s",
        "strike",
        "del",
        "span",
        "tg-spoiler",
        "a",
        "code",
        "pre",
        "blockquote",
        "tg-emoji",
    }
)
_SIMPLE_ENTITY = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "span": "spoiler",
    "tg-spoiler": "spoiler",
    "code": "code",
}
_NAMED_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
_SPACE = frozenset(" \t\r\n\v\0")
_HEX = frozenset("0123456789abcdefABCDEF")


class HtmlError(ValueError):
    """An HTML text Telegram refuses to parse (the message is the part after "can't parse entities: ")."""


def utf16_len(s: str) -> int:
    """Length of s in UTF-16 code units, as Telegram counts."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def _decode_entity(text: str, pos: int, strict: bool) -> tuple[str, int] | None:
    """Decode the character reference at text[pos] ("&"): (character, next index), or None."""
    n = len(text)
    end = pos + 1
    if end < n and text[end] == "#":
        end += 1
        value = 0
        hexadecimal = end < n and text[end] == "x"
        if hexadecimal:
            end += 1
        digits = _HEX if hexadecimal else frozenset("0123456789")
        while end < n and text[end] in digits:
            value = value * (16 if hexadecimal else 10) + int(text[end], 16)
            end += 1
            if value >= 0x10FFFF:
                return None
        if value == 0 or 0xD800 <= value <= 0xDFFF:
            return None
        char = chr(value)
    else:
        start = end
        while end < n and text[end].isascii() and text[end].isalpha():
            end += 1
        found = _NAMED_ENTITIES.get(text[start:end])
        if found is None:
            return None
        char = found
    if end < n and text[end] == ";":
        return char, end + 1
    if strict:
        return None
    return char, end  # tdlib accepts a missing semicolon


@dataclass
class _Open:
    """A start tag waiting for its end tag."""

    tag: str
    offset: int  # UTF-16 offset of the content
    byte_pos: int
    arg: str = ""
    language: str = ""  # pre: language of the inner <code class="language-...">
    has_code: bool = False  # pre: already holds its one <code>
    order: int = 0  # position among start tags, so outer entities sort first on ties


class _HtmlParser:
    """One run of the HTML parser over one text."""

    def __init__(self, text: str, strict_entities: bool) -> None:
        """Prepare to parse text."""
        self.text = text
        self.n = len(text)
        self.strict = strict_entities
        self.out: list[str] = []
        self.utf16 = 0
        self.stack: list[_Open] = []
        self.entities: list[dict[str, Any]] = []
        self.order: dict[int, int] = {}  # id(entity) -> order of its start tag
        self.opened = 0

    def at(self, k: int) -> str:
        """The character at k, or NUL past the end (like tdlib's C string)."""
        return self.text[k] if k < self.n else "\0"

    def byte(self, k: int) -> int:
        """UTF-8 byte offset of character index k."""
        return len(self.text[:k].encode("utf-8", "surrogatepass"))

    def emit(self, s: str) -> None:
        """Append decoded text."""
        self.out.append(s)
        self.utf16 += utf16_len(s)

    def entity(self, pos: int) -> tuple[str, int] | None:
        """Decode a character reference at pos, raising for a bare "&" in strict mode."""
        decoded = _decode_entity(self.text, pos, self.strict)
        if decoded is None and self.strict:
            raise HtmlError(
                f'Character "&" at byte offset {self.byte(pos)} must be escaped as "&amp;" '
                "(only &lt; &gt; &amp; &quot; and numeric references are allowed)"
            )
        return decoded

    def run(self) -> tuple[str, list[dict[str, Any]]]:
        """Parse the whole text into (plain text, entities)."""
        i = 0
        while i < self.n:
            c = self.text[i]
            if c == "&":
                decoded = self.entity(i)
                if decoded is not None:
                    self.emit(decoded[0])
                    i = decoded[1]
                    continue
            if c != "<":
                self.emit(c)
                i += 1
                continue
            i = self.end_tag(i) if self.at(i + 1) == "/" else self.start_tag(i)
        if self.stack:
            raise HtmlError(f'Can\'t find end tag corresponding to start tag "{self.stack[-1].tag}"')
        self.entities.sort(key=lambda e: (e["offset"], -e["length"], self.order[id(e)]))
        return "".join(self.out), self.entities

    def start_tag(self, begin: int) -> int:
        """Parse a start tag at begin ("<"); return the index after it."""
        i = begin + 1
        while self.at(i) not in _SPACE and self.at(i) != ">":
            i += 1
        if i >= self.n:
            raise HtmlError(f"Unclosed start tag at byte offset {self.byte(begin)}")
        tag = self.text[begin + 1 : i].lower()
        where = f"at byte offset {self.byte(begin)}"
        if tag not in _TAGS:
            raise HtmlError(f'Unsupported start tag "{tag}" {where}')
        attrs: dict[str, str] = {}
        while self.at(i) != ">":
            while i < self.n and self.at(i) in _SPACE:
                i += 1
            if self.at(i) == ">":
                break
            name_begin = i
            while self.at(i) not in _SPACE and self.at(i) not in "=>":
                i += 1
            name = self.text[name_begin:i]
            if not name:
                raise HtmlError(f'Empty attribute name in the tag "{tag}" {where}')
            while i < self.n and self.at(i) in _SPACE:
                i += 1
            if self.at(i) != "=":
                if tag == "blockquote" and name == "expandable":
                    attrs[name] = ""
                    continue
                raise HtmlError(f'Expected equal sign in declaration of an attribute of the tag "{tag}" {where}')
            i += 1
            while i < self.n and self.at(i) in _SPACE:
                i += 1
            if i >= self.n:
                raise HtmlError(f'Unclosed start tag "{tag}" {where}')
            value, i = self.attribute_value(i)
            if i >= self.n:
                raise HtmlError(f"Unclosed start tag {where}")
            attrs[name] = value
        self.open(tag, attrs, begin)
        return i + 1

    def attribute_value(self, i: int) -> tuple[str, int]:
        """Parse a quoted string or a name token at i; return (value, next index)."""
        quote = self.text[i]
        if quote not in "'\"":
            token_begin = i
            while self.at(i).isascii() and (self.at(i).isalnum() or self.at(i) in ".-"):
                i += 1
            if self.at(i) not in _SPACE and self.at(i) != ">":
                raise HtmlError(f"Unexpected end of name token at byte offset {self.byte(token_begin)}")
            return self.text[token_begin:i].lower(), i
        i += 1
        chars: list[str] = []
        while i < self.n and self.text[i] != quote:
            if self.text[i] == "&":
                decoded = self.entity(i)
                if decoded is not None:
                    chars.append(decoded[0])
                    i = decoded[1]
                    continue
            chars.append(self.text[i])
            i += 1
        if i < self.n:
            i += 1
        return "".join(chars), i

    def open(self, tag: str, attrs: dict[str, str], begin: int) -> None:
        """Check a start tag's attributes and nesting, then push it."""
        where = f"at byte offset {self.byte(begin)}"
        for outer in self.stack:
            if outer.tag in ("pre", "code"):
                top = self.stack[-1]
                if not (tag == "code" and top.tag == "pre" and not top.has_code):
                    raise HtmlError(f'Tag "{tag}" can\'t be nested inside tag "{outer.tag}" {where}')
            if tag == "blockquote" and outer.tag == "blockquote":
                raise HtmlError(f'Tag "blockquote" can\'t be nested inside tag "blockquote" {where}')
        self.opened += 1
        item = _Open(tag, self.utf16, self.byte(begin), order=self.opened)
        if tag == "a":
            href = attrs.get("href", "")
            if not href:
                raise HtmlError(f'Tag "a" must have non-empty attribute "href" {where}')
            item.arg = href
        elif tag == "span":
            if attrs.get("class") != "tg-spoiler":
                raise HtmlError(f'Tag "span" must have class "tg-spoiler" {where}')
        elif tag == "tg-emoji":
            emoji_id = attrs.get("emoji-id", "")
            if not emoji_id.isdigit() or int(emoji_id) == 0:
                raise HtmlError("Invalid custom emoji identifier specified")
            item.arg = emoji_id
        elif tag == "blockquote":
            item.arg = "expandable" if "expandable" in attrs else ""
        elif tag == "code":
            cls = attrs.get("class", "")
            item.arg = cls[len("language-") :] if cls.startswith("language-") else ""
            if self.stack:
                self.stack[-1].has_code = True
        self.stack.append(item)

    def end_tag(self, begin: int) -> int:
        """Parse an end tag at begin ("</"); return the index after it."""
        if not self.stack:
            raise HtmlError(f"Unexpected end tag at byte offset {self.byte(begin)}")
        i = begin + 2
        while self.at(i) not in _SPACE and self.at(i) != ">":
            i += 1
        name = self.text[begin + 2 : i]
        while i < self.n and self.at(i) in _SPACE:
            i += 1
        if self.at(i) != ">":
            raise HtmlError(f"Unclosed end tag at byte offset {self.byte(begin)}")
        top = self.stack.pop()
        if name and name.lower() != top.tag:
            raise HtmlError(
                f'Unmatched end tag at byte offset {self.byte(begin)}, expected "</{top.tag}>", found "</{name}>"'
            )
        self.close(top)
        return i + 1

    def close(self, item: _Open) -> None:
        """Record the entity of a closed tag (empty ones are dropped, as Telegram does)."""
        length = self.utf16 - item.offset
        parent = self.stack[-1] if self.stack else None
        if item.tag == "code" and parent is not None and parent.tag == "pre":
            parent.language = item.arg
            return
        if length <= 0:
            return
        entity: dict[str, Any] = {"offset": item.offset, "length": length}
        if item.tag in _SIMPLE_ENTITY:
            entity["type"] = _SIMPLE_ENTITY[item.tag]
        elif item.tag == "a":
            entity.update(type="text_link", url=item.arg)
        elif item.tag == "pre":
            entity["type"] = "pre"
            if item.language:
                entity["language"] = item.language
        elif item.tag == "blockquote":
            entity["type"] = "expandable_blockquote" if item.arg else "blockquote"
        else:  # tg-emoji
            entity.update(type="custom_emoji", custom_emoji_id=item.arg)
        self.order[id(entity)] = item.order
        self.entities.append(entity)


def parse_html(text: str, *, strict_entities: bool = True) -> tuple[str, list[dict[str, Any]]]:
    """Parse Telegram HTML into (plain text, entities) or raise HtmlError like the Bot API."""
    # Stricter than the real server, which silently tolerates these: with strict_entities a bare "&", an
    # unknown named entity or a reference without ";" is an error; <a> needs a non-empty href; nested
    # <blockquote> and any tag inside <pre>/<code> (except one <code> directly in <pre>) are errors.
    return _HtmlParser(text, strict_entities).run()


def auto_entities(text: str, bot_username: str = "test_bot") -> list[dict[str, Any]]:
    """Entities Telegram would attach to an incoming text: bot commands and @mentions."""
    found: list[dict[str, Any]] = []
    for m in re.finditer(r"(?<![\w/@])/[A-Za-z0-9_]{1,64}(?:@[A-Za-z0-9_]{3,32})?", text):
        found.append({"type": "bot_command", "offset": utf16_len(text[: m.start()]), "length": utf16_len(m[0])})
    for m in re.finditer(r"(?<![\w/@])@[A-Za-z0-9_]{5,32}(?!\w)", text):
        found.append({"type": "mention", "offset": utf16_len(text[: m.start()]), "length": utf16_len(m[0])})
    found.sort(key=lambda e: e["offset"])
    return found


# ---------------------------------------------------------------------------------------------------------
# the server


class _ApiError(Exception):
    """A request the Bot API answers with ok=false."""

    def __init__(self, status: int, description: str, retry_after: int | None = None) -> None:
        """Store the HTTP status, description and optional retry_after."""
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after


@dataclass
class _Failure:
    """One scripted failure of a method."""

    status: int
    description: str
    retry_after: int | None


def _bad(description: str) -> _ApiError:
    """A 400 Bad Request error."""
    return _ApiError(400, f"Bad Request: {description}")


def _decode_param(key: str, value: Any) -> Any:
    """Decode one form value: JSON-encoded objects, numbers and booleans; text-like params stay strings."""
    if not isinstance(value, str) or key in _STRING_PARAMS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _as_int(value: Any, name: str, default: int | None = None) -> int:
    """An integer parameter, or 400 when missing (without default) or malformed."""
    if value is None or value == "":
        if default is None:
            raise _bad(f"{name} is empty")
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _bad(f"wrong parameter {name} in request")
    try:
        return int(value)
    except ValueError:
        raise _bad(f"wrong parameter {name} in request") from None


def _strip(text: str, entities: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Trim surrounding whitespace like Telegram, shifting and clipping entities."""
    stripped = text.strip(_STRIP)
    if stripped == text:
        return text, entities
    lead = utf16_len(text[: len(text) - len(text.lstrip(_STRIP))])
    size = utf16_len(stripped)
    kept: list[dict[str, Any]] = []
    for e in entities:
        start = max(e["offset"] - lead, 0)
        end = min(e["offset"] + e["length"] - lead, size)
        if end > start:
            kept.append({**e, "offset": start, "length": end - start})
    return stripped, kept


def _check_markup(markup: Any) -> None:
    """Validate reply_markup the way Telegram rejects broken inline keyboards."""
    if markup is None:
        return
    if not isinstance(markup, dict):
        raise _bad("can't parse reply keyboard markup JSON object")
    rows = markup.get("inline_keyboard")
    if rows is None:
        return
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise _bad('field "inline_keyboard" of the InlineKeyboardMarkup must be an Array of Arrays')
    for row in rows:
        for button in row:
            if not isinstance(button, dict) or not isinstance(button.get("text"), str):
                raise _bad('can\'t parse inline keyboard button: Field "text" must be of type String')
            if not _BUTTON_ACTIONS & button.keys():
                raise _bad("can't parse inline keyboard button: Text buttons are unallowed in the inline keyboard")
            data = button.get("callback_data")
            if data is not None and (
                not isinstance(data, str) or not 1 <= len(data.encode()) <= CALLBACK_DATA_MAX_BYTES
            ):
                raise _bad("BUTTON_DATA_INVALID")
            url = button.get("url")
            if url is not None and not re.match(r"(https?|tg)://\S", str(url)):
                raise _bad(f"inline keyboard button URL '{url}' is invalid: Unsupported URL protocol")


def _parse_allowed(raw: Any) -> frozenset[str] | None:
    """allowed_updates as the Bot API server reads it: None keeps the previous setting, no known type is the default."""
    if not isinstance(raw, list) or not raw or not all(isinstance(name, str) for name in raw):
        return None  # missing, not JSON, not an array or not all strings: the server keeps what it had
    known = frozenset(name.lower() for name in raw) & _ALL_TYPES
    return known or _DEFAULT_ALLOWED


def _update_type(update: dict[str, Any]) -> str:
    """The type of an Update: its one field besides update_id."""
    return next((key for key in update if key != "update_id"), "")


def _queue_key(update: dict[str, Any]) -> tuple[str, Any]:
    """The webhook queue of an update: one request at a time per chat (callback queries: per user), like Telegram."""
    kind = _update_type(update)
    body = update.get(kind)
    if isinstance(body, dict):
        chat = body.get("chat")
        if isinstance(chat, dict) and "id" in chat:
            family = "chat" if kind in _CHAT_QUEUE else "business" if "business" in kind else kind
            return family, chat["id"]
        sender = body.get("from")
        if isinstance(sender, dict) and "id" in sender:
            return kind, sender["id"]
    return "update", update.get("update_id")  # its own queue


def _max_connections(raw: Any) -> int:
    """setWebhook's max_connections as the server reads it: default 40, a non-number is 0, clamped to 1..100."""
    try:
        wanted = DEFAULT_MAX_CONNECTIONS if raw is None or raw == "" else int(raw)
    except (TypeError, ValueError):
        wanted = 0
    return min(max(wanted, 1), MAX_CONNECTIONS)


def _split_url(url: str) -> tuple[SplitResult, int]:
    """A webhook URL (https:// when it names no scheme) and its port; 400 when Telegram could not parse it."""
    full = url if "://" in url else f"https://{url}"
    invalid = _bad("invalid webhook URL specified")
    try:
        parts = urlsplit(full)
        port = parts.port
    except ValueError:
        raise invalid from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname or any(c.isspace() or ord(c) < 32 for c in url):
        raise invalid
    return parts, port if port is not None else (443 if scheme == "https" else 80)


def _origin(parts: SplitResult, port: int) -> str:
    """scheme://host:port of a URL, normalised (the key of a route)."""
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{port}"


@dataclass
class _Webhook:
    """The webhook that is set, and how its deliveries went."""

    url: str
    target: str  # where the POSTs go: url itself, or its local route
    secret: str
    max_connections: int
    ip_address: str
    params: dict[str, Any]
    last_error_date: int = 0
    last_error_message: str = ""
    task: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class Upload:
    """A file uploaded in a multipart request."""

    filename: str
    content_type: str
    data: bytes


@dataclass(frozen=True)
class _StoredFile:
    """A file a test registered (add_file): what getFile tells about it, and its bytes."""

    file_id: str
    file_unique_id: str
    path: str  # its file_path without --local, e.g. voice/file_3.oga
    data: bytes


@dataclass
class _Outcome:
    """One POST of an update: the HTTP status, or the connection error."""

    status: int | None
    error: str = ""
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return self.status is not None and 200 <= self.status <= 299

    @property
    def recorded(self) -> int | str:
        """What webhook_attempts records: the status, or the error."""
        return self.status if self.status is not None else self.error


@dataclass
class _Delivery:
    """Retry state of the updates being delivered to the webhook."""

    in_flight: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    retry_at: dict[int, float] = field(default_factory=dict)  # loop time of the next attempt
    fail_counts: dict[int, int] = field(default_factory=dict)


Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class FakeTelegram(LoopbackServer):
    """A fake Telegram Bot API server on 127.0.0.1 for the real PTB (use base_url with ApplicationBuilder).

    Long polling by default; after setWebhook it POSTs each update to the webhook like Telegram: one request at a
    time per chat, at most max_connections at once, each retried until a 2xx (see webhook_attempts).
    """

    handler_cancellation = True  # a long poll PTB gave up on (stopping) ends with its connection

    def __init__(self, token: str = TOKEN, bot_id: int = 123, bot_username: str = "test_bot") -> None:
        """Create the (not yet started) server for one bot."""
        self.token = token
        self.bot_id = bot_id
        self.bot_username = bot_username
        self.strict_entities = True  # False: tolerate a bare "&" in HTML like the real server does
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.sent: list[dict[str, Any]] = []
        self.drafts: list[dict[str, Any]] = []
        self.chat_actions: list[dict[str, Any]] = []
        self.commands: list[dict[str, Any]] | None = None
        self.callback_answers: list[dict[str, Any]] = []
        self.get_updates_ok = 0
        # webhook mode
        self.webhook_attempts: list[tuple[int, int | str]] = []  # (update_id, HTTP status or connection error)
        self.webhook_failures = 0  # attempts that got no 2xx
        self.webhook_peak_in_flight = 0  # most POSTs the fake had open at once
        self.webhook_backoff = 0.05  # seconds before the 2nd retry (the 1st is at once, like Telegram); doubles
        self.webhook_backoff_max = 0.5  # the retry pause stops doubling here (Telegram: 60-120 s)
        self.webhook_timeout = 30.0  # a POST without an answer within this fails
        self.set_webhook_every = 1.0  # like Telegram, a 2nd setWebhook (with a url) within this gets a 429
        # per-bot flood limits, off by default; a FLOOD_METHODS call past one (by arrival) gets a 429 with
        # retry_after, counted in flood_429s. flood_limit (messages, seconds): at most that many in any such sliding
        # window, e.g. (30, 1.0) for "30 in any second"; flood_bucket (burst, per second): a token bucket, e.g.
        # (30, 30.0) for Telegram's "30 messages a second" as PTB's AIORateLimiter reads it (30 at once, then 30 a
        # second: up to 60 within one second)
        self.flood_limit: tuple[int, float] | None = None
        self.flood_bucket: tuple[float, float] | None = None
        self.flood_429s = 0
        self.flood_peak = 0  # the most calls let through in one window (flood_limit's, else FLOOD_PEAK_WINDOW_S)
        self.flood_clock: Callable[[], float] = time.monotonic
        self._flood_log: deque[float] = deque()  # arrival times of the calls let through in the current window
        self._flood_tokens = math.inf  # flood_bucket's tokens when last counted (it starts full)
        self._flood_at = 0.0  # when they were counted
        self._hook: _Webhook | None = None
        self._routes: dict[str, str] = {}  # public origin -> local origin
        self._allowed = _DEFAULT_ALLOWED
        self._delivery = _Delivery()
        self._delivered: dict[int, dict[str, Any]] = {}  # acknowledged updates, for redeliver()
        self._session: ClientSession | None = None
        self._last_set_webhook = -float("inf")
        self._updates: deque[dict[str, Any]] = deque()
        self._last_update_id = 0
        self._last_message_id: dict[int | str, int] = {}
        self._messages: dict[tuple[int | str, int], dict[str, Any]] = {}  # every known message
        self._outgoing: dict[tuple[int | str, int], dict[str, Any]] = {}  # sent entries by (chat, id)
        self._chats: dict[int | str, dict[str, Any]] = {}
        self._open_callbacks: set[str] = set()
        self._callback_ids = itertools.count(4_000_000_000_000_000_001)
        self._scoped_commands: dict[str, list[dict[str, Any]]] = {}
        self._failures: dict[str, deque[_Failure]] = {}
        self._passes: dict[str, int] = {}  # calls let through before the queued failures (fail_next's `after`)
        self._refused: dict[int | str, str] = {}  # chat id → Telegram's refusal
        self._drops = 0
        self._poll_generation = 0
        self._closing = False
        # files (add_file, getFile and their download)
        self.downloads: list[tuple[str, str]] = []  # (token, file_path) of every GET /file/bot<token>/<file_path>
        self._files: dict[str, _StoredFile] = {}  # file_id → file
        self._file_numbers = itertools.count(1)
        self._local: tuple[Path, bool] | None = None  # local_mode's (directory, shared)
        super().__init__()
        self._app.router.add_get("/file/bot{token}/{path:.+}", self._serve_file)
        self._app.router.add_route("*", "/{tail:.*}", self._handle)
        self._methods: dict[str, Handler] = {
            "getme": self._get_me,
            "setwebhook": self._set_webhook,
            "deletewebhook": self._delete_webhook,
            "getwebhookinfo": self._get_webhook_info,
            "getupdates": self._get_updates,
            "sendmessage": self._send_message,
            "senddocument": self._send_document,
            "sendvoice": self._send_voice,
            "editmessagetext": self._edit_message_text,
            "editmessagereplymarkup": self._edit_message_reply_markup,
            "sendmessagedraft": self._send_message_draft,
            "sendchataction": self._send_chat_action,
            "setmycommands": self._set_my_commands,
            "getmycommands": self._get_my_commands,
            "deletemycommands": self._delete_my_commands,
            "answercallbackquery": self._answer_callback_query,
            "deletemessage": self._delete_message,
            "getfile": self._get_file,
            "close": self._true,
            "logout": self._true,
        }

    # lifecycle

    async def start(self) -> None:
        """Bind 127.0.0.1 on an ephemeral port (and resume delivering to a webhook set before a stop)."""
        self._closing = False
        await super().start()
        if self._hook is not None and self._hook.task is None:
            self._hook.task = asyncio.create_task(self._deliver(self._hook))

    async def stop(self) -> None:
        """Answer every waiting getUpdates at once (empty), stop webhook deliveries and shut the server down."""
        self._closing = True
        self._notify()
        if self._hook is not None:
            await self._stop_delivery(self._hook)
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        await super().stop()

    @property
    def base_url(self) -> str:
        """Base URL for ApplicationBuilder().base_url(...), e.g. http://127.0.0.1:PORT/bot."""
        return f"{self.origin}/bot"

    # scripting

    def push_update(self, update: dict[str, Any]) -> int:
        """Queue a raw Update (for getUpdates or the webhook), assigning a monotonic update_id if missing; return it.

        Like Telegram, an update of a type the bot did not ask for (allowed_updates) is dropped.
        """
        update_id = self._prepare(update)
        if _update_type(update) in _ALL_TYPES - self._allowed:
            return update_id
        self._updates.append(update)
        self._notify()
        return update_id

    def _prepare(self, update: dict[str, Any]) -> int:
        """Give update an id if it has none and remember its messages and callback query; return the id."""
        update_id = update.get("update_id")
        if not isinstance(update_id, int):
            update_id = self._last_update_id + 1
            update["update_id"] = update_id
        self._last_update_id = max(self._last_update_id, update_id)
        for key in ("message", "edited_message", "channel_post", "edited_channel_post", "business_message"):
            if isinstance(update.get(key), dict):
                self._register_message(update[key])
        query = update.get("callback_query")
        if isinstance(query, dict):
            self._open_callbacks.add(str(query.get("id")))
            if isinstance(query.get("message"), dict):
                self._register_message(query["message"])
        return update_id

    def message_update(
        self,
        text: str,
        *,
        chat_id: int = 1001,
        user_id: int = 1001,
        first_name: str = "Ann",
        chat_type: str = "private",
        message_id: int | None = None,
        reply_to_bot: bool = False,
        thread_id: int | None = None,
        entities: list[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
        forward_origin: dict[str, Any] | None = None,
        reply_to: dict[str, Any] | None = None,
        quote: str | None = None,
        external_reply: dict[str, Any] | None = None,
        language_code: str = "en",
    ) -> dict[str, Any]:
        """Build (not push) an Update with a user's text message; commands and @mentions get entities.

        forward_origin (see origin_user/origin_hidden_user/origin_chat/origin_channel): the text is a forward;
        reply_to: a Message dict (or an Update holding one) replied to; quote: the quoted part of the message
        replied to (reply_to, the bot's latest message with reply_to_bot, or external_reply); external_reply: a
        message of another chat replied to (see external_reply)."""
        chat: dict[str, Any] = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            chat["first_name"] = first_name
        else:
            chat["title"] = "Test Channel" if chat_type == "channel" else "Test Group"
            if thread_id is not None and chat_type == "supergroup":
                chat["is_forum"] = True
        self._chats.setdefault(chat_id, chat)
        if message_id is None:
            message_id = self._next_message_id(chat_id)
        else:
            self._last_message_id[chat_id] = max(self._last_message_id.get(chat_id, 0), message_id)
        message: dict[str, Any] = {
            "message_id": message_id,
            "from": {"id": user_id, "is_bot": False, "first_name": first_name, "language_code": language_code},
            "chat": chat,
            "date": int(time.time()),
            "text": text,
        }
        found = auto_entities(text, self.bot_username) if entities is None else entities
        if found:
            message["entities"] = found
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            message["is_topic_message"] = True
        if reply_to_bot:
            message["reply_to_message"] = self._bot_message_in(chat, thread_id)
        if reply_to is not None:
            replied = reply_to.get("message", reply_to)
            message["reply_to_message"] = copy.deepcopy({k: v for k, v in replied.items() if k != "reply_to_message"})
        if forward_origin is not None:
            message["forward_origin"] = copy.deepcopy(forward_origin)
        if external_reply is not None:
            message["external_reply"] = copy.deepcopy(external_reply)
        if quote is not None:
            message["quote"] = self._quote(message, quote)
        if extra:
            message.update(extra)
        return {"message": message}

    @staticmethod
    def _quote(message: dict[str, Any], quote: str) -> dict[str, Any]:
        """A TextQuote of the replied message, checked like Telegram (a part of its text, as sent manually)."""
        replied = message.get("reply_to_message")
        if replied is None and "external_reply" not in message:
            raise ValueError("a quote needs a message replied to (reply_to, reply_to_bot or external_reply)")
        whole = str(replied.get("text") or replied.get("caption") or "") if replied is not None else None
        if whole is not None and quote not in whole:
            raise ValueError(f"quote {quote!r} is not a part of the message replied to")
        return {"text": quote, "position": whole.index(quote) if whole else 0, "is_manual": True}

    @staticmethod
    def origin_user(user_id: int, first_name: str, last_name: str | None = None) -> dict[str, Any]:
        """A MessageOrigin of a user who allows linking to their account."""
        user: dict[str, Any] = {"id": user_id, "is_bot": False, "first_name": first_name}
        if last_name:
            user["last_name"] = last_name
        return {"type": "user", "date": int(time.time()) - 3600, "sender_user": user}

    @staticmethod
    def origin_hidden_user(name: str) -> dict[str, Any]:
        """A MessageOrigin of a user who hides their account in forwards."""
        return {"type": "hidden_user", "date": int(time.time()) - 3600, "sender_user_name": name}

    @staticmethod
    def origin_chat(chat_id: int, title: str, signature: str | None = None) -> dict[str, Any]:
        """A MessageOrigin of a message sent on behalf of a group (an anonymous admin)."""
        origin: dict[str, Any] = {
            "type": "chat",
            "date": int(time.time()) - 3600,
            "sender_chat": {"id": chat_id, "type": "supergroup", "title": title},
        }
        if signature:
            origin["author_signature"] = signature
        return origin

    @staticmethod
    def origin_channel(chat_id: int, title: str, message_id: int = 1, signature: str | None = None) -> dict[str, Any]:
        """A MessageOrigin of a channel post."""
        origin: dict[str, Any] = {
            "type": "channel",
            "date": int(time.time()) - 3600,
            "chat": {"id": chat_id, "type": "channel", "title": title},
            "message_id": message_id,
        }
        if signature:
            origin["author_signature"] = signature
        return origin

    @staticmethod
    def external_reply(origin: dict[str, Any], **content: Any) -> dict[str, Any]:
        """An ExternalReplyInfo: a message of another chat (origin from origin_*) with content fields such as
        photo=[{...}] (a photo is given sizes when True)."""
        info: dict[str, Any] = {"origin": copy.deepcopy(origin)}
        if origin.get("type") == "channel":
            info["chat"], info["message_id"] = origin["chat"], origin["message_id"]
        for key, value in content.items():
            if key == "photo" and value is True:
                value = [{"file_id": "photo-1", "file_unique_id": "p1", "width": 90, "height": 90}]
            info[key] = value
        return info

    def callback_update(
        self, data: str, *, message: dict[str, Any], user_id: int = 1001, first_name: str = "Ann"
    ) -> dict[str, Any]:
        """Build (not push) an Update with a callback query on message (a Message dict or a `sent` entry)."""
        inner = message.get("message")
        msg = copy.deepcopy(inner if isinstance(inner, dict) and "message_id" in inner else message)
        chat_id = msg.get("chat", {}).get("id", 0)
        return {
            "callback_query": {
                "id": str(next(self._callback_ids)),
                "from": {"id": user_id, "is_bot": False, "first_name": first_name, "language_code": "en"},
                "message": msg,
                "chat_instance": str(abs(hash((chat_id, self.bot_id))) % 10**18),
                "data": data,
            }
        }

    def limit_floods(self, *, strict: bool = False) -> None:
        """Answer 429 past Telegram's 30 messages a second per bot: 30 at once, then 30 a second (a token bucket, as
        PTB's AIORateLimiter reads it), or, `strict`, 30 in any 1 s."""
        if strict:
            self.flood_limit = (BOT_MESSAGES_PER_S, FLOOD_PEAK_WINDOW_S)
        else:
            self.flood_bucket = (BOT_MESSAGES_PER_S, float(BOT_MESSAGES_PER_S))

    def fail_next(
        self,
        method: str,
        *,
        status: int = 429,
        description: str = "Too Many Requests: retry after 1",
        retry_after: int | None = 1,
        times: int = 1,
        after: int = 0,
    ) -> None:
        """Make the next `times` calls of method fail, once `after` more calls went through (retry_after is only
        sent with status 429)."""
        if description == "Too Many Requests: retry after 1" and retry_after is not None:
            description = f"Too Many Requests: retry after {retry_after}"
        queue = self._failures.setdefault(method.lower(), deque())
        queue.extend(_Failure(status, description, retry_after if status == 429 else None) for _ in range(times))
        self._passes[method.lower()] = after

    def refuse_chat(self, chat_id: int | str, description: str = BLOCKED) -> None:
        """From now on refuse every message to chat_id like Telegram does (403 "Forbidden: …", else 400)."""
        self._refused[chat_id] = description

    def drop_next_get_updates(self, times: int = 1) -> None:
        """Abort the next getUpdates connection(s) without any response (a network drop)."""
        self._drops += times

    async def wait_sent(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until at least count messages were sent; return `sent`."""
        try:
            await self.wait_for(lambda: len(self.sent) >= count, timeout)
        except TimeoutError:
            texts = [s.get("text") for s in self.sent]
            raise TimeoutError(
                f"expected {count} sent message(s) within {timeout}s, got {len(self.sent)}: {texts!r}; {self._recent()}"
            ) from None
        return self.sent

    # files: registered by the test, fetched by the bot with getFile and GET /file/bot<token>/<file_path>

    def add_file(self, data: bytes, *, file_id: str | None = None, path: str | None = None) -> str:
        """Register a file the bot may fetch (path: its file_path, by default documents/file_<n>); its file_id."""
        n = next(self._file_numbers)
        file_id = file_id or f"file-{n}"
        self._files[file_id] = _StoredFile(file_id, f"unique-{n}", path or f"documents/file_{n}", data)
        return file_id

    def local_mode(self, directory: Path, *, shared: bool = True) -> None:
        """Behave from now on like a Bot API server run with --local --dir=directory: getFile has no size limit and
        gives the absolute path <directory>/<token>/<file_path>, where it saves the file when `shared` (a disk the bot
        can read; otherwise the path is on a disk the bot cannot see). The server serves no file over HTTP then."""
        self._local = (directory, shared)

    def _media_file(self, data: bytes, folder: str, extension: str) -> dict[str, Any]:
        """Register data as Telegram names a file of its kind (e.g. voice/file_3.oga); the media's file fields."""
        file_id = self.add_file(data, path=f"{folder}/file_{len(self._files)}{extension}")
        stored = self._files[file_id]
        return {"file_id": file_id, "file_unique_id": stored.file_unique_id, "file_size": len(data)}

    def media_update(
        self, field: str, media: dict[str, Any] | list[dict[str, Any]], *, caption: str | None = None, **message: Any
    ) -> dict[str, Any]:
        """Build (not push) an Update with a user's message carrying `media` in `field` (e.g. "voice") and no text,
        maybe a caption (its commands and @mentions get caption_entities); `message`: as for message_update
        (chat_id, user_id, chat_type, reply_to…). voice_update, photo_update and the others register real files."""
        update = self.message_update("", entities=[], **message)
        body: dict[str, Any] = update["message"]
        del body["text"]
        body[field] = media
        if caption:
            body["caption"] = caption
            found = auto_entities(caption, self.bot_username)
            if found:
                body["caption_entities"] = found
        return update

    def voice_update(
        self,
        data: bytes,
        *,
        duration: int = 1,
        mime_type: str = "audio/ogg",
        caption: str | None = None,
        **message: Any,
    ) -> dict[str, Any]:
        """Build (not push) an Update with a voice note of `data` (registered for getFile)."""
        voice = {**self._media_file(data, "voice", ".oga"), "duration": duration, "mime_type": mime_type}
        return self.media_update("voice", voice, caption=caption, **message)

    def audio_update(
        self,
        data: bytes,
        *,
        file_name: str = "song.mp3",
        mime_type: str = "audio/mpeg",
        duration: int = 1,
        title: str | None = None,
        performer: str | None = None,
        caption: str | None = None,
        **message: Any,
    ) -> dict[str, Any]:
        """Build (not push) an Update with an audio file of `data` (registered for getFile)."""
        audio = {
            **self._media_file(data, "music", Path(file_name).suffix),
            "duration": duration,
            "file_name": file_name,
            "mime_type": mime_type,
        }
        audio.update({k: v for k, v in (("title", title), ("performer", performer)) if v is not None})
        return self.media_update("audio", audio, caption=caption, **message)

    def photo_update(
        self, sizes: Sequence[tuple[int, int, bytes]], *, caption: str | None = None, **message: Any
    ) -> dict[str, Any]:
        """Build (not push) an Update with a photo: `sizes` are (width, height, JPEG bytes) from the smallest up, as
        Telegram lists them, each a file of its own (registered for getFile)."""
        photo = [
            {**self._media_file(data, "photos", ".jpg"), "width": width, "height": height}
            for width, height, data in sizes
        ]
        return self.media_update("photo", photo, caption=caption, **message)

    def document_update(
        self,
        data: bytes,
        *,
        file_name: str = "file.pdf",
        mime_type: str = "application/pdf",
        caption: str | None = None,
        **message: Any,
    ) -> dict[str, Any]:
        """Build (not push) an Update with a document (a file sent as a file) of `data` (registered for getFile)."""
        document = {
            **self._media_file(data, "documents", Path(file_name).suffix),
            "file_name": file_name,
            "mime_type": mime_type,
        }
        return self.media_update("document", document, caption=caption, **message)

    def sticker_update(
        self,
        data: bytes,
        *,
        emoji: str = "👍",
        kind: Literal["static", "animated", "video"] = "static",
        set_name: str = "TestStickers",
        **message: Any,
    ) -> dict[str, Any]:
        """Build (not push) an Update with a sticker (WebP, animated TGS or video WebM) of `data` (registered for
        getFile); stickers have no caption."""
        extension = {"static": ".webp", "animated": ".tgs", "video": ".webm"}[kind]
        sticker = {
            **self._media_file(data, "stickers", extension),
            "type": "regular",
            "width": 512,
            "height": 512,
            "is_animated": kind == "animated",
            "is_video": kind == "video",
            "emoji": emoji,
            "set_name": set_name,
        }
        return self.media_update("sticker", sticker, **message)

    def animation_update(
        self,
        data: bytes,
        *,
        file_name: str = "animation.mp4",
        mime_type: str = "video/mp4",
        duration: int = 1,
        caption: str | None = None,
        **message: Any,
    ) -> dict[str, Any]:
        """Build (not push) an Update with an animation (a GIF, which Telegram turns into a silent MP4) of `data`
        (registered for getFile); like Telegram, the message also carries it as its document."""
        fields = self._media_file(data, "animations", Path(file_name).suffix)
        named = {"file_name": file_name, "mime_type": mime_type}
        animation = {**fields, "width": 320, "height": 240, "duration": duration, **named}
        update = self.media_update("animation", animation, caption=caption, **message)
        update["message"]["document"] = {**fields, **named}
        return update

    def video_note_update(self, data: bytes, *, duration: int = 1, length: int = 240, **message: Any) -> dict[str, Any]:
        """Build (not push) an Update with a video note (a round video message) of `data` (registered for getFile)."""
        note = {**self._media_file(data, "video_notes", ".mp4"), "length": length, "duration": duration}
        return self.media_update("video_note", note, **message)

    # webhook mode

    @property
    def webhook(self) -> dict[str, Any] | None:
        """What the bot set with setWebhook (max_connections as Telegram clamped it), or None without a webhook."""
        hook = self._hook
        if hook is None:
            return None
        return {
            "url": hook.url,
            "secret_token": hook.secret,
            "max_connections": hook.max_connections,
            "allowed_updates": hook.params.get("allowed_updates"),
            "drop_pending_updates": hook.params.get("drop_pending_updates") is True,
            "ip_address": hook.params.get("ip_address"),
        }

    def route_webhook(self, public: str, local: str) -> None:
        """Deliver webhooks for the public origin (e.g. https://bot.example.com) to local (http://127.0.0.1:PORT).

        Stands for DNS plus a TLS-terminating reverse proxy: setWebhook checks the public URL like Telegram
        (https, ports 80/88/443/8443); the path and query are kept. Without a route only loopback hosts are
        accepted (http too, any port); any other host fails to resolve.
        """
        parts, port = _split_url(public)
        self._routes[_origin(parts, port)] = local.rstrip("/")

    async def post_webhook(self, update: dict[str, Any], *, secret: str | None, url: str | None = None) -> int:
        """POST update once with this secret header (None: none), as anyone could; return the HTTP status.

        Goes to url, or by default where the webhook's POSTs go. Not Telegram's delivery: nothing is queued,
        retried or recorded in webhook_attempts (the update gets an update_id and its messages are known).
        """
        target = url if url is not None else self._require_hook().target
        self._prepare(update)
        outcome = await self._post(target, update, secret)
        if outcome.status is None:
            raise ConnectionError(outcome.error)
        return outcome.status

    async def redeliver(self, update_id: int) -> int:
        """POST an already acknowledged update again, as Telegram does when it missed the 200; return the status."""
        hook = self._require_hook()
        update = self._delivered.get(update_id)
        if update is None:
            raise KeyError(f"update {update_id} was not delivered to the webhook")
        outcome = await self._post(hook.target, update, hook.secret)
        self.webhook_attempts.append((update_id, outcome.recorded))
        if not outcome.ok:
            self._record_error(hook, outcome)
        self._notify()
        if outcome.status is None:
            raise ConnectionError(outcome.error)
        return outcome.status

    async def wait_webhook_idle(self, timeout: float = 10.0) -> None:
        """Wait until every pushed update was acknowledged (by a 2xx from the webhook, or a getUpdates offset)."""
        try:
            await self.wait_for(lambda: not self._updates, timeout)
        except TimeoutError:
            pending = [u["update_id"] for u in self._updates]
            raise TimeoutError(
                f"updates {pending} still pending after {timeout}s; attempts: {self.webhook_attempts[-8:]!r}; "
                f"webhook: {self._hook.url if self._hook else None!r}"
            ) from None

    def _require_hook(self) -> _Webhook:
        """The webhook that is set (a test error without one)."""
        if self._hook is None:
            raise RuntimeError("no webhook is set")
        return self._hook

    def _client(self) -> ClientSession:
        """The HTTP client the webhook POSTs go through (made on first use, closed by stop())."""
        if self._session is None:
            self._session = ClientSession()
        return self._session

    async def _post(self, url: str, update: dict[str, Any], secret: str | None) -> _Outcome:
        """POST update as JSON to url with the secret header (when given); the status or the connection error."""
        headers = {SECRET_HEADER: secret} if secret else {}
        try:
            async with self._client().post(
                url, json=update, headers=headers, timeout=ClientTimeout(total=self.webhook_timeout)
            ) as response:
                await response.read()
                retry_after = response.headers.get("Retry-After", "")
                return _Outcome(
                    response.status,
                    f"Wrong response from the webhook: {response.status} {response.reason or ''}".rstrip(),
                    float(retry_after) if retry_after.isdigit() else None,
                )
        except ClientConnectorError as e:
            refused = e.os_error.errno == errno.ECONNREFUSED
            return _Outcome(None, "Connection refused" if refused else "Can't connect to the webhook")
        except ServerDisconnectedError:
            return _Outcome(None, "Webhook connection closed")
        except TimeoutError:
            return _Outcome(None, "Timeout expired")
        except ClientError as e:
            return _Outcome(None, f"Webhook connection error: {type(e).__name__}")

    async def _deliver(self, hook: _Webhook) -> None:
        """Deliver pending updates to hook until cancelled: start what is ready, then wait for a change or a retry."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                wakeup = self._wakeup
                next_at = self._launch(hook, loop.time())
                delay = None if next_at is None else max(next_at - loop.time(), 0.0)
                try:
                    async with asyncio.timeout(delay):
                        await wakeup.wait()
                except TimeoutError:
                    pass
        finally:
            tasks = list(self._delivery.in_flight.values())
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)
            self._delivery = _Delivery()

    def _launch(self, hook: _Webhook, now: float) -> float | None:
        """Start a POST for the first pending update of each idle queue; return when a held-back retry is due."""
        state = self._delivery
        seen: set[tuple[str, Any]] = set()
        next_at: float | None = None
        for update in list(self._updates):
            if len(state.in_flight) >= hook.max_connections:
                break
            key = _queue_key(update)
            if key in seen:
                continue
            seen.add(key)  # only the head of a queue may go; the rest wait for its 2xx
            update_id = update["update_id"]
            if update_id in state.in_flight:
                continue
            due = state.retry_at.get(update_id, now)
            if due > now:
                next_at = due if next_at is None else min(next_at, due)
                continue
            state.in_flight[update_id] = asyncio.create_task(self._attempt(hook, update))
            self.webhook_peak_in_flight = max(self.webhook_peak_in_flight, len(state.in_flight))
        return next_at

    async def _attempt(self, hook: _Webhook, update: dict[str, Any]) -> None:
        """POST one update once: a 2xx acknowledges it, anything else schedules a retry."""
        update_id = update["update_id"]
        state = self._delivery
        try:
            outcome = await self._post(hook.target, update, hook.secret)
            self.webhook_attempts.append((update_id, outcome.recorded))
            if outcome.ok:
                self._acknowledge(update)
                return
            self._record_error(hook, outcome)
            fails = state.fail_counts[update_id] = state.fail_counts.get(update_id, 0) + 1
            pause = 0.0 if fails == 1 else min(self.webhook_backoff * 2 ** (fails - 2), self.webhook_backoff_max)
            if outcome.retry_after is not None:
                pause = outcome.retry_after
            state.retry_at[update_id] = asyncio.get_running_loop().time() + pause
        finally:
            state.in_flight.pop(update_id, None)
            self._notify()

    def _acknowledge(self, update: dict[str, Any]) -> None:
        """Forget a delivered update (keeping it for redeliver())."""
        update_id = update["update_id"]
        self._updates = deque(u for u in self._updates if u is not update)
        self._delivered[update_id] = update
        self._delivery.retry_at.pop(update_id, None)
        self._delivery.fail_counts.pop(update_id, None)

    def _record_error(self, hook: _Webhook, outcome: _Outcome) -> None:
        """Count a failed delivery and show it in getWebhookInfo."""
        self.webhook_failures += 1
        hook.last_error_date = int(time.time())
        hook.last_error_message = outcome.error

    async def _stop_delivery(self, hook: _Webhook) -> None:
        """Cancel hook's delivery task and wait for it (its unacknowledged updates stay pending)."""
        task, hook.task = hook.task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def _close_webhook(self) -> None:
        """Remove the webhook, if any."""
        hook, self._hook = self._hook, None
        if hook is not None:
            await self._stop_delivery(hook)

    def _new_webhook(self, url: str, params: dict[str, Any]) -> _Webhook:
        """Validate setWebhook's parameters like Telegram (400s) and build the webhook."""
        parts, port = _split_url(url)
        secret = params.get("secret_token")
        secret = "" if secret is None else str(secret)
        if len(secret) > SECRET_TOKEN_MAX:
            raise _bad("secret token is too long")
        if not _SECRET_RE.fullmatch(secret):
            raise _bad("secret token contains unallowed characters")
        route = self._routes.get(_origin(parts, port))
        host = (parts.hostname or "").lower()
        target = parts.geturl()
        if route is not None:
            target = route + (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if host not in _LOOPBACK_HOSTS:
            if parts.scheme.lower() != "https":
                raise _bad("bad webhook: An HTTPS URL must be provided for webhook")
            if port not in _WEBHOOK_PORTS:
                raise _bad("bad webhook: Webhook can be set up only on ports 80, 88, 443 or 8443")
            if route is None:
                raise _bad("bad webhook: Failed to resolve host: Name or service not known")
        ip_address = str(params.get("ip_address") or urlsplit(target).hostname or "")
        return _Webhook(url, target, secret, _max_connections(params.get("max_connections")), ip_address, params)

    # internals

    def _recent(self) -> str:
        """A short description of the last calls (and webhook attempts), for timeout messages."""
        calls = [(m, {k: v for k, v in p.items() if k != "reply_markup"}) for m, p in self.calls[-8:]]
        attempts = f"; webhook attempts: {self.webhook_attempts[-8:]!r}" if self.webhook_attempts else ""
        return f"recent calls: {calls!r}{attempts}"

    def _next_message_id(self, chat_id: int | str) -> int:
        """Allocate the next message id of a chat (shared by incoming and outgoing messages)."""
        self._last_message_id[chat_id] = self._last_message_id.get(chat_id, 0) + 1
        return self._last_message_id[chat_id]

    def _register_message(self, message: dict[str, Any]) -> None:
        """Remember an incoming message (and what it replies to) so replies and deletes can find it."""
        chat = message.get("chat")
        message_id = message.get("message_id")
        if not isinstance(chat, dict) or not isinstance(message_id, int):
            return
        chat_id = chat.get("id")
        if not isinstance(chat_id, int | str):
            return
        self._chats.setdefault(chat_id, chat)
        self._messages.setdefault((chat_id, message_id), message)
        self._last_message_id[chat_id] = max(self._last_message_id.get(chat_id, 0), message_id)
        if isinstance(message.get("reply_to_message"), dict):
            self._register_message(message["reply_to_message"])

    def _bot_user(self) -> dict[str, Any]:
        """The bot as a User dict."""
        return {"id": self.bot_id, "is_bot": True, "first_name": "Test Bot", "username": self.bot_username}

    def _bot_message_in(self, chat: dict[str, Any], thread_id: int | None) -> dict[str, Any]:
        """The bot's latest message in chat (a made-up one when it has sent none)."""
        for entry in reversed(self.sent):
            msg: dict[str, Any] = entry["message"]
            if msg["chat"]["id"] == chat["id"] and not entry.get("deleted"):
                return copy.deepcopy(msg)
        msg = {
            "message_id": self._next_message_id(chat["id"]),
            "from": self._bot_user(),
            "chat": chat,
            "date": int(time.time()) - 60,
            "text": "An earlier message from the bot",
        }
        if thread_id is not None:
            msg["message_thread_id"] = thread_id
            msg["is_topic_message"] = True
        return msg

    def _chat_for(self, chat_id: int | str) -> dict[str, Any]:
        """The Chat dict of a known chat, or a plausible one for an unknown id."""
        if chat_id in self._chats:
            return self._chats[chat_id]
        if isinstance(chat_id, str):
            chat: dict[str, Any] = {
                "id": -1_000_000_000_000 - len(self._chats),
                "type": "channel",
                "title": chat_id.lstrip("@"),
                "username": chat_id.lstrip("@"),
            }
        elif chat_id > 0:
            chat = {"id": chat_id, "type": "private", "first_name": f"User {chat_id}"}
        else:
            kind = "supergroup" if str(chat_id).startswith("-100") else "group"
            chat = {"id": chat_id, "type": kind, "title": "Test Group"}
        self._chats[chat_id] = chat
        return chat

    def _message_text(self, params: dict[str, Any], *, allow_empty: bool = False) -> tuple[str, list[dict[str, Any]]]:
        """Parse the text of params per parse_mode and check its length like Telegram."""
        raw = params.get("text")
        raw = "" if raw is None else str(raw)
        mode = params.get("parse_mode")
        explicit = params.get("entities")
        if isinstance(explicit, list):
            text, entities = raw, [e for e in explicit if isinstance(e, dict)]
        elif mode is None or mode == "":
            text, entities = raw, []
        elif not isinstance(mode, str):
            raise _bad("unsupported parse_mode")
        elif mode.lower() == "html":
            try:
                text, entities = parse_html(raw, strict_entities=self.strict_entities)
            except HtmlError as e:
                raise _bad(f"can't parse entities: {e}") from None
        elif mode.lower() in ("markdown", "markdownv2"):
            text, entities = raw, []  # not parsed by this fake: only the raw length is checked
        else:
            raise _bad("unsupported parse_mode")
        text, entities = _strip(text, entities)
        size = utf16_len(text)
        if size == 0 and not allow_empty:
            raise _bad("message text is empty")
        if size > MAX_TEXT_LENGTH:
            raise _bad("message is too long")
        return text, entities

    def _chat_id(self, params: dict[str, Any]) -> int | str:
        """The chat_id parameter (400 when missing)."""
        chat_id = params.get("chat_id")
        if isinstance(chat_id, bool) or not isinstance(chat_id, int | str) or chat_id == "":
            raise _bad("chat_id is empty")
        return chat_id

    def _target(self, params: dict[str, Any], missing: str) -> tuple[tuple[int | str, int], dict[str, Any]]:
        """The (key, sent entry) of the bot message that params name; 400 if there is none."""
        chat_id = self._chat_id(params)
        message_id = params.get("message_id")
        if not isinstance(message_id, int) or isinstance(message_id, bool):
            raise _bad("message identifier is not specified")
        key = (chat_id, message_id)
        entry = self._outgoing.get(key)
        if entry is None:
            raise _bad("message can't be edited" if key in self._messages else missing)
        return key, entry

    # method handlers

    async def _true(self, params: dict[str, Any]) -> bool:
        """Methods that just succeed."""
        return True

    async def _get_me(self, params: dict[str, Any]) -> dict[str, Any]:
        """getMe."""
        return {
            **self._bot_user(),
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }

    async def _set_webhook(self, params: dict[str, Any]) -> bool:
        """setWebhook as the Bot API server does it (an empty url deletes the webhook)."""
        url = params.get("url")
        url = "" if url is None else str(url)
        if not url:
            return await self._delete_webhook(params)
        now = time.monotonic()
        if now < self._last_set_webhook + self.set_webhook_every:
            raise _ApiError(429, "Too Many Requests: retry after 1", 1)
        self._last_set_webhook = now
        drop = params.get("drop_pending_updates") is True
        allowed = _parse_allowed(params.get("allowed_updates"))
        hook = self._hook
        if hook is not None and not drop and hook.params.get("url") == url and self._same_webhook(hook, params):
            self._allowed = allowed or self._allowed
            return True  # "Webhook is already set"
        # like the real server: the old webhook goes first, then the new one is checked (a bad one leaves none)
        await self._close_webhook()
        if drop:
            self._updates.clear()
        new = self._new_webhook(url, params)
        self._allowed = allowed or self._allowed
        self._hook = new
        new.task = asyncio.create_task(self._deliver(new))
        self._notify()  # a waiting getUpdates ends with a 409
        return True

    @staticmethod
    def _same_webhook(hook: _Webhook, params: dict[str, Any]) -> bool:
        """Whether params set hook again unchanged (same secret, max_connections and ip_address)."""
        return (
            str(params.get("secret_token") or "") == hook.secret
            and _max_connections(params.get("max_connections")) == hook.max_connections
            and params.get("ip_address") == hook.params.get("ip_address")
        )

    async def _delete_webhook(self, params: dict[str, Any]) -> bool:
        """deleteWebhook: back to getUpdates; undelivered updates stay pending unless drop_pending_updates."""
        await self._close_webhook()
        if params.get("drop_pending_updates") is True:
            self._updates.clear()
        self._notify()
        return True

    async def _get_webhook_info(self, params: dict[str, Any]) -> dict[str, Any]:
        """getWebhookInfo with the fields the Bot API server sends."""
        hook = self._hook
        info: dict[str, Any] = {
            "url": hook.url if hook else "",
            "has_custom_certificate": False,
            "pending_update_count": len(self._updates),
        }
        if hook is not None:
            if hook.last_error_date:
                info["last_error_date"] = hook.last_error_date
                info["last_error_message"] = hook.last_error_message
            info["max_connections"] = hook.max_connections
            info["ip_address"] = hook.ip_address
        if self._allowed != _DEFAULT_ALLOWED:
            info["allowed_updates"] = [name for name in UPDATE_TYPES if name in self._allowed]
        return info

    async def _get_updates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """getUpdates: confirm below offset, then long-poll up to timeout seconds for updates."""
        if self._hook is not None:
            raise _ApiError(409, WEBHOOK_CONFLICT)
        self._allowed = _parse_allowed(params.get("allowed_updates")) or self._allowed
        offset = _as_int(params.get("offset"), "offset", 0)
        limit = min(max(_as_int(params.get("limit"), "limit", 100), 1), 100)
        timeout = params.get("timeout")
        wait = float(timeout) if isinstance(timeout, int | float) and not isinstance(timeout, bool) else 0.0
        if offset > 0:
            while self._updates and self._updates[0]["update_id"] < offset:
                self._updates.popleft()
        elif offset < 0:
            while len(self._updates) > -offset:
                self._updates.popleft()
        self._poll_generation += 1
        generation = self._poll_generation
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait, 0.0)
        while not self._updates and not self._closing:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    await self._wakeup.wait()
            except TimeoutError:
                break
            if self._hook is not None:
                raise _ApiError(409, SET_WEBHOOK_CONFLICT)
            if generation != self._poll_generation:
                raise _ApiError(409, CONFLICT)
        if self._hook is not None:
            raise _ApiError(409, SET_WEBHOOK_CONFLICT)
        return list(itertools.islice(self._updates, limit))

    async def _send_message(self, params: dict[str, Any]) -> dict[str, Any]:
        """sendMessage: validate, store in `sent` and answer the Message."""
        chat_id = self._chat_id(params)
        text, entities = self._message_text(params)
        markup = params.get("reply_markup")
        _check_markup(markup)
        replied: dict[str, Any] | None = None
        reply = params.get("reply_parameters")
        reply_id = reply.get("message_id") if isinstance(reply, dict) else params.get("reply_to_message_id")
        if reply_id is not None:
            reply_chat = reply.get("chat_id", chat_id) if isinstance(reply, dict) else chat_id
            replied = self._messages.get((reply_chat, reply_id)) if isinstance(reply_id, int) else None
            lenient = (isinstance(reply, dict) and reply.get("allow_sending_without_reply") is True) or params.get(
                "allow_sending_without_reply"
            ) is True
            if replied is None and not lenient:
                raise _bad("message to be replied not found")
        message: dict[str, Any] = {
            "message_id": self._next_message_id(chat_id),
            "from": self._bot_user(),
            "chat": self._chat_for(chat_id),
            "date": int(time.time()),
        }
        thread_id = params.get("message_thread_id")
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            message["is_topic_message"] = True
        if replied is not None:
            message["reply_to_message"] = {k: v for k, v in replied.items() if k != "reply_to_message"}
        message["text"] = text
        if entities:
            message["entities"] = entities
        if isinstance(markup, dict) and "inline_keyboard" in markup:
            message["reply_markup"] = markup
        entry = {**params, "message_id": message["message_id"], "message": message}
        key = (chat_id, message["message_id"])
        self._messages[key] = message
        self._outgoing[key] = entry
        self.sent.append(entry)
        return message

    async def _send_document(self, params: dict[str, Any]) -> dict[str, Any]:
        """sendDocument of an uploaded file (multipart): stored in `sent` with its bytes as `document_data`."""
        chat_id = self._chat_id(params)
        upload = params.get("document")
        if not isinstance(upload, Upload):
            raise _bad("there is no document in the request")
        caption, entities = self._message_text({**params, "text": params.get("caption")}, allow_empty=True)
        if utf16_len(caption) > MAX_CAPTION_LENGTH:
            raise _bad("message caption is too long")
        message: dict[str, Any] = {
            "message_id": self._next_message_id(chat_id),
            "from": self._bot_user(),
            "chat": self._chat_for(chat_id),
            "date": int(time.time()),
            "document": {
                "file_id": f"doc{len(self.sent)}",
                "file_unique_id": f"udoc{len(self.sent)}",
                "file_name": upload.filename,
                "mime_type": upload.content_type,
                "file_size": len(upload.data),
            },
        }
        if caption:
            message["caption"] = caption
        if entities:
            message["caption_entities"] = entities
        entry = {**params, "message_id": message["message_id"], "message": message, "document_data": upload.data}
        key = (chat_id, message["message_id"])
        self._messages[key] = message
        self._outgoing[key] = entry
        self.sent.append(entry)
        return message

    async def _send_voice(self, params: dict[str, Any]) -> dict[str, Any]:
        """sendVoice of an uploaded OGG/Opus file (multipart): stored in `sent` with its bytes as `voice_data` (and its
        file name as `voice_name`); it replies to reply_parameters' message like sendMessage."""
        chat_id = self._chat_id(params)
        upload = params.get("voice")
        if not isinstance(upload, Upload):
            raise _bad("there is no voice in the request")
        if not upload.data.startswith(b"OggS"):
            raise _bad("VOICE_MESSAGE_INVALID: a voice note must be OGG/Opus")  # the fake takes only what bots send
        reply = params.get("reply_parameters")
        reply_id = reply.get("message_id") if isinstance(reply, dict) else None
        replied = self._messages.get((chat_id, reply_id)) if isinstance(reply_id, int) else None
        lenient = isinstance(reply, dict) and reply.get("allow_sending_without_reply") is True
        if reply_id is not None and replied is None and not lenient:
            raise _bad("message to be replied not found")
        n = len(self.sent)
        message: dict[str, Any] = {
            "message_id": self._next_message_id(chat_id),
            "from": self._bot_user(),
            "chat": self._chat_for(chat_id),
            "date": int(time.time()),
            "voice": {
                "file_id": f"voice{n}",
                "file_unique_id": f"uvoice{n}",
                "duration": 1,
                "mime_type": "audio/ogg",
                "file_size": len(upload.data),
            },
        }
        if params.get("message_thread_id") is not None:
            message["message_thread_id"] = params["message_thread_id"]
            message["is_topic_message"] = True
        if replied is not None:
            message["reply_to_message"] = {k: v for k, v in replied.items() if k != "reply_to_message"}
        voice = {"voice_data": upload.data, "voice_name": upload.filename}
        entry = {**params, "message_id": message["message_id"], "message": message, **voice}
        key = (chat_id, message["message_id"])
        self._messages[key] = message
        self._outgoing[key] = entry
        self.sent.append(entry)
        return message

    async def _edit_message_text(self, params: dict[str, Any]) -> dict[str, Any] | bool:
        """editMessageText: replace text (and keyboard: omitted reply_markup removes it) of a bot message."""
        if params.get("inline_message_id"):
            self._message_text(params)
            _check_markup(params.get("reply_markup"))
            return True
        _, entry = self._target(params, "message to edit not found")
        text, entities = self._message_text(params)
        markup = params.get("reply_markup")
        _check_markup(markup)
        new_markup = markup if isinstance(markup, dict) and "inline_keyboard" in markup else None
        message: dict[str, Any] = entry["message"]
        if (
            message.get("text") == text
            and message.get("entities", []) == entities
            and message.get("reply_markup") == new_markup
        ):
            raise _bad(NOT_MODIFIED[len("Bad Request: ") :])
        message["text"] = text
        message["edit_date"] = int(time.time())
        for key, value in (("entities", entities or None), ("reply_markup", new_markup)):
            if value is None:
                message.pop(key, None)
            else:
                message[key] = value
        for key in ("text", "parse_mode", "entities", "reply_markup", "link_preview_options"):
            if key in params:
                entry[key] = params[key]
            else:
                entry.pop(key, None)
        entry["edit_count"] = entry.get("edit_count", 0) + 1
        return message

    async def _edit_message_reply_markup(self, params: dict[str, Any]) -> dict[str, Any] | bool:
        """editMessageReplyMarkup: replace (or with no reply_markup remove) a bot message's keyboard."""
        markup = params.get("reply_markup")
        _check_markup(markup)
        if params.get("inline_message_id"):
            return True
        _, entry = self._target(params, "message to edit not found")
        new_markup = markup if isinstance(markup, dict) and "inline_keyboard" in markup else None
        message: dict[str, Any] = entry["message"]
        if message.get("reply_markup") == new_markup:
            raise _bad(NOT_MODIFIED[len("Bad Request: ") :])
        if new_markup is None:
            message.pop("reply_markup", None)
            entry.pop("reply_markup", None)
        else:
            message["reply_markup"] = entry["reply_markup"] = new_markup
        message["edit_date"] = int(time.time())
        return message

    async def _send_message_draft(self, params: dict[str, Any]) -> bool:
        """sendMessageDraft (Bot API 9.3+): an ephemeral partial message in a private chat."""
        chat_id = self._chat_id(params)
        if not isinstance(chat_id, int) or chat_id <= 0:
            raise _bad("message drafts can be sent only to private chats")
        if _as_int(params.get("draft_id"), "draft_id") == 0:
            raise _bad("draft_id must be non-zero")
        self._message_text(params, allow_empty=True)
        self.drafts.append(params)
        return True

    async def _send_chat_action(self, params: dict[str, Any]) -> bool:
        """sendChatAction."""
        self._chat_id(params)
        if params.get("action") not in _CHAT_ACTIONS:
            raise _bad("wrong parameter action in request")
        self.chat_actions.append(params)
        return True

    @staticmethod
    def _scope_key(params: dict[str, Any]) -> str:
        """The storage key of a commands scope + language."""
        return json.dumps([params.get("scope") or {"type": "default"}, params.get("language_code") or ""])

    async def _set_my_commands(self, params: dict[str, Any]) -> bool:
        """setMyCommands with Telegram's command and description rules."""
        commands = params.get("commands")
        if not isinstance(commands, list) or len(commands) > 100:
            raise _bad("commands must be an array of at most 100 BotCommand")
        for command in commands:
            if not isinstance(command, dict) or not _COMMAND_RE.fullmatch(str(command.get("command", ""))):
                raise _bad("BOT_COMMAND_INVALID")
            description = command.get("description")
            if not isinstance(description, str) or not 1 <= len(description) <= 256:
                raise _bad("BOT_COMMAND_DESCRIPTION_INVALID")
        self._scoped_commands[self._scope_key(params)] = commands
        self.commands = commands
        return True

    async def _get_my_commands(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """getMyCommands for a scope + language."""
        return self._scoped_commands.get(self._scope_key(params), [])

    async def _delete_my_commands(self, params: dict[str, Any]) -> bool:
        """deleteMyCommands for a scope + language (also clears `commands`)."""
        self._scoped_commands.pop(self._scope_key(params), None)
        self.commands = None
        return True

    async def _answer_callback_query(self, params: dict[str, Any]) -> bool:
        """answerCallbackQuery: each pushed query can be answered once."""
        query_id = params.get("callback_query_id")
        if query_id not in self._open_callbacks:
            raise _bad(QUERY_TOO_OLD[len("Bad Request: ") :])
        text = params.get("text")
        if isinstance(text, str) and len(text) > 200:
            raise _bad("MESSAGE_TOO_LONG")
        self._open_callbacks.discard(str(query_id))
        self.callback_answers.append(params)
        return True

    async def _delete_message(self, params: dict[str, Any]) -> bool:
        """deleteMessage: the entry in `sent` gets "deleted": True."""
        chat_id = self._chat_id(params)
        message_id = params.get("message_id")
        key = (chat_id, message_id if isinstance(message_id, int) else -1)
        if key not in self._messages:
            raise _bad("message to delete not found")
        del self._messages[key]
        entry = self._outgoing.pop(key, None)
        if entry is not None:
            entry["deleted"] = True
        return True

    async def _get_file(self, params: dict[str, Any]) -> dict[str, Any]:
        """getFile: a registered file's File (400 for an unknown file_id and, without --local, over 20 MiB)."""
        stored = self._files.get(str(params.get("file_id") or ""))
        if stored is None:
            raise _bad(INVALID_FILE_ID[len("Bad Request: ") :])
        result: dict[str, Any] = {
            "file_id": stored.file_id,
            "file_unique_id": stored.file_unique_id,
            "file_size": len(stored.data),
        }
        if self._local is None:
            if len(stored.data) > MAX_DOWNLOAD_SIZE:
                raise _bad(FILE_TOO_BIG[len("Bad Request: ") :])
            return {**result, "file_path": stored.path}
        directory, shared = self._local
        where = directory / self.token / stored.path
        if shared:
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_bytes(stored.data)
        return {**result, "file_path": str(where)}

    # HTTP

    async def _serve_file(self, request: web.Request) -> web.StreamResponse:
        """GET /file/bot<token>/<file_path>: a registered file's bytes like api.telegram.org; 404 for a wrong token or
        path, and for everything in local_mode (a Bot API server never serves files itself)."""
        token, path = request.match_info["token"], request.match_info["path"]
        self.downloads.append((token, path))
        self._notify()
        stored = next((f for f in self._files.values() if f.path == path), None)
        if token != self.token or stored is None or self._local is not None:
            return self._error(_ApiError(404, "Not Found"))
        return web.Response(body=stored.data, content_type="application/octet-stream")

    async def _read_params(self, request: web.Request) -> dict[str, Any]:
        """Query string plus form-encoded, multipart or JSON body, decoded."""
        raw: dict[str, Any] = dict(request.query)
        if request.body_exists:
            if request.content_type == "application/json":
                body = await request.json()
                if not isinstance(body, dict):
                    raise _bad("parameters must be a JSON object")
                raw.update(body)
            else:
                form = await request.post()
                for k, v in form.items():
                    if isinstance(v, bytes | bytearray):
                        raw[k] = v.decode("utf-8", "replace")
                    elif isinstance(v, str):
                        raw[k] = v
                    else:  # an uploaded file (sendDocument): kept whole, so tests can read what the bot sent
                        raw[k] = Upload(v.filename, v.content_type, v.file.read())
        return {k: _decode_param(k, v) for k, v in raw.items()}

    def _flooded(self) -> int | None:
        """None when one more message passes the flood limits now (it is counted), else the whole seconds to wait."""
        if self.flood_limit is None and self.flood_bucket is None:
            return None
        most, window = self.flood_limit or (None, FLOOD_PEAK_WINDOW_S)
        now = self.flood_clock()
        while self._flood_log and self._flood_log[0] <= now - window:
            self._flood_log.popleft()
        waits = []
        if most is not None and len(self._flood_log) >= most:
            waits.append(self._flood_log[len(self._flood_log) - most] + window - now)
        if self.flood_bucket is not None:
            burst, rate = self.flood_bucket
            self._flood_tokens = min(burst, self._flood_tokens + (now - self._flood_at) * rate)
            self._flood_at = now
            if self._flood_tokens < 1:
                waits.append((1 - self._flood_tokens) / rate)
        if waits:
            return max(1, math.ceil(max(waits)))
        self._flood_tokens -= 1
        self._flood_log.append(now)
        self.flood_peak = max(self.flood_peak, len(self._flood_log))
        return None

    @staticmethod
    def _error(error: _ApiError) -> web.Response:
        """An ok=false answer."""
        body: dict[str, Any] = {"ok": False, "error_code": error.status, "description": error.description}
        if error.retry_after is not None:
            body["parameters"] = {"retry_after": error.retry_after}
        return web.json_response(body, status=error.status)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        """Route /bot<token>/<method> to a method handler."""
        m = re.fullmatch(r"/bot([^/]+)/([^/]+)", request.path)
        if m is None:
            return self._error(_ApiError(404, "Not Found"))
        if m[1] != self.token:
            return self._error(_ApiError(401, "Unauthorized"))
        method = m[2]
        try:
            params = await self._read_params(request)
        except (ValueError, _ApiError) as e:
            return self._error(e if isinstance(e, _ApiError) else _bad("can't parse request parameters"))
        self.calls.append((method, params))
        self._notify()
        key = method.lower()
        try:
            if key == "getupdates" and self._drops > 0:
                self._drops -= 1
                if request.transport is not None:
                    request.transport.abort()
                return web.Response(status=204)  # never reaches the client: the connection is gone
            refusal = self._refused.get(params.get("chat_id", "")) if key in _CHAT_METHODS else None
            if refusal is not None:
                return self._error(_ApiError(403 if refusal.startswith("Forbidden") else 400, refusal))
            failures = self._failures.get(key)
            if failures and self._passes.get(key, 0) > 0:
                self._passes[key] -= 1
            elif failures:
                f = failures.popleft()
                return self._error(_ApiError(f.status, f.description, f.retry_after))
            flooded = self._flooded() if key in FLOOD_METHODS else None
            if flooded is not None:
                self.flood_429s += 1
                return self._error(_ApiError(429, f"Too Many Requests: retry after {flooded}", flooded))
            handler = self._methods.get(key)
            if handler is None:
                return self._error(_ApiError(404, "Not Found: method not found"))
            try:
                result = await handler(params)
            except _ApiError as e:
                return self._error(e)
            if key == "getupdates":
                self.get_updates_ok += 1
            return web.json_response({"ok": True, "result": result})
        finally:
            self._notify()
