"""/openapi.json as the server behaves: FastAPI's document from the request and response models, made true where
FastAPI cannot know better — the bearer token as the security scheme, each operation's real error answers (all in
the one error shape; FastAPI's 422 is never sent, a request it refuses is a 400), `model` as the names on offer
(LLM_MODELS), and the events of each event stream (a schema per event, as OpenAPI 3.1 has `text/event-stream`)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from adapters.http.models import SESSION_EVENTS, ErrorBody
from adapters.http.openai_models import CompletionUsage
from adapters.http.sse import EVENT_STREAM

REF = "#/components/schemas/{model}"
JSON = "application/json"
SECURITY = "bearer"
MODEL_FIELDS = {"NewMessage": "model", "OneShot": "model", "ChatRequest": "model"}  # the names on offer
WITH_SESSION = frozenset({"/v1/chat/completions"})  # X-Session-Id names a session: 404 when not the caller's
FOUND_OR_404 = ("{session_id}", "{artifact_id}", "{model_id}")  # path parameters that name something of the caller's
ERROR_TEXTS = {
    400: "The request is not what the operation takes (its fields, values, files); the message says which.",
    401: "No token, or a wrong or revoked one (or the web sign-in ended).",
    403: "The person may no longer use the bot (ALLOWED_USERS), or a web page's change lacks its CSRF token.",
    404: "Not the caller's, or none such (the same answer for both).",
    413: "The body is larger than the operation takes.",
    429: "Too many requests a minute (Retry-After says when to try again).",
}


class ChunkDelta(BaseModel):
    """What a chunk adds to the answer."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    """The one choice of a chunk."""

    index: int = 0
    delta: ChunkDelta
    finish_reason: Literal["stop"] | None = None


class ChatCompletionChunk(BaseModel):
    """One event of a streamed chat completion (OpenAI's shape); with `include_usage` the last one has no choices
    and the turn's `usage`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None


def event(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """One kind of Server-Sent Event: its `event` name, and its `data`."""
    return {"properties": {"event": {"const": name}, "data": data}}


def json_data(model: str) -> dict[str, Any]:
    """An event's data: one line of JSON of the component `model`."""
    return {"contentMediaType": JSON, "contentSchema": {"$ref": REF.format(model=model)}}


SESSION_STREAM: dict[str, Any] = {
    "title": "SessionEvent",
    "description": "An event of an answer's stream; its `id` (`<message id>:<n>`) resumes with Last-Event-ID. A "
    "`: keep-alive` comment comes every 15 s while the model thinks.",
    "type": "object",
    "required": ["event", "data"],
    "properties": {"event": {"enum": list(dict.fromkeys(SESSION_EVENTS))}, "data": {"type": "string"}, "id": {}},
    "oneOf": [event(name, json_data(model.__name__)) for name, model in SESSION_EVENTS.items()],
}
CHUNK_STREAM: dict[str, Any] = {
    "title": "ChatCompletionEvent",
    "description": "A `data:` line: a chat.completion.chunk as JSON, and `[DONE]` last.",
    "type": "object",
    "required": ["data"],
    "properties": {
        "event": {"const": "message"},
        "data": {"type": "string", "anyOf": [{"const": "[DONE]"}, json_data(ChatCompletionChunk.__name__)]},
    },
}


def describe(app: FastAPI, models: tuple[str, ...]) -> None:
    """Make `app` answer /openapi.json with the true document (built once, on its first request); `models`: the
    names a message's `model` may be."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = corrected(generate(), models)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the document


def corrected(doc: dict[str, Any], models: tuple[str, ...]) -> dict[str, Any]:
    """FastAPI's document `doc`, made true (see the module's docstring)."""
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    for gone in ("HTTPValidationError", "ValidationError"):
        schemas.pop(gone, None)
    shown: list[type[BaseModel]] = [*SESSION_EVENTS.values(), ChatCompletionChunk]
    _, defs = models_json_schema([(m, "serialization") for m in shown], ref_template=REF)
    schemas.update(defs.get("$defs", {}))
    doc["components"]["securitySchemes"] = {
        SECURITY: {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from /token new <name> in a private chat with the bot (or `bot token`). The web "
            "page signs in with a cookie instead, and sends its CSRF token as X-CSRF-Token with every change.",
        }
    }
    doc["security"] = [{SECURITY: []}]
    for path, operations in doc.get("paths", {}).items():
        for operation in operations.values():
            _answers(path, operation)
    for name, field in MODEL_FIELDS.items():
        if name in schemas:
            _offered(schemas[name]["properties"][field], models)
    return doc


def _answers(path: str, operation: dict[str, Any]) -> None:
    """An operation's responses as the server gives them: its errors, and its event stream's events."""
    responses: dict[str, Any] = operation["responses"]
    for gone in [c for c in responses if c.isdecimal() and int(c) >= 400]:
        del responses[gone]
    has_body = "requestBody" in operation
    params = operation.get("parameters", [])
    codes = [401, 403, 429]
    codes += [400] if has_body or any(_can_fail(p.get("schema", {})) for p in params) else []
    codes += [404] if any(p in path for p in FOUND_OR_404) or path in WITH_SESSION else []
    codes += [413] if has_body else []
    body = {"content": {JSON: {"schema": {"$ref": REF.format(model=ErrorBody.__name__)}}}}
    for code in sorted(codes):
        responses[str(code)] = {"description": ERROR_TEXTS[code], **body}
    content = responses.get("200", {}).get("content", {})
    if EVENT_STREAM in content:
        content[EVENT_STREAM] = {"schema": CHUNK_STREAM if path == "/v1/chat/completions" else SESSION_STREAM}
        if content.get(JSON, {}).get("schema") == {}:  # no JSON answer, only the events
            del content[JSON]


def _offered(prop: dict[str, Any], models: tuple[str, ...]) -> None:
    """A `model` field's string as one of the names on offer."""
    for schema in [prop, *prop.get("anyOf", [])]:
        if schema.get("type") == "string":
            schema["enum"] = list(models)


def _can_fail(schema: dict[str, Any]) -> bool:
    """Whether a parameter's value can be refused (400): anything but a plain string."""
    plain = {"type", "title", "description", "default"}
    for one in schema.get("anyOf", [schema]):
        if one.get("type") not in ("string", "null") or set(one) - plain:
            return True
    return False
