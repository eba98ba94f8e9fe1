"""`bot ask --server URL "…"`: ask a running bot over its HTTP API instead of starting one. The question goes to
POST /v1/one-shot (a fresh session), or with `--session ID` into that session; the answer is printed as it streams
(Server-Sent Events), then its steps as the terminal shows them, and the session's id on standard error.

The token comes from `--token`, else the BOT_API_TOKEN environment variable (`uv run bot token` makes one). Failures
are one line on standard error, never a traceback: exit 2 for what the caller must fix (no token, a refused token,
an unknown session, a bad URL), 3 when the server cannot be reached, 1 when the answer failed."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote, urlsplit

from core import EXIT_UNREACHABLE, Step, activity_lines, outcome_of, redact, summary_line

if TYPE_CHECKING:  # httpx (and the CLI libraries it loads) only for `bot ask --server`
    import httpx

TOKEN_ENV = "BOT_API_TOKEN"
EVENT_STREAM = "text/event-stream"
CONNECT_TIMEOUT_S = 10.0  # to open the connection
SILENCE_TIMEOUT_S = 120.0  # a stream silent this long is given up (the server sends a keep-alive every 15 s)
FIX = 2  # exit code: the caller must fix something (as bot/__main__'s configuration problems)
FAILED = 1  # exit code: the answer failed
CALLER_ERRORS = (400, 401, 403, 404, 413)  # HTTP statuses that exit with FIX


class Refused(Exception):
    """A one-line failure and its exit code."""

    def __init__(self, message: str, code: int) -> None:
        """Remember the line and the code."""
        super().__init__(message)
        self.code = code


def usage_problem(server: str | None, token: str | None, session: str | None, cont: bool) -> str | None:
    """What is wrong with the options of a remote ask (None: nothing)."""
    if server is None:
        return "--token and --session need --server URL"
    if cont:
        return "--continue is for the local ask; with --server, continue a session with --session ID"
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"--server needs an http:// or https:// URL, e.g. http://127.0.0.1:8080 (got {server!r})"
    if not token:
        return f"no API token: pass --token or set {TOKEN_ENV} (`uv run bot token` or /token new <name> makes one)"
    return None


def main(server: str | None, token: str | None, session: str | None, text: str, *, cont: bool, debug: bool) -> int:
    """`bot ask --server`: ask, print, and return the exit code (failures are one line on standard error)."""
    token = token or os.environ.get(TOKEN_ENV, "").strip() or None
    problem = usage_problem(server, token, session, cont)
    if problem is not None:
        print(f"bot ask: {problem}", file=sys.stderr)
        return FIX
    assert server is not None and token is not None
    try:
        return ask(server.rstrip("/"), token, session, text, sys.stdout, sys.stderr)
    except Refused as e:
        print(f"bot ask: {redact(str(e), [token])}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:  # the answer goes on in the server; as the local ask, Ctrl-C is no failure
        return 0
    except Exception as e:
        if debug:
            raise
        print(f"bot ask: {redact(f'{type(e).__name__}: {e}', [token])}", file=sys.stderr)
        return FAILED


def ask(base: str, token: str, session: str | None, text: str, out: TextIO, err: TextIO) -> int:
    """Post the question, print the answer as it streams and its steps; 0 answered, 1 failed (Refused otherwise)."""
    path, body = (
        ("/v1/one-shot", {"prompt": text})
        if session is None
        else (f"/v1/sessions/{quote(session)}/messages", {"content": text})
    )
    import httpx

    headers = {"Authorization": f"Bearer {token}", "Accept": EVENT_STREAM}
    timeout = httpx.Timeout(SILENCE_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    started = time.monotonic()
    try:
        with (
            httpx.Client(timeout=timeout) as client,
            client.stream("POST", base + path, json=body, headers=headers) as r,
        ):
            if r.status_code != 200:
                r.read()
                raise Refused(refusal(r, base), FIX if r.status_code in CALLER_ERRORS else FAILED)
            answer = Answer(out)
            for event, data in sse_events(r.iter_lines()):
                answer.on(event, data)
    except httpx.ConnectError as e:
        raise Refused(f"cannot reach {base} ({e or 'connection failed'})", EXIT_UNREACHABLE) from None
    except httpx.TimeoutException:
        raise Refused(f"{base} did not answer within {SILENCE_TIMEOUT_S:g} s", EXIT_UNREACHABLE) from None
    except httpx.TransportError as e:  # the connection broke mid-stream
        raise Refused(
            f"the connection to {base} broke ({e or type(e).__name__}); the answer goes on there", FAILED
        ) from None
    return answer.finish(time.monotonic() - started, base, err)


def refusal(r: httpx.Response, base: str) -> str:
    """The server's one-line error (its `{"error": {"message"}}`), said for the command line."""
    if r.status_code == 401:
        return f"{base} refused the API token (HTTP 401): check --token or {TOKEN_ENV}"
    try:
        message = str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = r.reason_phrase or "refused"
    return f"{message} (HTTP {r.status_code} from {base})"


