"""The shapes of POST /v1/chat/completions (adapters/http/openai_compat.py) as OpenAI's API has them: the request,
with the rules a message's content follows stated in its schema, and the whole answer."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.http.limits import HTTP_UPLOAD_MAX_FILES
from adapters.http.models import BASE64, SPACE, VISIBLE

# The rules every message's content follows, described here and checked by openai_compat.check_message (for every
# message, not only the last user message that is answered: a description cannot say "the last one", so the server
# does not either). A part with something to say: text, or a file; a file part: its data a base64 data: URL (links
# are not fetched), an audio format a short name; at most HTTP_UPLOAD_MAX_FILES files in one message.
DATA_URL = rf"^data:[^,]*;{SPACE}*[Bb][Aa][Ss][Ee]64{SPACE}*(?:;[^,]*)?," + BASE64.removeprefix("^")
AUDIO_FORMAT = rf"^{SPACE}*[A-Za-z0-9]{{1,10}}{SPACE}*$"
_NOT_NULL: dict[str, Any] = {"not": {"type": "null"}}
FILE_PART: dict[str, Any] = {
    "anyOf": [
        {"required": ["type", kind], "properties": {"type": {"const": kind}, kind: _NOT_NULL}}
        for kind in ("image_url", "input_audio", "file")
    ]
}
SAYS_SOMETHING: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": VISIBLE},
        {
            "type": "array",
            "contains": {
                "anyOf": [
                    {"required": ["text"], "properties": {"text": {"type": "string", "pattern": VISIBLE}}},
                    FILE_PART,
                ]
            },
        },
    ]
}
PART_RULES: dict[str, Any] = {
    "allOf": [
        {
            "if": {"required": ["type"], "properties": {"type": {"const": "image_url"}}},
            "then": {
                "properties": {
                    "image_url": {
                        "anyOf": [
                            {"type": "null"},
                            {"type": "string", "pattern": DATA_URL},
                            {
                                "type": "object",
                                "required": ["url"],
                                "properties": {"url": {"type": "string", "pattern": DATA_URL}},
                            },
                        ]
                    }
                }
            },
        },
        {
            "if": {"required": ["type"], "properties": {"type": {"const": "input_audio"}}},
            "then": {
                "properties": {
                    "input_audio": {
                        "anyOf": [
                            {"type": "null"},
                            {
                                "type": "object",
                                "required": ["data", "format"],
                                "properties": {
                                    "data": {"type": "string", "pattern": BASE64},
                                    "format": {"type": "string", "pattern": AUDIO_FORMAT},
                                },
                            },
                        ]
                    }
                }
            },
        },
        {
            "if": {"required": ["type"], "properties": {"type": {"const": "file"}}},
            "then": {
                "properties": {
                    "file": {
                        "anyOf": [
                            {"type": "null"},
                            {
                                "type": "object",
                                "required": ["file_data"],
                                "properties": {"file_data": {"type": "string", "pattern": DATA_URL}},
                            },
                        ]
                    }
                }
            },
        },
    ]
}
MESSAGE_RULES: dict[str, Any] = {
    "allOf": [
        {
            "if": {"required": ["role"], "properties": {"role": {"const": "user"}}},
            "then": {"required": ["content"], "properties": {"content": SAYS_SOMETHING}},
        },
        {
            "properties": {
                "content": {
                    "if": {"type": "array"},
                    "then": {"contains": FILE_PART, "minContains": 0, "maxContains": HTTP_UPLOAD_MAX_FILES},
                }
            }
        },
    ]
}
# what `messages` must hold: a user message (the last one is answered)
SAID_BY_USER: dict[str, Any] = {"required": ["role"], "properties": {"role": {"const": "user"}}}


class Lenient(BaseModel):
    """A part of a client's request: fields the bot does not use (temperature, tools, user…) are ignored."""

    model_config = ConfigDict(extra="allow")


class ImageUrl(Lenient):
    """An image_url part's image: a `data:` URL (links are not fetched)."""

    url: str


class InputAudio(Lenient):
    """An input_audio part's audio: base64 data and its format."""

    data: str
    format: str


class FileData(Lenient):
    """A file part's file: its name and a `data:` URL."""

    filename: str | None = None
    file_data: str | None = None
    file_id: str | None = None


class ContentPart(Lenient):
    """A part of a message's content: `text`, and of the last user message also `image_url` (a data: URL, a photo),
    `input_audio` (transcribed) and `file` (file_data as a data: URL; a document is read)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=PART_RULES)

    type: str
    text: str | None = None
    image_url: ImageUrl | str | None = None
    input_audio: InputAudio | None = None
    file: FileData | None = None


class ChatMessage(Lenient):
    """A message of the conversation as the client has it."""

    model_config = ConfigDict(extra="allow", json_schema_extra=MESSAGE_RULES)

    role: str
    content: str | list[ContentPart] | None = None


class StreamOptions(Lenient):
    """What a stream adds."""

    include_usage: bool = False


class ChatRequest(Lenient):
    """POST /v1/chat/completions (OpenAI's shape; only the last user message is read)."""

    model: str = Field(description="One of GET /v1/models (LLM_MODELS).")
    messages: list[ChatMessage] = Field(
        min_length=1,
        description="The last user message is the turn: its text, or a file.",
        json_schema_extra={"contains": SAID_BY_USER},
    )
    stream: bool = False
    stream_options: StreamOptions | None = None


class CompletionUsage(BaseModel):
    """The tokens the turn's model calls used (every step of it, not one call)."""

    class PromptDetails(BaseModel):
        """Of the prompt's tokens."""

        cached_tokens: int = 0

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptDetails


class AnswerMessage(BaseModel):
    """The answer: its text, with the tool steps as <details> blocks."""

    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    """The one choice."""

    index: int = 0
    message: AnswerMessage
    finish_reason: Literal["stop"] = "stop"


class ChatCompletion(BaseModel):
    """The whole answer (without `stream`)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
