"""POST /v1/chat/completions: the bot as an OpenAI model, for Open WebUI, LibreChat, the `openai` SDK and curl. The
last user message is the turn, with its files (image_url and file parts as data: URLs, input_audio; links are not
fetched: 400) — the bot keeps each session's history itself, so earlier messages are not read; the
`X-Session-Id` header names the caller's session to continue (none: a fresh session, like `bot ask`), and the answer
carries the one it used. The content is the answer's text as it streams, with each run of tool steps as a collapsible
`<details>` block, sent whole when the run ends (Open WebUI renders only a closed block, and the count is known
then); a turn's error is its text, like the chats show it. Errors of the request keep the API's one shape."""

import html
import json
import mimetypes
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.responses import StreamingResponse

from adapters.http import sse
from adapters.http.errors import ApiError, refused
from adapters.http.limits import HTTP_UPLOAD_MAX_FILES, KEEPALIVE_S, ONE_SHOT_TITLE_CHARS, UPLOAD_BODY_BYTES
from adapters.http.models import SPACE_CHARS, VISIBLE
from adapters.http.openai_models import (
    AnswerMessage,
    ChatCompletion,
    ChatMessage,
    ChatRequest,
    Choice,
    CompletionUsage,
    ContentPart,
)
from adapters.http.uploads import TOO_MANY, Sent, UploadRefused, data_url, uploads_of
from core import (
    EMPTY_ANSWER,
    Api,
    ApiSession,
    Assistant,
    AssistantDelta,
    Bearer,
    Error,
    Event,
    Feed,
    Step,
    ToolCall,
    ToolResult,
    Upload,
    activity_lines,
    summary_line,
)

NO_USER_MESSAGE = "messages: there is no user message; the last one is what the bot answers."
NO_TEXT = "a user message has neither text nor a file (image_url, input_audio or file parts as data)."
NO_FILE_ID = "{where}: file ids are not known here; send the file itself as file_data (a data: URL)."
BAD_FORMAT = "{where}: an audio format is a short name like wav or mp3."
AUDIO_MIMES = {"wav": "audio/wav", "mp3": "audio/mpeg"}  # input_audio's formats (others: audio/<format>)
SESSION_HEADER = "X-Session-Id"
DONE = b"data: [DONE]\n\n"
NO_CACHE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_VISIBLE = re.compile(VISIBLE)


STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The answer; with `stream: true` as Server-Sent Events of `chat.completion.chunk` objects "
        "(`data:` lines) ending with `data: [DONE]`. The X-Session-Id header names the session used.",
        "content": {sse.EVENT_STREAM: {"schema": {"type": "string"}}},
    }
}


def turn_text(messages: list[ChatMessage]) -> tuple[str, list[Sent], list[Sent]]:
    """The text and files of the last user message, and the files of the others (checked, not used): every message
    follows the rules the description states (400 when one does not, or there is no user message)."""
    n, said = next(((i, m) for i, m in reversed(list(enumerate(messages))) if m.role == "user"), (0, None))
    if said is None:
        raise ApiError(400, "invalid_request", NO_USER_MESSAGE)
    try:
        checked = [check_message(m, i) for i, m in enumerate(messages)]
    except UploadRefused as e:
        raise refused(e) from None
    text, files = checked[n]
    return text, files, [f for i, (_, sent) in enumerate(checked) if i != n for f in sent]


def check_message(message: ChatMessage, n: int) -> tuple[str, list[Sent]]:
    """A message's text and files, by the rules of MESSAGE_RULES (UploadRefused when it breaks one)."""
    content = message.content
    text = content if isinstance(content, str) else "\n".join(p.text for p in content or [] if p.text)
    files: list[Sent] = []
    if isinstance(content, list):
        files = [f for i, p in enumerate(content) if (f := file_of(p, f"messages[{n}].content[{i}]")) is not None]
    if len(files) > HTTP_UPLOAD_MAX_FILES:
        raise UploadRefused(400, f"messages[{n}]: {TOO_MANY}")
    if message.role == "user" and not _VISIBLE.search(text) and not files:
        raise UploadRefused(400, f"messages[{n}]: {NO_TEXT}")
    return text, files


