"""The LLM client: provider → base URL, the openai SDK's retries, streamed or whole replies."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import openai
from openai import AsyncStream
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageFunctionToolCall

from core.agent.providers import PROVIDERS
from core.constants import REASON_CHARS
from core.metrics import Metrics
from core.quoting import truncate
from core.settings import Settings

log = logging.getLogger(__name__)

MALFORMED = "malformed"  # LLMReply.finish_reason of a reply that could not be parsed


class LLMUnavailable(Exception):
    """The model could not be reached or refused the request after the SDK's retries."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        """`refused`: the server rejected this request (a 4xx); trying the same again will not help."""
        super().__init__(message)
        self.refused = refused


class LLMTimeout(Exception):
    """The model took longer than the step allows."""


@dataclass(frozen=True)
class RawToolCall:
    """A tool call as the model wrote it (arguments still a JSON string)."""

    id: str
    name: str
    arguments: str


@dataclass
class LLMReply:
    """One whole model reply."""

    content: str | None
    tool_calls: list[RawToolCall] = field(default_factory=list)
    finish_reason: str | None = None


def _refused(e: BaseException) -> bool:
    """Whether a (timeout-looking) error was really a refused connection (the aiohttp transport maps
    connector errors to ConnectTimeout)."""
    seen: BaseException | None = e
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError) or type(seen).__name__ == "ClientConnectorError":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def server_host(url: str) -> str:
    """The host (and port) of a model server's URL, for messages users see: no scheme, path, query or credentials
    (a URL may carry a key in any of them)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "the configured server"
    if not host:
        return "the configured server"
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port else host


def _reason(e: openai.APIStatusError) -> str:
    """The server's reason for refusing a request, on one short line ('' when it gave none)."""
    body = e.body
    text: object = body.get("message") if isinstance(body, dict) else body
    if not isinstance(text, str) or not text.strip():
        return ""
    return truncate(text, REASON_CHARS, one_line=True)


def _parse_whole(resp: Any) -> LLMReply:
    """An LLMReply from a whole completion; a malformed body becomes an empty (invalid) reply."""
    try:
        choice = resp.choices[0]
        msg = choice.message
        calls = [
            RawToolCall(c.id, c.function.name or "", c.function.arguments or "")
            for c in (msg.tool_calls or [])
            if isinstance(c, ChatCompletionMessageFunctionToolCall)
        ]
        return LLMReply(msg.content, calls, choice.finish_reason)
    except (TypeError, AttributeError, IndexError):
        return LLMReply(content=None, finish_reason=MALFORMED)