def sse_events(lines: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) of a Server-Sent Events stream (comments and ids skipped)."""
    event, data = "", ""
    for line in lines:
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
        elif line == "" and event:
            yield event, json.loads(data) if data else {}
            event, data = "", ""


@dataclass
class Answer:
    """An answer as it streams in: its text written as it comes, then what it ended as."""

    out: TextIO
    session_id: str | None = None
    last_part: int | None = None  # the text part written last
    written: str = ""  # the end of what was written (to end the text with a line break)
    error: str | None = None
    done: dict[str, Any] | None = field(default=None)  # the completed message

    def write(self, text: str) -> None:
        """Write text at once."""
        if text:
            self.out.write(text)
            self.out.flush()
            self.written = text

    def on(self, event: str, data: dict[str, Any]) -> None:
        """Take one event."""
        if event == "message.created":
            self.session_id = data.get("message", {}).get("session_id", self.session_id)
        elif event == "message.part.delta" and data.get("type") == "text":
            part = data.get("part")
            if self.last_part is not None and part != self.last_part and not self.written.endswith("\n"):
                self.write("\n")  # a new text part (after the model's tool calls) on its own line
            self.last_part = part
            self.write(str(data.get("delta", "")))
        elif event == "error":
            self.error = str(data.get("error", {}).get("message", "")) or None
        elif event == "message.completed":
            self.done = data.get("message")

    def finish(self, took_s: float, base: str, err: TextIO) -> int:
        """End the printed answer with its steps (or its error); 0 answered, 1 not."""
        if self.done is None:
            raise Refused(f"{base} ended the stream before the answer was complete", FAILED)
        parts = self.done.get("parts", [])
        if self.last_part is None:  # nothing streamed (an answer already stored): its text as stored
            self.write("\n".join(p["text"] for p in parts if p.get("type") == "text"))
        if self.written and not self.written.endswith("\n"):
            self.write("\n")
        errors = [str(p.get("message", "")) for p in parts if p.get("type") == "error"]
        if not errors and self.error and self.done.get("status") == "failed":
            errors = [self.error]
        for message in errors:
            self.write(f"⚠️  {message}\n")
        steps = steps_of(parts)
        if steps:
            lines = [summary_line(steps, took_s), *activity_lines(steps)]
            self.write("".join(f"   {line}\n" for line in lines))
        if self.session_id:
            print(f"(session {self.session_id}: --session {self.session_id} continues it)", file=err)
        return FAILED if errors or self.done.get("status") == "failed" else 0


def steps_of(parts: list[dict[str, Any]]) -> list[Step]:
    """The answer's tool calls as the terminal's steps (a call paired with its result)."""
    calls = {p.get("call_id"): p for p in parts if p.get("type") == "tool_call"}
    steps = []
    for result in (p for p in parts if p.get("type") == "tool_result"):
        call = calls.get(result.get("call_id"), {})
        ok, outcome, code = outcome_of(envelope(str(result.get("result", "")), bool(result.get("ok"))))
        took = seconds_between(call.get("started_at"), result.get("finished_at"))
        args = call.get("args")
        steps.append(Step(str(result.get("name", "")), args if isinstance(args, dict) else {}, ok, outcome, took, code))
    return steps


def envelope(result: str, ok: bool) -> dict[str, Any]:
    """A tool result's envelope from its shown text (a cut one is no JSON: its text stands for it)."""
    try:
        parsed = json.loads(result)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    return {"ok": True, "result": result} if ok else {"ok": False, "error": {"code": "tool_error", "message": result}}


def seconds_between(start: Any, end: Any) -> float:
    """Seconds between two ISO times (0 when one is missing)."""
    try:
        return max(0.0, (datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds())
    except ValueError:
        return 0.0