def file_of(part: ContentPart, where: str) -> Sent | None:
    """The file of an image_url, input_audio or file part (None: a part of another type)."""
    if part.type == "image_url" and part.image_url is not None:
        url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
        mime, data = data_url(url, f"{where}.image_url.url")
        return Sent(f"{where}.image_url.url", "image" + (mimetypes.guess_extension(mime or "") or ""), mime, data)
    if part.type == "input_audio" and part.input_audio is not None:
        fmt = part.input_audio.format.strip(SPACE_CHARS).lower()
        if not (fmt.isascii() and fmt.isalnum()) or len(fmt) > 10:
            raise UploadRefused(400, BAD_FORMAT.format(where=f"{where}.input_audio.format"))
        mime = AUDIO_MIMES.get(fmt, f"audio/{fmt}")
        return Sent(f"{where}.input_audio.data", f"audio.{fmt}", mime, part.input_audio.data)
    if part.type == "file" and part.file is not None:
        if part.file.file_data is None:
            raise UploadRefused(400, NO_FILE_ID.format(where=f"{where}.file"))
        mime, data = data_url(part.file.file_data, f"{where}.file.file_data")
        return Sent(f"{where}.file.file_data", part.file.filename or "document", mime, data)
    return None


def steps_block(steps: list[Step]) -> str:
    """A run of tool steps as a collapsible block: `🔧 N steps · t s`, then one line per step (HTML-escaped: a step's
    outcome may hold any text)."""
    lines = "\n".join(f"- {html.escape(line, quote=False)}" for line in activity_lines(steps))
    summary = html.escape(summary_line(steps, sum(s.duration_s for s in steps)), quote=False)
    return f"<details>\n<summary>{summary}</summary>\n\n{lines}\n</details>\n\n"


class Composer:
    """The content of a completion from a turn's events, piece by piece: the text as it comes, a run of tool steps as
    one block once the run ends (at the next text, or the end), the final text's part that never streamed (a note
    after a cut answer, a wrap-up, the text of a model that does not stream), a turn's error as its text."""

    def __init__(self) -> None:
        """Nothing sent yet."""
        self.sent = ""
        self._steps: list[Step] = []
        self._segment = ""  # the text streamed since the last tool call

    def add(self, event: Event) -> str:
        """What the event adds to the content (maybe nothing)."""
        if isinstance(event, AssistantDelta):
            piece = self._run_ended() + event.text
            self._segment += event.text
        elif isinstance(event, ToolCall):
            piece, self._segment = "", ""
        elif isinstance(event, ToolResult):
            piece = ""
            self._steps.append(event.step)
        elif isinstance(event, Assistant):
            piece = self._run_ended()
            piece += self._unstreamed(event.text, self.sent + piece)
        elif isinstance(event, Error):
            piece = self._run_ended()
            piece += _gap(self.sent + piece) + event.message
        else:
            piece = ""
        self.sent += piece
        return piece

    def end(self) -> str:
        """What is left once the turn ended (something is always said)."""
        piece = self._run_ended()
        if not (self.sent + piece).strip():
            piece += EMPTY_ANSWER
        self.sent += piece
        return piece

    def _run_ended(self) -> str:
        """The block of the steps not shown yet ("" when none)."""
        if not self._steps:
            return ""
        block, self._steps, self._segment = _gap(self.sent) + steps_block(self._steps), [], ""
        return block

    def _unstreamed(self, final: str, sent: str) -> str:
        """The final answer's text that its streamed text lacks."""
        streamed = self._segment.strip()
        if streamed and final.startswith(streamed):
            return final[len(streamed) :]
        return _gap(sent) + final if final.strip() else ""


def _gap(sent: str) -> str:
    """The line break that starts a new paragraph after `sent`."""
    if not sent or sent.endswith("\n\n"):
        return ""
    return "\n" if sent.endswith("\n") else "\n\n"


def usage_of(feed: Feed) -> CompletionUsage:
    """The tokens of the feed's turn (0 when not counted: no model call, or a failure)."""
    answer = feed.answer
    tokens = answer.tokens if isinstance(answer, Assistant) else None
    prompt, completion, cached = (tokens.prompt, tokens.completion, tokens.cached) if tokens else (0, 0, 0)
    details = CompletionUsage.PromptDetails(cached_tokens=cached)
    return CompletionUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=details,
    )


