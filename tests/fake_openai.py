"""In-process fake OpenAI-compatible Chat Completions server for tests."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

from tests.loopback import LoopbackServer

__all__ = ["FakeOpenAI", "Reply", "Responder", "Upload", "speech_audio"]

MODEL_ID = "fake-model"
EMBEDDING_DIMENSIONS = 16
TRANSCRIPT = "fake transcript"  # what /audio/transcriptions hears when nothing else is scripted
# The first page of an OGG/Opus stream (capture pattern, beginning-of-stream, one 19-byte OpusHead segment: mono,
# 48 kHz); /audio/speech answers it followed by the input text, so a test can tell what was spoken.
OGG_OPUS_HEAD = (
    b"OggS\x00\x02"
    + bytes(8)
    + b"fake"
    + bytes(8)
    + b"\x01\x13"
    + b"OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00"
    + bytes(3)
)


def speech_audio(text: str) -> bytes:
    """The bytes /audio/speech answers for `text`."""
    return OGG_OPUS_HEAD + text.encode()


def hashed_embedding(text: str) -> list[float]:
    """A deterministic unit vector from the text's words (same words → same vector; no semantics)."""
    import hashlib

    vec = [0.0] * EMBEDDING_DIMENSIONS
    for word in text.lower().split():
        vec[hashlib.sha256(word.encode()).digest()[0] % EMBEDDING_DIMENSIONS] += 1.0
    norm = sum(v * v for v in vec) ** 0.5 or 1.0
    return [v / norm for v in vec]


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "model_not_found"),
    408: ("timeout_error", None),
    409: ("conflict_error", None),
    429: ("requests", "rate_limit_exceeded"),
}


@dataclass
class Reply:
    """One scripted response of the fake model."""

    text: str | None = None  # assistant content (or the error message when status != 200)
    # (function name, arguments): a dict is json.dumps'ed, a str is sent verbatim (e.g. invalid JSON)
    tool_calls: list[tuple[str, str | dict[str, Any]]] = field(default_factory=list)
    status: int = 200  # non-200 -> OpenAI-style error body with this status (429 adds retry-after: 0)
    delay: float = 0.0  # seconds to asyncio.sleep before answering
    raw: dict[str, Any] | None = None  # sent verbatim as the JSON body / only SSE chunk
    finish_reason: str | None = None  # overrides "stop"/"tool_calls" (e.g. "length" for a cut answer)
    # streamed replies: `data:` payloads written verbatim before the finishing chunk (e.g. "{not json");
    # a whole reply's body is the first of them instead, sent as application/json
    bad_sse: list[str] = field(default_factory=list)
    # the usage reported (e.g. {"prompt_tokens": 900, "completion_tokens": 100, "prompt_tokens_details":
    # {"cached_tokens": 512}}; total_tokens is added); None: estimated from the request and the reply
    usage: dict[str, Any] | None = None


