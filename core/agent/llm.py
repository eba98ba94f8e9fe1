"""The LLM client: provider → base URL, the openai SDK's retries, streamed or whole replies."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.agent.providers import PROVIDERS, ModelChoice, ProviderInfo
from core.metrics import Metrics
from core.openai_client import failure_detail, openai_client, server_host
from core.settings import Settings
from core.textsafe import strip_nul

if TYPE_CHECKING:  # the SDK loads with the first client made (a start without a model never loads it)
    import openai
    from openai import AsyncStream

log = logging.getLogger(__name__)

MALFORMED = "malformed"  # LLMReply.finish_reason of a reply that could not be parsed


class LLMUnavailable(Exception):
    """The model could not be reached or refused the request after the SDK's retries."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        """`refused`: the server rejected this request (a 4xx); trying the same again will not help."""
        super().__init__(message)
        self.refused = refused


def drop_images(messages: list[dict[str, Any]]) -> bool:
    """Turn every message's image parts into nothing (their text parts, which name each photo, stay); whether any
    image was there."""
    dropped = False
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            dropped = dropped or any(p.get("type") == "image_url" for p in content)
            m["content"] = "\n".join(p["text"] for p in content if p.get("type") == "text")
    return dropped


class LLMTimeout(Exception):
    """The model took longer than the step allows."""


