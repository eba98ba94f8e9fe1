"""An MCP server's errors as one line for the model and the log, without secrets (core/mcp_servers/connection.py
describes every failure with it). The SDK and httpx2 are imported where an error is described, not at the top."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

from core.constants import MCP_LINE_CHARS
from core.mcp_servers.config import ServerConfig
from core.mcp_servers.results import clean
from core.quoting import truncate

_URL_TAIL = re.compile(r"(\b[a-z][a-z0-9+.-]*://)(?:[^\s/@]*@)?([^\s?#]*)[?#]\S*", re.IGNORECASE)


def describe(error: BaseException, config: ServerConfig, more_secrets: Sequence[str] = ()) -> str:
    """`error` of the server of `config` as one line with no secret in it: no env or header value (of `config`, or
    `more_secrets`: a person's), no URL query or user."""
    import httpx2
    from mcp.shared.exceptions import MCPError

    leaf = _leaf(error)
    if isinstance(leaf, httpx2.ConnectError | httpx2.ConnectTimeout):
        text = f"cannot connect to {_origin(config.url or '')}"
    elif isinstance(leaf, httpx2.TimeoutException):
        text = "the server did not answer in time"
    elif isinstance(leaf, httpx2.HTTPStatusError):
        text = f"HTTP {leaf.response.status_code}"
    elif isinstance(leaf, httpx2.HTTPError):
        text = f"network error ({type(leaf).__name__})"
    elif isinstance(leaf, FileNotFoundError | PermissionError) and config.command:
        text = f"cannot start {os.path.basename(config.command)}: {leaf.strerror or type(leaf).__name__}"
    elif isinstance(leaf, MCPError):
        text = leaf.message or f"error {leaf.code}"
    elif isinstance(leaf, TimeoutError):
        text = str(leaf) or "no answer in time"
    elif isinstance(leaf, OSError):
        text = leaf.strerror or type(leaf).__name__
    else:
        text = f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__
    return truncate(_scrub(clean(text), config, more_secrets), MCP_LINE_CHARS, one_line=True)


def _scrub(text: str, config: ServerConfig, more_secrets: Sequence[str]) -> str:
    """`text` without env and header values (nor their words after an auth scheme) and URL queries."""
    text = _URL_TAIL.sub(r"\1\2", text)
    values = [*config.env.values(), *config.headers.values(), *more_secrets]
    secrets = {v for value in values for v in (value, *value.split()) if len(v) >= 4}
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "…")
    return text


def _leaf(error: BaseException) -> BaseException:
    """The first real exception inside exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _origin(url: str) -> str:
    """scheme://host:port of a URL (never its path, query or user)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