Responder = Callable[[dict[str, Any]], Reply | Awaitable[Reply]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Upload:
    """One file /audio/transcriptions received: as the multipart form carried it, with the form's other fields."""

    filename: str | None
    content_type: str | None
    data: bytes
    model: str | None
    fields: dict[str, str]
    key: str | None  # the Bearer token the request came with (None: no Authorization header)


class _InvalidRequest(Exception):
    """A request the real API would reject with 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        """Store the error message and offending parameter."""
        super().__init__(message)
        self.message = message
        self.param = param


def _error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """Build an OpenAI-style error body for a status code."""
    err_type, code = _ERROR_TYPES.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def _validate(body: dict[str, Any]) -> None:
    """Raise _InvalidRequest where the real API would answer 400."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _InvalidRequest("you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _InvalidRequest("'messages' must be a non-empty array", "messages")
    expected: set[str] | None = None  # ids of the assistant tool_calls the current tool run may answer
    pending: set[str] = set()  # ids not yet answered
    pending_at = -1
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise _InvalidRequest(f"Invalid type for 'messages[{i}]': expected an object.", f"messages.[{i}]")
        role = msg.get("role")
        if role not in _ROLES:
            raise _InvalidRequest(
                f"Invalid value: {role!r}. Supported values are: 'system', 'assistant', 'user', "
                "'tool', 'function', and 'developer'.",
                f"messages.[{i}].role",
            )
        if role == "tool":
            if expected is None:
                raise _InvalidRequest(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                    "message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str):
                raise _InvalidRequest(
                    f"Missing required parameter: 'messages.[{i}].tool_call_id'.",
                    f"messages.[{i}].tool_call_id",
                )
            if call_id not in expected:
                raise _InvalidRequest(
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in 'tool_calls' of previous message.",
                    f"messages.[{i}].tool_call_id",
                )
            if call_id not in pending:
                raise _InvalidRequest(
                    f"Invalid parameter: duplicate tool message for 'tool_call_id' of '{call_id}'.",
                    f"messages.[{i}].tool_call_id",
                )
            pending.discard(call_id)
            continue
        if pending:
            raise _missing_results(pending_at, pending)
        expected = None
        if role == "assistant" and msg.get("tool_calls"):
            ids = _tool_call_ids(i, msg["tool_calls"])
            expected, pending, pending_at = set(ids), set(ids), i
    if pending:
        raise _missing_results(pending_at, pending)


def _tool_call_ids(i: int, tool_calls: Any) -> list[str]:
    """Return the ids of an assistant message's tool calls, checking their shape."""
    if not isinstance(tool_calls, list):
        raise _InvalidRequest(f"Invalid type for 'messages[{i}].tool_calls': expected an array.")
    ids: list[str] = []
    for j, call in enumerate(tool_calls):
        where = f"messages.[{i}].tool_calls.[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            raise _InvalidRequest(f"Missing required parameter: '{where}.id'.", f"{where}.id")
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _InvalidRequest(f"Missing required parameter: '{where}.function.name'.", f"{where}.function")
        if call["id"] in ids:
            raise _InvalidRequest(f"Invalid parameter: duplicate tool call id '{call['id']}'.", f"{where}.id")
        ids.append(call["id"])
    return ids


def _missing_results(index: int, pending: set[str]) -> _InvalidRequest:
    """Build the error for an assistant message whose tool calls lack results."""
    return _InvalidRequest(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        "'tool_call_id'. The following tool_call_ids did not have response messages: " + ", ".join(sorted(pending)),
        f"messages.[{index}].role",
    )


def _bearer(request: web.Request) -> str | None:
    """The token of a request's `Authorization: Bearer …` header (None: it has none)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def _split(s: str, parts: int) -> list[str]:
    """Split s into at most `parts` non-empty consecutive pieces."""
    if not s:
        return []
    size = -(-len(s) // parts)
    return [s[k : k + size] for k in range(0, len(s), size)]


def _tokens(s: str) -> int:
    """Crudely estimate a token count."""
    return max(1, len(s) // 4) if s else 0


class FakeOpenAI(LoopbackServer):
    """A scripted fake OpenAI Chat Completions server on 127.0.0.1."""

    def __init__(self, *, default: Reply | Responder | None = None) -> None:
        """Create the server; `default` answers when the script queue is empty."""
        self.default = default
        self.requests: list[dict[str, Any]] = []
        self._queue: deque[Reply | Responder] = deque()
        self._call_ids = itertools.count(1)
        self._completion_ids = itertools.count(1)
        self._down = False
        self._inflight: set[asyncio.Task[Any]] = set()
        super().__init__()
        self._app.router.add_post("/v1/chat/completions", self._chat)
        self._app.router.add_get("/v1/models", self._models)
        self._app.router.add_post("/v1/embeddings", self._embeddings)
        self.embedding_inputs: list[str] = []
        self.embed: Callable[[str], list[float]] = hashed_embedding  # a test may map texts to chosen vectors
        self.embeddings_fail = False  # answer /embeddings with a 500
        self.send_usage = True  # False: like a server that reports no usage (not even when a stream asks for it)
        self._app.router.add_post("/v1/audio/transcriptions", self._tracked(self._transcriptions))
        self._app.router.add_post("/v1/audio/speech", self._tracked(self._speech))
        self.uploads: list[Upload] = []  # every file /audio/transcriptions received, in order
        self.transcript = Reply(text=TRANSCRIPT)  # its answer when none is scripted (status != 200: an error)
        self._transcripts: deque[Reply] = deque()
        self.speech_requests: list[dict[str, Any]] = []  # every JSON body /audio/speech received
        self.speech_status = 200  # another: /audio/speech answers that error

    # lifecycle

    async def start(self) -> None:
        """Bind 127.0.0.1 on an ephemeral port (or the previous port after down())."""
        await self._listen(self._port or 0)
        self._down = False

    async def stop(self) -> None:
        """Shut the server down, aborting requests still in flight."""
        self._drop_connections()
        await super().stop()

    @property
    def base_url(self) -> str:
        """Base URL for openai.AsyncOpenAI, e.g. http://127.0.0.1:PORT/v1."""
        return f"{self.origin}/v1"

    def down(self) -> None:
        """Stop listening and drop open connections so requests fail to connect."""
        self._down = True
        self._drop_connections()

    def _drop_connections(self) -> None:
        """Close the listening socket, every open connection and in-flight handler synchronously."""
        if self._site is not None and self._site._server is not None:
            self._site._server.close()
        if self._runner is not None and self._runner.server is not None:
            for conn in self._runner.server.connections:
                conn.force_close()
        for task in self._inflight:
            task.cancel()
        self._inflight.clear()

    async def up(self) -> None:
        """Listen again on the same port after down()."""
        if not self._down:
            return
        await self.stop()
        await self.start()

    # scripting

    def script(self, *replies: Reply | Responder) -> None:
        """Append replies (or responders) to the FIFO queue; each request pops one."""
        self._queue.extend(replies)

    def script_transcripts(self, *replies: Reply) -> None:
        """Append answers of /audio/transcriptions (`text`, or an error `status`) to its own FIFO queue."""
        self._transcripts.extend(replies)

    async def _next_reply(self, body: dict[str, Any]) -> Reply | None:
        """Pop the next scripted reply (or use the default) and resolve responders."""
        item = self._queue.popleft() if self._queue else self.default
        if item is None or isinstance(item, Reply):
            return item
        result = item(body)
        if inspect.isawaitable(result):
            return await result
        return result

    # handlers

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        """Handle POST /v1/embeddings: one vector per input from `self.embed` (or a 500 when told to fail)."""
        if self.embeddings_fail:
            return web.json_response(_error_body(500, "embeddings are down"), status=500)
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        self.embedding_inputs += inputs
        vectors: list[Any] = [self.embed(t) for t in inputs]
        if body.get("encoding_format") == "base64":  # the SDK's default: little-endian float32
            import base64
            import struct

            vectors = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors]
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        usage = {"prompt_tokens": sum(_tokens(t) for t in inputs), "total_tokens": sum(_tokens(t) for t in inputs)}
        return web.json_response({"object": "list", "data": data, "model": body["model"], "usage": usage})

    def _tracked(self, handle: Handler) -> Handler:
        """`handle`, tracked while it runs so down()/stop() can abort it (a client that went away: no answer)."""

        async def tracked(request: web.Request) -> web.StreamResponse:
            """Run `handle` for the request, tracked."""
            task = asyncio.current_task()
            if task is not None:
                self._inflight.add(task)
            try:
                return await handle(request)
            except ConnectionError:
                return web.Response(status=499)
            finally:
                if task is not None:
                    self._inflight.discard(task)

        return tracked

    async def _transcriptions(self, request: web.Request) -> web.StreamResponse:
        """Handle POST /v1/audio/transcriptions (a multipart form): record the upload, answer `{"text": …}`."""
        fields: dict[str, str] = {}
        upload: tuple[str | None, str | None, bytes] | None = None
        async for part in await request.multipart():
            if not isinstance(part, BodyPartReader) or part.name is None:
                continue
            if part.name == "file":
                upload = (part.filename, part.headers.get("Content-Type"), bytes(await part.read()))
            else:
                fields[part.name] = await part.text()
        if upload is None:
            return web.json_response(_error_body(400, "you must provide a file", "file"), status=400)
        model = fields.pop("model", None)
        self.uploads.append(Upload(*upload, model, fields, _bearer(request)))
        self._notify()
        if not model:
            return web.json_response(_error_body(400, "you must provide a model parameter", "model"), status=400)
        reply = self._transcripts.popleft() if self._transcripts else self.transcript
        if reply.delay > 0:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            error = reply.text or f"scripted error {reply.status}"
            return web.json_response(_error_body(reply.status, error), status=reply.status)
        if reply.raw is not None:
            return web.json_response(reply.raw)
        if fields.get("response_format") == "text":
            return web.Response(text=reply.text or "")
        return web.json_response({"text": reply.text or ""})

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        """Handle POST /v1/audio/speech: record the body, answer OGG/Opus bytes (or `speech_status`'s error)."""
        body = await request.json()
        self.speech_requests.append(body)
        self._notify()
        if self.speech_status != 200:
            error = f"scripted error {self.speech_status}"
            return web.json_response(_error_body(self.speech_status, error), status=self.speech_status)
        for name in ("model", "input", "voice"):
            if not isinstance(body.get(name), str) or not body[name]:
                return web.json_response(_error_body(400, f"you must provide a {name} parameter", name), status=400)
        return web.Response(body=speech_audio(body["input"]), content_type="audio/ogg")

    async def _models(self, request: web.Request) -> web.StreamResponse:
        """List the single fake model."""
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "fake"}],
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """Handle POST /v1/chat/completions, tracked so down()/stop() can abort it."""
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            return await self._handle_chat(request)
        except ConnectionError:  # the client went away mid-answer (a bot that was cut or killed): nothing to answer
            return web.Response(status=499)
        finally:
            if task is not None:
                self._inflight.discard(task)

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        """Validate, pick the scripted reply and answer it."""
        raw_text = await request.text()
        try:
            parsed: Any = json.loads(raw_text)
        except ValueError:
            self.requests.append({"_raw": raw_text})
            return web.json_response(_error_body(400, "We could not parse the JSON body of your request."), status=400)
        if not isinstance(parsed, dict):
            self.requests.append({"_raw": raw_text})
            return web.json_response(_error_body(400, "The request body must be a JSON object."), status=400)
        body: dict[str, Any] = parsed
        self.requests.append(body)
        try:
            _validate(body)
        except _InvalidRequest as e:
            return web.json_response(_error_body(400, e.message, e.param), status=400)

        reply = await self._next_reply(body)
        if reply is None:
            return web.json_response(_error_body(500, "no scripted reply"), status=500)
        if reply.delay > 0:
            await asyncio.sleep(reply.delay)

        stream = bool(body.get("stream"))
        if reply.bad_sse and not stream:
            return web.Response(text=reply.bad_sse[0], content_type="application/json")
        if reply.raw is not None:
            if stream and reply.status == 200:
                return await self._send_sse(request, [reply.raw])
            return web.json_response(reply.raw, status=reply.status)
        if reply.status != 200:
            headers = {"retry-after": "0"} if reply.status == 429 else None
            error = reply.text or f"scripted error {reply.status}"
            return web.json_response(_error_body(reply.status, error), status=reply.status, headers=headers)

        model = str(body["model"])
        calls = [
            (f"call_{next(self._call_ids)}", name, args if isinstance(args, str) else json.dumps(args))
            for name, args in reply.tool_calls
        ]
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        prompt_tokens = _tokens(json.dumps(body["messages"]))
        completion_tokens = _tokens(reply.text or "") + sum(_tokens(n + a) for _, n, a in calls)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if reply.usage is not None:
            usage = {**reply.usage, "total_tokens": reply.usage["prompt_tokens"] + reply.usage["completion_tokens"]}
        base = {
            "id": f"chatcmpl-fake{next(self._completion_ids)}",
            "created": int(time.time()),
            "model": model,
        }
        if not stream:
            message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
            if calls:
                message["tool_calls"] = [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                    for cid, name, args in calls
                ]
            return web.json_response(
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    **({"usage": usage} if self.send_usage else {}),
                }
            )

        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage")) and self.send_usage

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            """Build one chat.completion.chunk."""
            c: dict[str, Any] = {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
            }
            if include_usage:
                c["usage"] = None
            return c

        chunks: list[dict[str, Any] | str] = [chunk({"role": "assistant"})]
        chunks += [chunk({"content": piece}) for piece in _split(reply.text or "", 3)]
        for index, (cid, name, args) in enumerate(calls):
            chunks.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": cid,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            chunks += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}) for piece in _split(args, 2)
            ]
        chunks.extend(reply.bad_sse)
        chunks.append(chunk({}, finish))
        if include_usage:
            chunks.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        return await self._send_sse(request, chunks)

    async def _send_sse(self, request: web.Request, chunks: list[dict[str, Any] | str]) -> web.StreamResponse:
        """Write chunks as server-sent events followed by [DONE] (a str chunk is written verbatim)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for c in chunks:
            await resp.write(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
