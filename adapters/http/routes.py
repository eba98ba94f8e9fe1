"""The sessions API under /v1 (FastAPI): every request acts as one person (a bearer token, or the web page's sign-in
cookie), sees only that person's sessions (another's id answers 404, like one that never existed), and gets errors in
one shape, `{"error": {"type", "message"}}`, with the texts the chats show."""

import asyncio
import hashlib
import time
from collections import deque
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Scope

from adapters.http import sse
from adapters.http.body import OffLoopRoute
from adapters.http.errors import ERRORS, ApiError, refused
from adapters.http.limits import (
    MAX_BODY_BYTES,
    ONE_SHOT_TITLE_CHARS,
    PAGE_TURNS,
    PAGE_TURNS_MAX,
    POLL_OTHER_PROCESS_S,
    RATE_WINDOW_S,
    SESSIONS_LISTED,
    UPLOAD_BODY_BYTES,
)
from adapters.http.models import (
    Artifact,
    FilePartIn,
    Me,
    MemoryBlockOut,
    MemoryOut,
    MessageOut,
    MessagePage,
    Model,
    ModelList,
    NewMessage,
    NewSession,
    OneShot,
    Press,
    PressChoice,
    SessionList,
    SessionOut,
    TaskListOut,
    TaskOut,
    TextAnswer,
    TextPartIn,
)
from adapters.http.openai_compat import add_chat_completions
from adapters.http.signin_cookie import CSRF_HEADER, UNSAFE_METHODS, signin_secret
from adapters.http.uploads import UploadRefused, message_files, uploads_of
from core import (
    REPLY,
    Api,
    ApiMessage,
    ApiSession,
    Assistant,
    Bearer,
    Core,
    Error,
    ErrorPart,
    Feed,
    TextPart,
    Upload,
)

UNAUTHORIZED = "Send Authorization: Bearer <token>; /token new <name> in a private chat with the bot makes one."
WRONG_TOKEN = "That bearer token is wrong or revoked; /token new <name> in a private chat with the bot makes a new one."
SIGNED_OUT = "Signed out: send /web to the bot in a private chat for a new sign-in link."
NO_CSRF = f"A change by the web page must carry its sign-in's {CSRF_HEADER} header (GET /v1/me gives it)."
NO_SESSION = "No such session."
NO_MESSAGE = "No such message in this session."
NO_ARTIFACT = "No such artifact."
NO_MODEL = "No such model here; GET /v1/models lists them: {names}."
RATE = "Too many requests: at most {n} a minute per token. Try again in {s} s."
STRANGERS_RATE = "Too many requests without a valid token from this address: try again in {s} s."
STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The answer: its JSON once finished, or with `Accept: text/event-stream` Server-Sent Events "
        "(message.created, message.part.delta, tool.call, tool.result, error, message.completed; each with an id for "
        "Last-Event-ID).",
        "content": {sse.EVENT_STREAM: {"schema": {"type": "string"}}},
    },
    **ERRORS,
}


class RateLimit:
    """At most `per_minute` requests per caller in any RATE_WINDOW_S (this process's count)."""

    def __init__(self, per_minute: int) -> None:
        """No requests seen yet."""
        self.per_minute = per_minute
        self._seen: dict[str, deque[float]] = {}

    def retry_after(self, key: str, count: bool = True) -> int | None:
        """Count a request of `key` (not with count=False: only ask): None when it may go on, else the seconds until
        it may."""
        now = time.monotonic()
        seen = self._seen.setdefault(key, deque())
        while seen and now - seen[0] >= RATE_WINDOW_S:
            seen.popleft()
        if len(seen) >= self.per_minute:
            return max(1, int(RATE_WINDOW_S - (now - seen[0])) + 1)
        if not count:
            return None
        seen.append(now)
        if len(self._seen) > 10_000:  # forget idle callers
            self._seen = {k: v for k, v in self._seen.items() if v and now - v[-1] < RATE_WINDOW_S}
        return None


def wants_events(request: Request) -> bool:
    """Whether the client asked for Server-Sent Events."""
    return sse.EVENT_STREAM in request.headers.get("accept", "")