class LLM:
    """A chat-completions client bound to one model."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, where: str, metrics: Metrics | None = None) -> None:
        """Wrap an SDK client; `where` names the server in error messages; requests are counted in `metrics`."""
        self.client = client
        self.model = model
        self.where = where
        self.metrics = metrics if metrics is not None else Metrics()

    @classmethod
    def from_settings(cls, settings: Settings, *, max_retries: int = 2, metrics: Metrics | None = None) -> LLM:
        """Build the client for the configured provider (LLM_BASE_URL overrides its URL)."""
        info = PROVIDERS[settings.LLM_PROVIDER]
        base_url = settings.LLM_BASE_URL or info.base_url
        key = settings.LLM_API_KEY.get_secret_value() if settings.LLM_API_KEY else "not-needed"
        client = openai.AsyncOpenAI(
            api_key=key,
            base_url=base_url,
            max_retries=max_retries,
            timeout=openai.Timeout(settings.AGENT_STEP_TIMEOUT, connect=10.0),
            http_client=openai.DefaultAioHttpClient(),  # cheaper per request than httpx (DESIGN §5)
        )
        return cls(client, settings.LLM_MODEL or info.default_model, server_host(base_url), metrics)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.client.close()

    def _unavailable(self, e: openai.OpenAIError) -> LLMUnavailable:
        """A user-readable error for a failed request."""
        if isinstance(e, openai.APIStatusError):
            detail = f"it answered {e.status_code}"
            if e.status_code in (401, 403):  # the reason could echo the key: not shown
                detail += " (check LLM_API_KEY)"
            else:
                reason = _reason(e) if e.status_code < 500 else ""
                detail += f": {reason.rstrip('.')}" if reason else ""
                if e.status_code == 404:
                    detail += " (check LLM_MODEL)"
        elif isinstance(e, openai.APITimeoutError) and not _refused(e):
            detail = "it timed out"
        else:
            detail = "it is unreachable"
        refused = (
            isinstance(e, openai.APIStatusError) and 400 <= e.status_code < 500 and e.status_code not in (408, 429)
        )
        return LLMUnavailable(f"The language model at {self.where} could not be used: {detail}.", refused=refused)

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        stream: bool,
        timeout: float,
        tool_choice: str | None = None,
    ) -> AsyncIterator[str | LLMReply]:
        """Yield text deltas (when streaming), then exactly one LLMReply; the whole call is bounded and measured."""
        started = time.monotonic()
        try:
            async with aclosing(self._chat(messages, tools, stream, timeout, tool_choice)) as items:
                async for item in items:
                    if isinstance(item, LLMReply):
                        self.metrics.llm_seconds.observe(time.monotonic() - started)
                        if item.finish_reason == MALFORMED:
                            self.metrics.llm_errors.labels("malformed").inc()
                    yield item
        except (LLMTimeout, LLMUnavailable) as e:
            self.metrics.llm_seconds.observe(time.monotonic() - started)
            kind = "timeout" if isinstance(e, LLMTimeout) else "refused" if e.refused else "unavailable"
            self.metrics.llm_errors.labels(kind).inc()
            raise

    async def _chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        stream: bool,
        timeout: float,
        tool_choice: str | None,
    ) -> AsyncGenerator[str | LLMReply, None]:
        """One request: text deltas (when streaming), then exactly one LLMReply."""
        deadline = time.monotonic() + timeout
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            kwargs["tools"] = tools
            if tool_choice:
                kwargs["tool_choice"] = tool_choice
        try:
            if not stream:
                # client.post skips the SDK's per-call parameter rewriting (the largest CPU cost of a turn);
                # the body is already plain JSON. Retries and timeouts still come from the SDK.
                resp = await asyncio.wait_for(
                    self.client.post("/chat/completions", body=kwargs, cast_to=ChatCompletion), timeout
                )
                yield _parse_whole(resp)
                return
            chunks = await asyncio.wait_for(
                self.client.post(
                    "/chat/completions",
                    body={**kwargs, "stream": True},
                    cast_to=ChatCompletion,
                    stream=True,
                    stream_cls=AsyncStream[ChatCompletionChunk],
                ),
                timeout,
            )
            reply = LLMReply(content=None)
            parts: list[str] = []
            partial: dict[int, dict[str, str]] = {}
            iterator = chunks.__aiter__()
            try:
                while True:
                    try:
                        chunk = await asyncio.wait_for(anext(iterator), max(0.0, deadline - time.monotonic()))
                    except StopAsyncIteration:
                        break
                    except json.JSONDecodeError as e:  # a `data:` line that is not JSON: the reply is unusable
                        log.warning("the model at %s sent a malformed streamed event (%s)", self.where, e.msg)
                        yield LLMReply(content=None, finish_reason=MALFORMED)
                        return
                    for ch in chunk.choices or []:
                        delta = ch.delta
                        if delta.content:
                            parts.append(delta.content)
                            yield delta.content
                        for tc in delta.tool_calls or []:
                            slot = partial.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                            if tc.id:
                                slot["id"] = tc.id
                            if tc.function and tc.function.name:
                                slot["name"] += tc.function.name
                            if tc.function and tc.function.arguments:
                                slot["arguments"] += tc.function.arguments
                        if ch.finish_reason:
                            reply.finish_reason = ch.finish_reason
            finally:
                await chunks.close()
            reply.content = "".join(parts) or None
            reply.tool_calls = [
                RawToolCall(s["id"] or f"call_{i}", s["name"], s["arguments"]) for i, s in sorted(partial.items())
            ]
            yield reply
        except json.JSONDecodeError as e:  # a whole reply whose body is not JSON: as unusable as an empty one
            log.warning("the model at %s sent a malformed reply (%s)", self.where, e.msg)
            yield LLMReply(content=None, finish_reason=MALFORMED)
        except TimeoutError:
            raise LLMTimeout(f"the model did not answer within {timeout:.0f} s") from None
        except openai.OpenAIError as e:
            raise self._unavailable(e) from e
