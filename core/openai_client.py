"""The openai SDK's client for one OpenAI-compatible server, and how its failures are told (the host, never a key)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from core.constants import MODEL_CONNECT_TIMEOUT_S, REASON_CHARS
from core.quoting import truncate

if TYPE_CHECKING:  # the SDK loads with the first client made (a start without a model never loads it)
    import openai


def openai_client(base_url: str, key: str, max_retries: int, timeout: float) -> openai.AsyncOpenAI:
    """An SDK client for one server: the SDK's retries, `timeout` seconds per request, aiohttp underneath."""
    import openai

    return openai.AsyncOpenAI(
        api_key=key,
        base_url=base_url,
        max_retries=max_retries,
        timeout=openai.Timeout(timeout, connect=MODEL_CONNECT_TIMEOUT_S),
        http_client=openai.DefaultAioHttpClient(),  # cheaper per request than httpx (DESIGN §5)
    )


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


def _reason(e: openai.APIStatusError) -> str:
    """The server's reason for refusing a request, on one short line ('' when it gave none)."""
    body = e.body
    text: object = body.get("message") if isinstance(body, dict) else body
    if not isinstance(text, str) or not text.strip():
        return ""
    return truncate(text, REASON_CHARS, one_line=True)


def failure_detail(e: openai.OpenAIError, key_setting: str, model_setting: str) -> str:
    """What went wrong with a request, for a user's line (`it answered 404: … (check LLM_MODEL)`): the status and
    the server's reason (none for 401/403, which could echo the key, or a 5xx), `it timed out` or `it is
    unreachable`; `key_setting` and `model_setting` name what to check on a refused key or an unknown model."""
    import openai

    if isinstance(e, openai.APIStatusError):
        detail = f"it answered {e.status_code}"
        if e.status_code in (401, 403):
            return detail + f" (check {key_setting})"
        reason = _reason(e) if e.status_code < 500 else ""
        detail += f": {reason.rstrip('.')}" if reason else ""
        return detail + (f" (check {model_setting})" if e.status_code == 404 else "")
    if isinstance(e, openai.APITimeoutError) and not _refused(e):
        return "it timed out"
    return "it is unreachable"
