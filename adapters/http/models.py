"""The HTTP API's shapes: pydantic models that validate requests and, through FastAPI, generate /openapi.json."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from adapters.http.limits import HTTP_UPLOAD_MAX_FILES, PRESS_CHARS
from core import ApiMessage, ApiSession, ButtonStyle, ErrorPart, Part, TextPart, ToolCallPart, ToolResultPart, pack

# White space as JSON Schema's regular expressions (ECMA-262 `\s`) count it, and so as the server counts it where the
# description says what it takes (Python's `\s` and str.strip() take a few more characters, such as U+001C and U+0085)
SPACE_CHARS = (
    "\t\n\v\f\r \u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
SPACE = "[" + "".join(f"\\u{ord(c):04x}" for c in SPACE_CHARS) + "]"  # a class both regex dialects read
VISIBLE = "[^" + SPACE.removeprefix("[")  # a character that is no white space
_B64 = rf"[A-Za-z0-9+/]{SPACE}*"
_LAST = rf"(?:{_B64}){{4}}|(?:{_B64}){{3}}={SPACE}*|(?:{_B64}){{2}}={SPACE}*={SPACE}*"  # the last 4 (padded) characters
BASE64 = rf"^{SPACE}*(?:(?:{_B64}){{4}})*(?:{_LAST})$"  # 1 byte or more


class Strict(BaseModel):
    """A request body: unknown fields are refused (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid")


class NewSession(Strict):
    """POST /v1/sessions."""

    title: str | None = Field(default=None, max_length=1000, description="Cut to one line of 120 characters.")


class TextPartIn(Strict):
    """Text the person says."""

    type: Literal["text"]
    text: str


class FilePartIn(Strict):
    """A file sent with the message, as Telegram takes them: audio is transcribed (its transcript is the person's
    words), a photo is looked at, a document's text is read (its first page goes into the message)."""

    type: Literal["file"]
    name: str = Field(min_length=1, max_length=255, description="The file's name (its extension tells its type).")
    mime: str | None = Field(
        default=None,
        max_length=255,
        description="Its media type (guessed from the name when left out): audio/* is audio (audio/ogg, audio/opus "
        "and audio/webm a voice note), image/* a photo, anything else a document.",
    )
    data: str = Field(
        min_length=1,
        description="The file's bytes, base64-encoded (line breaks and spaces between are fine).",
        json_schema_extra={"contentEncoding": "base64", "pattern": BASE64},
    )


PartIn = Annotated[TextPartIn | FilePartIn, Field(discriminator="type")]
SAYS_SOMETHING = {"anyOf": [{"properties": {"type": {"const": "file"}}}, {"properties": {"text": {"pattern": r"\S"}}}]}
FILES = {
    "contains": {"properties": {"type": {"const": "file"}}},
    "minContains": 0,
    "maxContains": HTTP_UPLOAD_MAX_FILES,
}
Said = (
    Annotated[str, Field(min_length=1)]
    | Annotated[
        list[PartIn],  # a file, or some text; at most HTTP_UPLOAD_MAX_FILES files (else 400)
        Field(min_length=1, json_schema_extra={"allOf": [{"contains": SAYS_SOMETHING}, FILES]}),
    ]
)


class NewMessage(Strict):
    """POST /v1/sessions/{id}/messages."""

    content: Said = Field(
        description="What the person says (at most MAX_MESSAGE_CHARS): text, or a list of text and file parts "
        "(at most HTTP_UPLOAD_MAX_FILES files of HTTP_UPLOAD_MAX_BYTES in all)."
    )
    model: str | None = Field(default=None, description="One of GET /v1/models; default: the account's /model.")


class OneShot(Strict):
    """POST /v1/one-shot: a fresh session, one answer."""

    prompt: Said = Field(description="Text, or a list of text and file parts, as a message's `content`.")
    model: str | None = None


class ErrorBody(BaseModel):
    """`{"error": {"type", "message"}}`, the shape of every error."""

    class Detail(BaseModel):
        """What went wrong, in one line."""

        type: str
        message: str

    error: Detail


class SessionOut(BaseModel):
    """A session (a conversation)."""

    id: str
    title: str
    created_at: datetime
    last_active_at: datetime | None

    @classmethod
    def of(cls, s: ApiSession) -> SessionOut:
        """From the core's session."""
        return cls(id=s.id, title=s.title, created_at=s.created_at, last_active_at=s.last_active_at)


class SessionList(BaseModel):
    """GET /v1/sessions."""

    sessions: list[SessionOut]


class TextPartOut(BaseModel):
    """Text."""

    type: Literal["text"] = "text"
    text: str


class ToolCallPartOut(BaseModel):
    """A tool the model called."""

    type: Literal["tool_call"] = "tool_call"
    call_id: str
    name: str
    args: dict[str, Any]
    started_at: datetime


class ToolResultPartOut(BaseModel):
    """A tool call's outcome; `result` is cut when `artifact` is set (GET /v1/artifacts/{artifact} has it whole)."""

    type: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    ok: bool
    result: str
    finished_at: datetime
    artifact: str | None = None


class ErrorPartOut(BaseModel):
    """Why the answer stopped."""

    type: Literal["error"] = "error"
    code: str
    message: str


PartOut = Annotated[TextPartOut | ToolCallPartOut | ToolResultPartOut | ErrorPartOut, Field(discriminator="type")]


def part_out(p: Part) -> TextPartOut | ToolCallPartOut | ToolResultPartOut | ErrorPartOut:
    """A core part in the API's shape."""
    if isinstance(p, TextPart):
        return TextPartOut(text=p.text)
    if isinstance(p, ToolCallPart):
        return ToolCallPartOut(call_id=p.call_id, name=p.name, args=p.args, started_at=p.started_at)
    if isinstance(p, ToolResultPart):
        return ToolResultPartOut(
            call_id=p.call_id, name=p.name, ok=p.ok, result=p.result, finished_at=p.finished_at, artifact=p.artifact
        )
    assert isinstance(p, ErrorPart)
    return ErrorPartOut(code=p.code, message=p.message)


ButtonAction = Literal["done", "snooze10", "snooze60", "undo"]


class ButtonOut(BaseModel):
    """A button under a message: POST /v1/sessions/{session_id}/messages/{message_id}/press with its `task_id` and
    `action` presses it (Done, Snooze 10 min or 1 h under a reminder, Undo under /remind's answer)."""

    label: str
    task_id: int
    action: ButtonAction


class ChoiceOut(BaseModel):
    """A button of a confirmation or a choice under a command's answer (wipe my memory, a model): POST
    /v1/sessions/{session_id}/messages/{message_id}/press with its `press` runs the command again for the caller."""

    label: str
    press: str = Field(description="What the button does, as the press body's `press` takes it.")
    style: ButtonStyle = Field(default="secondary", description="danger: it deletes something for good.")


class MessageOut(BaseModel):
    """A message with its parts: the person's, an answer (with its status), or a reminder; with the buttons under it
    (a reminder's until one was pressed, then its text says what that did) and a command's confirmation or choice
    (`choices`, until one was pressed)."""

    id: str
    session_id: str
    role: Literal["user", "assistant", "reminder"]
    status: Literal["running", "done", "cut_short", "failed"]
    created_at: datetime
    parts: list[PartOut]
    buttons: list[ButtonOut] = []
    choices: list[ChoiceOut] = []

    @classmethod
    def of(cls, m: ApiMessage, session_id: str) -> MessageOut:
        """From the core's message."""
        parts = [part_out(p) for p in m.parts]
        buttons = [ButtonOut(label=b.label, task_id=b.task_id, action=cast(ButtonAction, b.action)) for b in m.buttons]
        choices = [ChoiceOut(label=c.label, press=pack(c.press), style=c.style) for c in m.choices]
        return cls(
            id=m.id,
            session_id=session_id,
            role=m.role,
            status=m.status,
            created_at=m.created_at,
            parts=parts,
            buttons=buttons,
            choices=choices,
        )


class Press(Strict):
    """POST /v1/sessions/{session_id}/messages/{message_id}/press: one of the message's buttons."""

    task_id: int = Field(ge=1, le=2**53 - 1)  # exact in JSON numbers as every client reads them
    action: ButtonAction


class PressChoice(Strict):
    """POST /v1/sessions/{session_id}/messages/{message_id}/press: one of the message's choices."""

    press: str = Field(min_length=1, max_length=PRESS_CHARS, description="The choice's `press`.")


class MessagePage(BaseModel):
    """GET /v1/sessions/{id}/messages: oldest first; `before` fetches the page before this one (null: none)."""

    messages: list[MessageOut]
    before: str | None


class Artifact(BaseModel):
    """A whole tool result."""

    id: str
    name: str
    content: str


class TextAnswer(BaseModel):
    """The reset, wipe, allow and press actions: the chats' own answer, as Markdown."""

    text: str


class TaskOut(BaseModel):
    """An open task: its next time in UTC and in the person's zone (null: none), how it repeats (null: once)."""

    id: int
    title: str
    state: Literal["pending", "in_progress"]
    kind: Literal["reminder", "agent"] = Field(description="reminder: fixed text; agent: a job the model runs")
    due_at: datetime | None = Field(description="The next time, in UTC.")
    due_local: datetime | None = Field(description="The same time in the person's zone, with its offset.")
    recurrence: str | None = Field(description="As /tasks says it, e.g. `every mon-fri at 08:00`.")
    overdue: bool


class TaskListOut(BaseModel):
    """GET /v1/tasks: the person's open tasks, soonest first; `text` is /tasks's answer as Markdown."""

    text: str
    timezone: str = Field(description="The person's IANA zone, e.g. Europe/Berlin.")
    tasks: list[TaskOut]


class MemoryBlockOut(BaseModel):
    """A core memory block: line n (as /memory forget <block> <n> takes it) is `lines[n-1]`."""

    name: str
    description: str
    lines: list[str]
    words: int


class MemoryOut(BaseModel):
    """GET /v1/memory: what the bot remembers about the person; `text` is /memory's answer as Markdown."""

    text: str
    blocks: list[MemoryBlockOut]
    word_limit: int = Field(description="Words a block may hold (MEMORY_BLOCK_WORDS).")
    archival: int = Field(description="Archival notes kept.")
    files: int = Field(description="Files the person sent that are kept.")


class Me(BaseModel):
    """GET /v1/me: whom the request acts as; `csrf` only for the web page's sign-in (send it as X-CSRF-Token)."""

    identity: str = Field(description="platform:id, the form of ADMINS and ALLOWED_USERS")
    display_name: str
    csrf: str | None = None


class Model(BaseModel):
    """A model the bot offers (OpenAI's shape)."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "assistant-bot"


class ModelList(BaseModel):
    """GET /v1/models."""

    object: Literal["list"] = "list"
    data: list[Model]


class MessageEvent(BaseModel):
    """The data of `message.created` (the person's message, then the answer, running) and `message.completed` (the
    answer as GET …/messages has it)."""

    message: MessageOut


class DeltaEvent(BaseModel):
    """The data of `message.part.delta`: text the model wrote, added to the answer's part `part`."""

    message_id: str
    part: int
    type: Literal["text"] = "text"
    delta: str


class ToolCallEvent(ToolCallPartOut):
    """The data of `tool.call`: the answer's new part `part`."""

    message_id: str
    part: int


class ToolResultEvent(ToolResultPartOut):
    """The data of `tool.result`: the answer's new part `part`."""

    message_id: str
    part: int


class ErrorEvent(BaseModel):
    """The data of `error`: why the answer stopped (its part `part`), or that the message named is unknown."""

    message_id: str | None = None
    part: int | None = None
    error: ErrorBody.Detail


SESSION_EVENTS: dict[str, type[BaseModel]] = {
    "message.created": MessageEvent,
    "message.part.delta": DeltaEvent,
    "tool.call": ToolCallEvent,
    "tool.result": ToolResultEvent,
    "error": ErrorEvent,
    "message.completed": MessageEvent,
}
