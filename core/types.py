"""Platform-neutral data that flows between adapters and the core."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from core.textsafe import clean_fields

ChatKind = Literal["private", "group"]
QuotedKind = Literal["forward", "quote", "reply", "job", "file", "photo"]
API = "api"  # the platform (chats.platform) of the HTTP API's sessions, and the `via` of its turns
JOB_MESSAGE_PREFIX = "job:"  # the platform message id of a scheduled agent job's turn starts with this


@dataclass(frozen=True)
class Quoted:
    """Someone else's text that came with a message; stored marked as foreign and replayed as quoted data.

    `forward`: a forwarded message (Telegram `forward_origin`, a Discord forward / message snapshot); `quote`: a
    quoted part of another message (Telegram `quote`); `reply`: a message from another chat replied to (Telegram
    `external_reply`); `file`: a document's text (its origin is the file's name; core/media/intake.py); `job`: the
    prompt of a scheduled job written in a turn that held others' text (set by the core only: such a turn runs without
    admin and memory tools)."""

    kind: QuotedKind
    origin: str  # who wrote it, as the platform names them ("Alice", "channel News", "a hidden user")
    text: str

    def __post_init__(self) -> None:
        """Nothing PostgreSQL cannot store (core/textsafe.py)."""
        clean_fields(self)


UploadKind = Literal["voice", "audio", "photo", "document", "sticker"]


@dataclass(frozen=True)
class Upload:
    """A file that came with a message, as its adapter fetched it: `data` None when it could not (`refused` says why,
    in one line); `platform_ref` is the platform's own reference to the file (kept, so nothing is lost). With `load`,
    not fetched yet: the core loads it only for a person who may use the bot, within their message rate."""

    kind: UploadKind
    name: str
    mime: str | None
    data: bytes | None
    platform_ref: str | None = None
    duration_s: float | None = None
    refused: str | None = None
    load: Callable[[], Awaitable[Upload]] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Nothing PostgreSQL cannot store in the file's name (core/textsafe.py)."""
        clean_fields(self)


@dataclass(frozen=True)
class Incoming:
    """One message from a platform, already translated by its adapter."""

    platform: str
    user_id: str
    chat_id: str
    text: str
    user_name: str = ""
    thread_id: str = ""
    chat_kind: ChatKind = "private"
    chat_title: str = ""
    message_id: str | None = None
    reply_to: str | None = None
    attachments: tuple[str, ...] = ()
    quoted: tuple[Quoted, ...] = ()  # others' text that came with it (forwards, quotes): never the speaker's words
    via: str = ""  # the front end that carried it when not the speaker's own platform ("api"): the chat is its
    model: str | None = None  # a model of LLM_MODELS asked for this message only (the HTTP API), else the account's
    uploads: tuple[Upload, ...] = ()  # files that came with it (voice notes, documents), fetched by the adapter
    language: str = ""  # the speaker's language as their platform tells it (IETF tag: de, pt-BR), if it does
    zone: str = ""  # the speaker's time zone as their platform tells it (Slack's profile): theirs until they set one

    def __post_init__(self) -> None:
        """Nothing PostgreSQL cannot store, from whichever front end (a NUL in a name must not stop a chat)."""
        clean_fields(self)

    @property
    def user_key(self) -> str:
        """`platform:user_id`, the form used by ADMINS and ALLOWED_USERS."""
        return f"{self.platform}:{self.user_id}"

    @property
    def chat_key(self) -> str:
        """A key unique per conversation (chat and thread)."""
        return f"{self.chat_platform}:{self.chat_id}:{self.thread_id}"

    @property
    def chat_platform(self) -> str:
        """The platform of the chat: the speaker's, or the front end that carried the message."""
        return self.via or self.platform


@dataclass(frozen=True)
class Step:
    """One tool call of a turn and its outcome, as shown in the activity part of a reply."""

    name: str
    arguments: dict[str, Any]
    ok: bool
    outcome: str
    duration_s: float
    error_code: str | None = None


@dataclass(frozen=True)
class UserRef:
    """The speaking user, as known from the platform (never from the model): `account_id` owns their tasks, memory,
    time zone and usage (one person across platforms); `id` is this platform identity (`users.id`), who spoke."""

    account_id: int
    id: int
    platform: str
    platform_user_id: str
    display_name: str
    timezone: str
    model: str | None = None  # the account's /model choice as stored (None: the default; checked against LLM_MODELS)