def _data(payload: dict[str, Any]) -> bytes:
    """One `data:` event."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


async def chunks(feed: Feed, model: str, include_usage: bool) -> AsyncIterator[bytes]:
    """The answer as `chat.completion.chunk` events, with keep-alive comments while nothing comes."""
    base: dict[str, Any] = {
        "id": completion_id(feed),
        "object": "chat.completion.chunk",
        "created": int(feed.started_at.timestamp()),
        "model": model,
    }
    if include_usage:
        base["usage"] = None

    def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
        return _data({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    composer = Composer()
    async for item in feed.follow(0, KEEPALIVE_S):
        if item is None:
            yield sse.KEEPALIVE
            continue
        piece = composer.add(item[1])
        if piece:
            yield chunk({"content": piece})
    piece = composer.end()
    if piece:
        yield chunk({"content": piece})
    yield chunk({}, "stop")
    if include_usage:
        yield _data({**base, "choices": [], "usage": usage_of(feed).model_dump()})
    yield DONE


def completion_id(feed: Feed) -> str:
    """The completion's id: the turn's message id (GET /v1/sessions/{id}/messages shows the same)."""
    return f"chatcmpl-{feed.message_id}"


async def whole(feed: Feed, model: str) -> ChatCompletion:
    """The answer once the turn ended."""
    composer = Composer()
    async for item in feed.follow(0, KEEPALIVE_S):
        if item is not None:
            composer.add(item[1])
    composer.end()
    return ChatCompletion(
        id=completion_id(feed),
        created=int(feed.started_at.timestamp()),
        model=model,
        choices=[Choice(message=AnswerMessage(content=composer.sent))],
        usage=usage_of(feed),
    )


def add_chat_completions(
    router: APIRouter,
    api: Api,
    caller: Callable[[Request], Awaitable[Bearer]],
    session_of: Callable[[Bearer, str], Awaitable[ApiSession]],
) -> None:
    """POST /chat/completions on the /v1 router, on `api`: `caller` is whom a request acts as (its route dependency),
    `session_of` the caller's session by id (or the API's 404)."""
    Who = Annotated[Bearer, Depends(caller)]

    @router.post(
        "/chat/completions",
        response_model=ChatCompletion,
        responses=STREAMED,
        tags=["openai"],
        max_body_size=UPLOAD_BODY_BYTES,  # the history a client resends holds its earlier images too
    )
    async def chat_completions(
        who: Who,
        body: ChatRequest,
        response: Response,
        x_session_id: Annotated[str | None, Header(max_length=200)] = None,
        x_openwebui_chat_id: Annotated[str | None, Header(max_length=200)] = None,
    ) -> Any:
        """Answer the last user message as the bot, in the session named by X-Session-Id (none: a fresh one); the
        answer streams with `stream: true`."""
        problem = api.model_problem(body.model)
        if problem is not None:
            raise ApiError(400, "invalid_request", problem)
        text, files, history = turn_text(body.messages)
        uploads: tuple[Upload, ...] = ()
        try:
            uploads = await uploads_of(files, also_check=history)
        except UploadRefused as e:
            raise refused(e) from None
        title = text or ", ".join(up.name for up in uploads)
        if x_session_id is not None:
            session = await session_of(who, x_session_id)
        elif x_openwebui_chat_id:  # Open WebUI with ENABLE_FORWARD_USER_INFO_HEADERS: its chat is one session
            session = await api.client_session(who, f"openwebui:{x_openwebui_chat_id}", title[:ONE_SHOT_TITLE_CHARS])
        else:
            session = await api.new_session(who, title[:ONE_SHOT_TITLE_CHARS])
        feed = await api.send(who, session, text, model=body.model, uploads=uploads)
        assert isinstance(feed, Feed)  # only an Idempotency-Key (not sent here) answers with stored messages
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            headers = {**NO_CACHE, SESSION_HEADER: session.id}
            return StreamingResponse(chunks(feed, body.model, usage), media_type=sse.EVENT_STREAM, headers=headers)
        response.headers[SESSION_HEADER] = session.id
        return await whole(feed, body.model)