class HttpApi:
    """The routes of /v1 for one process, on `core`."""

    def __init__(self, core: Core) -> None:
        """Serve `core`'s people over HTTP."""
        self.core = core
        self.api = Api(core)
        self.limit = RateLimit(core.settings.API_REQUESTS_PER_MINUTE)
        self.strangers = RateLimit(core.settings.API_STRANGER_REQUESTS_PER_MINUTE)  # 401s, per client address
        self._gated: list[APIRoute] = []  # the routes that act for a caller (CallerFirst settles it before the body)

    async def caller(self, request: Request) -> Bearer:
        """Whom the request acts as (settled by `identify` before its body was read; see adapters/http/gate.py)."""
        who = getattr(request.state, "caller", None)
        if isinstance(who, Bearer):
            return who
        return await self.identify(request, request.path_params.get("session_id"))

    def _acts_for_caller(self, route: APIRoute) -> bool:
        """Whether a route depends on `caller` (acts for a person)."""
        return any(d.call == self.caller for d in route.dependant.dependencies)

    def gated(self, scope: Scope) -> dict[str, Any] | None:
        """The path parameters of the route that acts for a caller this request is for (None: no such route)."""
        for route in self._gated:
            match, child = route.matches(scope)
            if match is Match.FULL:
                params: dict[str, Any] = child.get("path_params", {})
                return params
        return None

    async def identify(self, request: Request, session_id: str | None) -> Bearer:
        """Whom the request acts as, from its headers alone: its bearer token or, without an Authorization header,
        the web page's sign-in cookie (401 without a valid one; 403 no longer allowed, or a cookie's change without
        the CSRF token; 429 past the rate, counted per token or sign-in, and per client address for requests without
        a valid one, which past API_STRANGER_REQUESTS_PER_MINUTE are refused before any lookup). Kept in
        `request.state.caller`, with the session `session_id` when the token's lookup found it."""
        address = f"addr:{request.client.host if request.client else '?'}"
        wait = self.strangers.retry_after(address, count=False)
        if wait is not None:
            raise ApiError(429, "rate_limited", STRANGERS_RATE.format(s=wait), {"Retry-After": str(wait)})
        try:
            who, key = await self._credentials(request, session_id)
        except ApiError as e:
            if e.status == 401:
                self.strangers.retry_after(address)
            raise
        refusal = self.api.refusal(who)
        if refusal is not None:
            raise ApiError(403, "forbidden", refusal)
        wait = self.limit.retry_after(key)
        if wait is not None:
            n = self.limit.per_minute
            raise ApiError(429, "rate_limited", RATE.format(n=n, s=wait), {"Retry-After": str(wait)})
        request.state.caller = who
        return who

    async def _credentials(self, request: Request, session_id: str | None) -> tuple[Bearer, str]:
        """Whom the token or sign-in cookie acts as, and the key its rate is counted by (401: neither is valid)."""
        header = request.headers.get("authorization")
        cookie = signin_secret(request, self.core.settings.public_base_url) if header is None else None
        if cookie is not None:
            who = await self.web_caller(request, cookie)
            if who is None:
                raise ApiError(401, "unauthorized", SIGNED_OUT, {"WWW-Authenticate": 'Bearer realm="api"'})
            return who, "web:" + hashlib.sha256(cookie.encode()).hexdigest()[:32]
        scheme, _, secret = (header or "").strip().partition(" ")
        if session_id is not None and "\x00" in session_id:  # no session has it (and PostgreSQL takes no NUL)
            request.state.session, session_id = None, None
        bearer = scheme.lower() == "bearer" and secret.strip() != ""
        found = await self.api.caller(secret.strip(), session_id) if bearer else None
        if found is None:
            said = WRONG_TOKEN if bearer else UNAUTHORIZED
            raise ApiError(401, "unauthorized", said, {"WWW-Authenticate": 'Bearer realm="api"'})
        who, session = found
        if session_id is not None:
            request.state.session = session  # the route's session, looked up with the token (one round trip)
        return who, f"token:{who.token_id}"

    async def web_caller(self, request: Request, secret: str) -> Bearer | None:
        """Whom a sign-in cookie acts as (None: ended); a change without the sign-in's CSRF token is refused (403).
        The token is kept in `request.state.csrf` for GET /v1/me."""
        found = await self.api.web_caller(secret)
        if found is None:
            return None
        who, csrf = found
        if request.method in UNSAFE_METHODS and not self.api.csrf_matches(csrf, request.headers.get(CSRF_HEADER)):
            raise ApiError(403, "forbidden", NO_CSRF)
        request.state.csrf = csrf
        return who

    async def session(self, who: Bearer, session_id: str, request: Request | None = None) -> ApiSession:
        """The caller's session, or 404 (the one `caller` found with the token, when it could)."""
        state = request.state if request is not None else None
        found: ApiSession | None
        if state is not None and hasattr(state, "session"):
            found = state.session
        else:
            found = await self.api.session(who, session_id)
        if found is None:
            raise ApiError(404, "not_found", NO_SESSION)
        return found

    async def final(self, who: Bearer, feed: Feed) -> MessageOut:
        """An answer once its feed ended, as stored (or, when nothing was stored, its error; a command's answer, which
        is never stored, as its text)."""
        stored = await self.api.stored_turn(who, feed.session_id, feed.message_id) or ()
        reply = next((m for m in stored if m.role == "assistant"), None)
        if reply is None:
            answer = feed.answer
            if isinstance(answer, Assistant) and answer.turn_id is None:  # a command's (a turn's has its id)
                said = (TextPart(answer.text),) if answer.text else ()
                reply = ApiMessage(
                    feed.message_id + REPLY, "assistant", feed.started_at, said, "done", feed.buttons, feed.choices
                )
            else:
                parts = (ErrorPart(answer.code, answer.message),) if isinstance(answer, Error) else ()
                reply = ApiMessage(feed.message_id + REPLY, "assistant", feed.started_at, parts, "failed")
        return MessageOut.of(reply, feed.session_id)

    async def answer(
        self,
        request: Request,
        who: Bearer,
        session: ApiSession,
        content: str,
        model: str | None,
        uploads: tuple[Upload, ...] = (),
    ) -> Any:
        """Start an answer and give it back as events or, once finished, as JSON (the turn runs on either way)."""
        problem = self.api.model_problem(model)
        if problem is not None:
            raise ApiError(400, "invalid_request", problem)
        key = request.headers.get("idempotency-key")
        started = await self.api.send(who, session, content, model=model, key=key, uploads=uploads)
        if isinstance(started, tuple):  # an Idempotency-Key seen before: that answer, as stored
            reply = next((m for m in started if m.role == "assistant"), None)
            if reply is None:
                raise ApiError(404, "not_found", NO_MESSAGE)
            return MessageOut.of(reply, session.id)
        final = lambda feed: self.final(who, feed)  # noqa: E731
        if wants_events(request):
            return StreamingResponse(sse.events(started, -1, final), media_type=sse.EVENT_STREAM, headers=_NO_CACHE)
        async for _ in started.follow(0, 3600.0):
            pass
        return await self.final(who, started)

    @staticmethod
    async def said(content: str | list[TextPartIn | FilePartIn], field: str) -> tuple[str, tuple[Upload, ...]]:
        """A message's text and files (400 or 413 when its files are refused)."""
        try:
            text, files = message_files(content, field)
            return text, await uploads_of(files)
        except UploadRefused as e:
            raise refused(e) from None

    async def resume(self, who: Bearer, session: ApiSession, last_event_id: str | None) -> Response:
        """The events of the answer named by Last-Event-ID (else the session's latest) from where the client was."""
        named = sse.parse_event_id(last_event_id)
        feed = self.api.feed(session.id, named[0]) if named else self.api.latest_feed(session.id)
        final = lambda f: self.final(who, f)  # noqa: E731
        if feed is not None:
            after = named[1] if named and named[0] == feed.message_id else -1
            return StreamingResponse(sse.events(feed, after, final), media_type=sse.EVENT_STREAM, headers=_NO_CACHE)
        if named is None:
            raise ApiError(404, "not_found", NO_MESSAGE)
        return StreamingResponse(self._elsewhere(who, session, named[0]), media_type=sse.EVENT_STREAM)

    async def _elsewhere(self, who: Bearer, session: ApiSession, message_id: str) -> Any:
        """An answer this process does not hold (another process runs it, or it finished long ago): its stored
        message once it is no longer running, with keep-alives meanwhile."""
        polls = int(self.core.settings.AGENT_TOTAL_TIMEOUT / POLL_OTHER_PROCESS_S) + 2  # a turn ends by then
        for _ in range(polls):  # past them (its process died): as stored, still "running" until a start closes it
            stored = await self.api.stored_turn(who, session.id, message_id) or ()
            reply = next((m for m in stored if m.role == "assistant"), None)
            if reply is None or reply.status != "running":
                break
            yield sse.KEEPALIVE
            await asyncio.sleep(POLL_OTHER_PROCESS_S)
        if reply is None:
            yield sse.frame("error", {"error": {"type": "not_found", "message": NO_MESSAGE}}, None)
            return
        body = MessageOut.of(reply, session.id).model_dump(mode="json")
        yield sse.frame("message.completed", {"message": body}, f"{message_id}:{2**31}")

    def router(self) -> APIRouter:
        """The /v1 routes."""
        r = APIRouter(prefix="/v1", max_body_size=MAX_BODY_BYTES, responses=ERRORS, route_class=OffLoopRoute)
        Who = Annotated[Bearer, Depends(self.caller)]

        @r.get("/sessions", response_model=SessionList, tags=["sessions"])
        async def list_sessions(who: Who) -> SessionList:
            """The person's sessions, most recently used first."""
            found = await self.api.sessions(who, SESSIONS_LISTED)
            return SessionList(sessions=[SessionOut.of(s) for s in found])

        @r.post("/sessions", response_model=SessionOut, status_code=201, tags=["sessions"])
        async def new_session(who: Who, body: NewSession | None = None) -> SessionOut:
            """A new session."""
            return SessionOut.of(await self.api.new_session(who, body.title if body else None))

        @r.get("/sessions/{session_id}", response_model=SessionOut, tags=["sessions"])
        async def get_session(who: Who, session_id: str, request: Request) -> SessionOut:
            """One session."""
            return SessionOut.of(await self.session(who, session_id, request))

        @r.delete("/sessions/{session_id}", status_code=204, tags=["sessions"])
        async def delete_session(who: Who, session_id: str) -> Response:
            """Delete a session with its messages."""
            if not await self.api.delete_session(who, session_id):
                raise ApiError(404, "not_found", NO_SESSION)
            return Response(status_code=204)

        @r.get("/sessions/{session_id}/messages", response_model=MessagePage, tags=["sessions"])
        async def messages(
            who: Who,
            session_id: str,
            before: str | None = None,
            limit: Annotated[int, Query(ge=1, le=PAGE_TURNS_MAX)] = PAGE_TURNS,
        ) -> MessagePage:
            """The session's messages with their parts, oldest first: `limit` exchanges before the cursor `before`."""
            page = await self.api.messages(who, session_id, before, limit)
            if page is None:
                raise ApiError(404, "not_found", NO_SESSION)
            return MessagePage(messages=[MessageOut.of(m, session_id) for m in page.messages], before=page.before)

        @r.post(
            "/sessions/{session_id}/messages",
            response_model=MessageOut,
            responses=STREAMED,
            tags=["sessions"],
            max_body_size=UPLOAD_BODY_BYTES,
        )
        async def post_message(
            who: Who,
            session_id: str,
            body: NewMessage,
            request: Request,
            idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
        ) -> Any:
            """Say something in the session, maybe with files (voice notes and audio are transcribed, photos looked
            at, documents read); the answer streams with `Accept: text/event-stream`. A retry with the same
            Idempotency-Key gets the same answer instead of a second one."""
            session = await self.session(who, session_id, request)
            text, uploads = await self.said(body.content, "content")
            return await self.answer(request, who, session, text, body.model, uploads)

        @r.get("/sessions/{session_id}/stream", responses=STREAMED, tags=["sessions"])
        async def stream(
            who: Who,
            session_id: str,
            request: Request,
            last_event_id: Annotated[str | None, Header(max_length=200)] = None,
        ) -> Response:
            """The live events of the session's answer named by Last-Event-ID (else its latest), from there on."""
            return await self.resume(who, await self.session(who, session_id, request), last_event_id)

        @r.post("/sessions/{session_id}/messages/{message_id}/press", response_model=TextAnswer, tags=["sessions"])
        async def press(
            who: Who, session_id: str, message_id: str, body: Press | PressChoice, request: Request
        ) -> TextAnswer:
            """Press a button under a message, as its `buttons` list it (`task_id` and `action`): Done or Snooze under
            a reminder (the reminder then says what it did, without its buttons), Undo under /remind's answer; or as
            its `choices` list it (`press`): a confirmation or a choice, whose command runs again for the caller and
            answers here. 404 when the task or the button is not the caller's, or gone."""
            session = await self.session(who, session_id, request)
            if isinstance(body, PressChoice):
                done, said = await self.api.press_choice(who, session, message_id, body.press)
            else:
                done, said = await self.api.press(who, session, message_id, body.task_id, body.action)
            if not done:
                raise ApiError(404, "not_found", said)
            return TextAnswer(text=said)

        @r.post("/sessions/{session_id}/reset", response_model=TextAnswer, tags=["sessions"])
        async def reset(who: Who, session_id: str, request: Request) -> TextAnswer:
            """Start the session's conversation afresh (like /reset; its messages stay)."""
            session = await self.session(who, session_id, request)
            return TextAnswer(text=await self.api.command(who, "reset", session=session))

        @r.post(
            "/one-shot",
            response_model=MessageOut,
            responses=STREAMED,
            tags=["sessions"],
            max_body_size=UPLOAD_BODY_BYTES,
        )
        async def one_shot(who: Who, body: OneShot, request: Request) -> Any:
            """A fresh session and one answer in it."""
            text, uploads = await self.said(body.prompt, "prompt")
            title = text or ", ".join(up.name for up in uploads)
            session = await self.api.new_session(who, title[:ONE_SHOT_TITLE_CHARS])
            return await self.answer(request, who, session, text, body.model, uploads)

        @r.get("/artifacts/{artifact_id}", response_model=Artifact, tags=["sessions"])
        async def artifact(who: Who, artifact_id: str) -> Artifact:
            """A tool result whole (a message part shows it cut)."""
            found = await self.api.artifact(who, artifact_id)
            if found is None:
                raise ApiError(404, "not_found", NO_ARTIFACT)
            return Artifact(id=artifact_id, name=found[0], content=found[1])

        @r.get("/tasks", response_model=TaskListOut, tags=["person"])
        async def tasks(who: Who) -> TaskListOut:
            """The person's open tasks with their times (and /tasks's answer as Markdown)."""
            found = await self.api.tasks(who)
            listed = [
                TaskOut(
                    id=t.id,
                    title=t.title,
                    state=t.state,
                    kind=t.kind,
                    due_at=t.due_at,
                    due_local=t.due_local,
                    recurrence=t.recurrence,
                    overdue=t.overdue,
                )
                for t in found.tasks
            ]
            return TaskListOut(text=found.text, timezone=found.timezone, tasks=listed)

        @r.get("/memory", response_model=MemoryOut, tags=["person"])
        async def memory(who: Who) -> MemoryOut:
            """What the bot remembers about the person, block by block (and /memory's answer as Markdown)."""
            found = await self.api.memory(who)
            blocks = [
                MemoryBlockOut(name=b.name, description=b.description, lines=list(b.lines), words=b.words)
                for b in found.blocks
            ]
            return MemoryOut(
                text=found.text, blocks=blocks, word_limit=found.word_limit, archival=found.archival, files=found.files
            )

        @r.post("/memory/wipe", response_model=TextAnswer, tags=["person"])
        async def wipe_memory(who: Who) -> TextAnswer:
            """Forget everything in the person's memory (like /memory wipe, confirmed)."""
            return TextAnswer(text=await self.api.command(who, "memory", {"action": "wipe", "confirm": "true"}))

        @r.post("/mcp/allow/{ask_id}", response_model=TextAnswer, tags=["person"])
        async def allow_mcp(who: Who, ask_id: int) -> TextAnswer:
            """Run a tool call that waits for the person's OK (an untrusted MCP server's tool that changes things)."""
            return TextAnswer(text=await self.api.command(who, "mcp", {"action": "allow", "server": str(ask_id)}))

        @r.get("/me", response_model=Me, tags=["person"])
        async def me(who: Who, request: Request) -> Me:
            """Whom the request acts as; for the web page's sign-in also its CSRF token, for X-CSRF-Token."""
            csrf = getattr(request.state, "csrf", None)
            return Me(identity=who.user_key, display_name=who.display_name, csrf=csrf)

        @r.get("/models", response_model=ModelList, tags=["openai"])
        async def models(who: Who) -> ModelList:
            """The models a message may ask for (LLM_MODELS), in OpenAI's shape."""
            return ModelList(data=[Model(id=name) for name in self.api.models()])

        @r.get("/models/{model_id}", response_model=Model, tags=["openai"])
        async def model(who: Who, model_id: str) -> Model:
            """One of the models a message may ask for (404 for any other), in OpenAI's shape."""
            if model_id not in self.api.models():
                raise ApiError(404, "not_found", NO_MODEL.format(names=", ".join(self.api.models())))
            return Model(id=model_id)

        add_chat_completions(r, self.api, self.caller, self.session)
        self._gated = [route for route in r.routes if isinstance(route, APIRoute) and self._acts_for_caller(route)]
        return r


_NO_CACHE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