@dataclass(frozen=True)
class RawToolCall:
    """A tool call as the model wrote it (arguments still a JSON string)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Usage:
    """The tokens one model call used, as its server reported them (`cached`: of the prompt's, when it says)."""

    prompt: int
    completion: int
    cached: int = 0


@dataclass
class LLMReply:
    """One whole model reply; `model`: the model asked, `usage`: None when the server did not report it."""

    content: str | None
    tool_calls: list[RawToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    model: str = ""
    usage: Usage | None = None
    images_refused: bool = False  # the model refused the request's images: it was asked again without them


def _field(raw: Any, name: str) -> Any:
    """A field of the SDK's object or of a raw JSON object (a streamed chunk is read unparsed)."""
    return raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)


def _usage(raw: Any) -> Usage | None:
    """The usage a completion or its last streamed chunk reports (None when absent or not numbers)."""
    prompt, completion = _field(raw, "prompt_tokens"), _field(raw, "completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    cached = _field(_field(raw, "prompt_tokens_details"), "cached_tokens")
    return Usage(max(0, prompt), max(0, completion), max(0, cached) if isinstance(cached, int) else 0)


_NO_CALL = {"id": "", "name": "", "arguments": ""}  # a streamed tool call before its first piece


def _objects(raw: Any) -> list[dict[str, Any]]:
    """The JSON objects of a streamed list (none when it is no list)."""
    return [x for x in raw if isinstance(x, dict)] if isinstance(raw, list) else []


def _parse_whole(resp: Any) -> LLMReply:
    """An LLMReply from a whole completion; a malformed body becomes an empty (invalid) reply."""
    from openai.types.chat import ChatCompletionMessageFunctionToolCall

    try:
        choice = resp.choices[0]
        msg = choice.message
        calls = [
            RawToolCall(c.id, c.function.name or "", c.function.arguments or "")
            for c in (msg.tool_calls or [])
            if isinstance(c, ChatCompletionMessageFunctionToolCall)
        ]
        content = strip_nul(msg.content) if isinstance(msg.content, str) else msg.content
        return LLMReply(content, calls, choice.finish_reason, usage=_usage(getattr(resp, "usage", None)))
    except (TypeError, AttributeError, IndexError):
        return LLMReply(content=None, finish_reason=MALFORMED)


Connect = Callable[[str], tuple["openai.AsyncOpenAI", str]]  # a provider's name → its client and where it is


class LLM:
    """A chat-completions client bound to one model."""

    def __init__(
        self,
        client: openai.AsyncOpenAI | Callable[[], openai.AsyncOpenAI],
        model: str,
        where: str,
        metrics: Metrics | None = None,
        *,
        connect: Connect | None = None,
    ) -> None:
        """Wrap an SDK client, or what makes it on first use (a start that never asks the model never loads the
        SDK); `where` names the server in error messages; requests are counted in `metrics`; `connect` makes the
        client of another provider (for LLM_MODELS' `provider:model` entries)."""
        self._client = None if callable(client) else client  # an SDK client is not callable: its maker is
        self._make = client if callable(client) else None
        self.model = model
        self.where = where
        self.metrics = metrics if metrics is not None else Metrics()
        self.settings_hint = ("LLM_API_KEY", "LLM_MODEL")  # what an error tells to check: the key, the model
        self._connect = connect
        self._clients: dict[str, tuple[openai.AsyncOpenAI, str]] = {}  # other providers', made on first use
        self._usage_refused: set[str] = set()  # servers that refuse stream_options (shared with using()'s copies)
        self._blind: set[str] = set()  # "server model" pairs that refused an image (shared the same way)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        max_retries: int = 2,
        metrics: Metrics | None = None,
        providers: Mapping[str, ProviderInfo] = PROVIDERS,
    ) -> LLM:
        """Build the client for the configured provider (LLM_BASE_URL overrides its URL); other providers' clients
        (at `providers`' URLs, with their `<PROVIDER>_API_KEY`) are made when a model of theirs is first used."""
        info = providers[settings.LLM_PROVIDER]
        base_url = settings.LLM_BASE_URL or info.base_url
        key = settings.LLM_API_KEY.get_secret_value() if settings.LLM_API_KEY else "not-needed"

        def connect(provider: str) -> tuple[openai.AsyncOpenAI, str]:
            url, secret = providers[provider].base_url, settings.provider_key(provider)
            other = secret.get_secret_value() if secret else "not-needed"
            return openai_client(url, other, max_retries, settings.AGENT_STEP_TIMEOUT), server_host(url)

        def own() -> openai.AsyncOpenAI:
            return openai_client(base_url, key, max_retries, settings.AGENT_STEP_TIMEOUT)

        model = settings.LLM_MODEL or info.default_model
        llm = cls(own, model, server_host(base_url), metrics, connect=connect)
        if not settings.model_off:
            llm.client  # noqa: B018 (a configured model: the SDK loads now, not in the first person's turn)
        return llm

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The SDK client of the configured provider (or of a person's chosen one), made on first use."""
        if self._client is None:
            assert self._make is not None
            self._client = self._make()
        return self._client

    @client.setter
    def client(self, client: openai.AsyncOpenAI) -> None:
        """Use `client` from now on."""
        self._client = client

    def using(self, choice: ModelChoice | None) -> LLM:
        """This LLM for a person's chosen model (None: the default, itself): the same client for the configured
        provider, another provider's client (one per provider, made on first use and kept) for a pair."""
        if choice is None or (choice.provider is None and choice.model == self.model):
            return self
        self.client  # noqa: B018 (made now, so the copy shares it: clients are closed only through the original)
        chosen = copy.copy(self)  # shares the metrics and the clients
        chosen.model = choice.model
        chosen.settings_hint = ("LLM_API_KEY", "LLM_MODELS")
        if choice.provider is not None:
            made = self._clients.get(choice.provider)
            if made is None:
                assert self._connect is not None, "an LLM made without `connect` serves only its own provider"
                made = self._clients[choice.provider] = self._connect(choice.provider)
            chosen.client, chosen.where = made
            chosen.settings_hint = (f"{choice.provider.upper()}_API_KEY", "LLM_MODELS")
        return chosen

    async def aclose(self) -> None:
        """Close the HTTP clients made (the configured provider's and the others)."""
        if self._client is not None:
            await self._client.close()
        for client, _ in self._clients.values():
            await client.close()

    def _unavailable(self, e: openai.OpenAIError) -> LLMUnavailable:
        """A user-readable error for a failed request."""
        import openai

        detail = failure_detail(e, *self.settings_hint)
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
        """Yield text deltas (when streaming), then exactly one LLMReply; the whole call is bounded and measured. A
        request with images that the server refuses is sent again without them (the reply says so), and this model
        is known not to see images from then on (sees_images)."""
        answered = False
        try:
            async with aclosing(self._measured(messages, tools, stream, timeout, tool_choice)) as items:
                async for item in items:
                    answered = True
                    yield item
            return
        except LLMUnavailable as e:
            if answered or not e.refused or not drop_images(messages):
                raise
            self._blind.add(f"{self.where} {self.model}")
            log.warning(
                "the model %s at %s refused an image: it gets photos as text from now on", self.model, self.where
            )
        async with aclosing(self._measured(messages, tools, stream, timeout, tool_choice)) as items:
            async for item in items:
                if isinstance(item, LLMReply):
                    item.images_refused = True
                yield item

    def sees_images(self) -> bool:
        """False once this model refused a request with images (in this process)."""
        return f"{self.where} {self.model}" not in self._blind

    async def _measured(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        stream: bool,
        timeout: float,
        tool_choice: str | None,
    ) -> AsyncGenerator[str | LLMReply, None]:
        """One bounded model call, measured in the metrics."""
        started = time.monotonic()
        try:
            async with aclosing(self._chat(messages, tools, stream, timeout, tool_choice)) as items:
                async for item in items:
                    if isinstance(item, LLMReply):
                        item.model = self.model  # what the usage is recorded under
                        self.metrics.llm_seconds.observe(time.monotonic() - started)
                        if item.finish_reason == MALFORMED:
                            self.metrics.llm_errors.labels("malformed").inc()
                    yield item
        except (LLMTimeout, LLMUnavailable) as e:
            self.metrics.llm_seconds.observe(time.monotonic() - started)
            kind = "timeout" if isinstance(e, LLMTimeout) else "refused" if e.refused else "unavailable"
            self.metrics.llm_errors.labels(kind).inc()
            raise

    async def _open_stream(self, kwargs: dict[str, Any], deadline: float) -> AsyncStream[object]:
        """Start a streamed request that asks for its usage at the end; a server that refuses the option (a 400 or 422
        naming it: Groq and Mistral once did) is asked again without it, and from then on never with it."""
        import openai

        if self.where not in self._usage_refused:
            try:
                return await self._post_stream({**kwargs, "stream_options": {"include_usage": True}}, deadline)
            except openai.APIStatusError as e:
                if e.status_code not in (400, 422) or "stream_options" not in f"{e.message} {e.body}":
                    raise
                log.info("the model at %s refuses stream_options: streamed answers go without usage", self.where)
                self._usage_refused.add(self.where)
        return await self._post_stream(kwargs, deadline)

    async def _post_stream(self, body: dict[str, Any], deadline: float) -> AsyncStream[object]:
        """The streamed request itself, bounded by the step's deadline. Its chunks come as plain JSON objects: building
        the SDK's model of each chunk cost more CPU than the rest of a turn's work on it (one chunk per token)."""
        from openai import AsyncStream

        return await asyncio.wait_for(
            self.client.post(
                "/chat/completions",
                body={**body, "stream": True},
                cast_to=object,
                stream=True,
                stream_cls=AsyncStream[object],
            ),
            max(0.0, deadline - time.monotonic()),
        )

    async def _chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        stream: bool,
        timeout: float,
        tool_choice: str | None,
    ) -> AsyncGenerator[str | LLMReply, None]:
        """One request: text deltas (when streaming), then exactly one LLMReply."""
        import openai
        from openai.types.chat import ChatCompletion

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
            chunks = await self._open_stream(kwargs, deadline)
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
                    if not isinstance(chunk, dict):  # JSON, but not a chunk: the reply is unusable
                        log.warning("the model at %s sent a streamed event that is no object", self.where)
                        yield LLMReply(content=None, finish_reason=MALFORMED)
                        return
                    for ch in _objects(chunk.get("choices")):
                        delta = ch.get("delta") or {}
                        content = delta.get("content") if isinstance(delta, dict) else None
                        if isinstance(content, str) and (content := strip_nul(content)):
                            parts.append(content)
                            yield content
                        for tc in _objects(delta.get("tool_calls") if isinstance(delta, dict) else None):
                            index, fn = tc.get("index"), tc.get("function")
                            if not isinstance(fn, dict) and not tc.get("id"):
                                continue  # no piece of a call
                            fn = fn if isinstance(fn, dict) else {}
                            slot = partial.setdefault(index if isinstance(index, int) else 0, dict(_NO_CALL))
                            if isinstance(tc.get("id"), str) and tc["id"]:
                                slot["id"] = tc["id"]
                            if isinstance(fn.get("name"), str):
                                slot["name"] += fn["name"]
                            if isinstance(fn.get("arguments"), str):
                                slot["arguments"] += fn["arguments"]
                        if isinstance(ch.get("finish_reason"), str):
                            reply.finish_reason = ch["finish_reason"]
                    reply.usage = _usage(chunk.get("usage")) or reply.usage  # the last chunk's (asked by include_usage)
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