@dataclass(frozen=True)
class Bearer:
    """Whom an API token or a web sign-in acts as: its identity (admin rights are the identity's) and that identity's
    account now (core/accounts/api_tokens.py, core/accounts/web_signin.py)."""

    token_id: int  # the API token's id (0: a web sign-in)
    name: str  # the token's name ("web": a web sign-in)
    identity_id: int
    account_id: int
    platform: str
    platform_user_id: str
    display_name: str

    @property
    def user_key(self) -> str:
        """`platform:id`, the form used by ADMINS and ALLOWED_USERS."""
        return f"{self.platform}:{self.platform_user_id}"


@dataclass(frozen=True)
class ChatRef:
    """The conversation the turn belongs to."""

    id: int
    platform: str
    platform_chat_id: str
    thread_id: str
    kind: str
    history_floor: int = 0


@dataclass(frozen=True)
class AssistantDelta:
    """A piece of the answer text while it streams."""

    text: str
    type: Literal["assistant_delta"] = "assistant_delta"


@dataclass(frozen=True)
class ToolCall:
    """The model asked for a tool call (about to run)."""

    call_id: str
    name: str
    arguments: str
    type: Literal["tool_call"] = "tool_call"


@dataclass(frozen=True)
class ModelToolCalls:
    """The model's reply of one step asked for tool calls (`calls` in the API's shape; the journal stores it)."""

    content: str | None
    calls: tuple[dict[str, Any], ...]
    type: Literal["model_tool_calls"] = "model_tool_calls"


@dataclass(frozen=True)
class Source:
    """A web page a turn saw: fetched (`read`), or only listed by a search (cited when the answer names its URL)."""

    url: str
    title: str
    read: bool


@dataclass(frozen=True)
class ToolResult:
    """A tool call finished; `envelope` is exactly what the model sees (before truncation)."""

    call_id: str
    step: Step
    envelope: dict[str, Any]
    foreign: bool = False  # the result brought in others' text (marked so later turns treat it as quoted data)
    type: Literal["tool_result"] = "tool_result"


@dataclass(frozen=True)
class Tokens:
    """The tokens of a turn's model calls, summed as their servers reported them (`cached`: of the prompt's)."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0


@dataclass(frozen=True)
class Ask:
    """A call the turn parked until the person allows it (an untrusted MCP server's tool that changes things): its
    button ("Allow mail: send_email") presses `/mcp allow <id>` for them."""

    id: int
    label: str


@dataclass(frozen=True)
class Assistant:
    """The final answer of a turn, with its activity."""

    text: str
    turn_id: int | None
    steps: tuple[Step, ...] = ()
    elapsed_s: float = 0.0
    cut_short: str | None = None
    sent_parts: int = 0  # a stored answer sent again: how many of its parts the platform already has
    tokens: Tokens | None = None  # what the turn's model calls used (None: not counted, e.g. an answer sent again)
    asks: tuple[Ask, ...] = ()  # calls waiting for the person's OK: a button each (core/mcp_servers/confirm.py)
    type: Literal["assistant"] = "assistant"


@dataclass(frozen=True)
class Error:
    """The turn could not be answered; `message` is meant for the user."""

    code: str
    message: str
    turn_id: int | None = None
    steps: tuple[Step, ...] = field(default=())
    type: Literal["error"] = "error"


@dataclass(frozen=True)
class Spoken:
    """The answer read aloud (after its Assistant, when the person sent a voice note and has /voice on): OGG/Opus."""

    turn_id: int | None
    data: bytes
    mime: str = "audio/ogg"
    type: Literal["spoken"] = "spoken"


Event = AssistantDelta | ModelToolCalls | ToolCall | ToolResult | Assistant | Error | Spoken


@dataclass(frozen=True)
class TurnSteps:
    """A stored turn's tool activity, with who asked and where (for the "Show steps" button)."""

    turn_id: int
    platform: str
    user_id: str  # the platform id of the user whose message started the turn
    chat_id: str
    thread_id: str
    steps: tuple[Step, ...]
    elapsed_s: float
