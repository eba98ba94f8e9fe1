"""Web search through the provider the operator chose (issue 34, docs/web.md#search): SearXNG, Brave, Tavily or
DuckDuckGo; `none` offers no search at all.

One search returns at most WEB_SEARCH_MAX_RESULTS results (title, address, snippet) and the same search is answered
from memory for WEB_SEARCH_CACHE_S. Every failure (the provider down, an HTTP error, a 429, an answer that is not the
JSON expected, WEB_SEARCH_TIMEOUT_S passed) is a `SearchFailed` with one line that names no key and holds no traceback;
the log gets the same line. The provider's address is the operator's and trusted: unlike a page fetch, it is not
checked against private addresses. DuckDuckGo's library (ddgs) is imported only when it searches.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import os
import re
import socket
import ssl
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aiohttp

from core.constants import (
    WEB_SEARCH_CACHE_ENTRIES,
    WEB_SEARCH_CACHE_S,
    WEB_SEARCH_ERROR_CHARS,
    WEB_SEARCH_MAX_RESULTS,
    WEB_SEARCH_QUERY_CHARS,
    WEB_SEARCH_SNIPPET_CHARS,
    WEB_SEARCH_TIMEOUT_S,
    WEB_SEARCH_TITLE_CHARS,
)
from core.settings import SearchProvider, Settings, redact
from core.textsafe import strip_nul
from core.timeutil import Clock, system_clock

logger = logging.getLogger(__name__)

BRAVE_URL = "https://api.search.brave.com/res/v1/web/search"  # Brave Search API, web results
TAVILY_URL = "https://api.tavily.com/search"
LABELS: dict[SearchProvider, str] = {
    "searxng": "SearXNG",
    "brave": "Brave",
    "tavily": "Tavily",
    "duckduckgo": "DuckDuckGo",
    "none": "no provider",
}
KEY_SETTINGS: dict[SearchProvider, str] = {"brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY"}
# where each provider's answer keeps its results, and the fields of one result that are its title, address, snippet
SHAPES: dict[SearchProvider, tuple[tuple[str, ...], str, str, str]] = {
    "searxng": (("results",), "title", "url", "content"),
    "brave": (("web", "results"), "title", "url", "description"),
    "tavily": (("results",), "title", "url", "content"),
    "duckduckgo": (("results",), "title", "href", "body"),  # ddgs's rows, as {"results": rows}
}
TAG = re.compile(r"</?[A-Za-z][^<>]*>")  # Brave marks the words searched for with <strong>


@dataclass(frozen=True, slots=True)
class Result:
    """One search result: the page's title, its http(s) address and the provider's snippet of it (plain text)."""

    title: str
    url: str
    snippet: str


@dataclass(frozen=True, slots=True)
class SearchFailed:
    """A search that did not work: `message` is one line for the model and the person (no key, no traceback)."""

    message: str


class ProviderError(Exception):
    """A provider's failure, already said in one line without a secret (for `Search.search` to return)."""


def chosen_provider(settings: Settings) -> SearchProvider:
    """WEB_SEARCH_PROVIDER, or when it is unset the first configured of SearXNG (SEARXNG_URL), Brave (BRAVE_API_KEY)
    and Tavily (TAVILY_API_KEY), else DuckDuckGo (which needs nothing)."""
    if settings.WEB_SEARCH_PROVIDER is not None:
        return settings.WEB_SEARCH_PROVIDER
    if settings.SEARXNG_URL is not None:
        return "searxng"
    if settings.BRAVE_API_KEY is not None:
        return "brave"
    if settings.TAVILY_API_KEY is not None:
        return "tavily"
    return "duckduckgo"


def clamp_count(count: int) -> int:
    """The number of results asked for, kept within 1 and WEB_SEARCH_MAX_RESULTS."""
    return max(1, min(int(count), WEB_SEARCH_MAX_RESULTS))


def plain(value: object, limit: int) -> str:
    """A provider's text as one plain line: HTML tags and entities undone, whitespace collapsed, cut to `limit`."""
    if not isinstance(value, str):
        return ""
    text = " ".join(html.unescape(TAG.sub("", strip_nul(value))).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def results_of(provider: SearchProvider, payload: object, count: int) -> list[Result]:
    """The first `count` results of a provider's answer (decoded JSON), each with an http(s) address, none twice; a
    ProviderError when the answer is not shaped as that provider's."""
    path, title_key, url_key, snippet_key = SHAPES[provider]
    items: object = payload
    for key in path:
        if not isinstance(items, dict):
            raise ProviderError(f"{LABELS[provider]}'s answer was not the JSON expected (no {'.'.join(path)})")
        if key not in items:  # Brave leaves out `web` when nothing was found
            return []
        items = items[key]
    if not isinstance(items, list):
        raise ProviderError(f"{LABELS[provider]}'s answer was not the JSON expected ({'.'.join(path)} is no list)")
    results: list[Result] = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        url = item.get(url_key)
        if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")) or url in seen:
            continue
        seen.add(url)
        title = plain(item.get(title_key), WEB_SEARCH_TITLE_CHARS) or url
        results.append(Result(title, strip_nul(url), plain(item.get(snippet_key), WEB_SEARCH_SNIPPET_CHARS)))
        if len(results) == count:
            break
    return results


def one_line(text: str, limit: int = WEB_SEARCH_ERROR_CHARS) -> str:
    """`text` on one line, cut to `limit`."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def duckduckgo_rows(query: str, count: int, timeout_s: float) -> list[dict[str, Any]]:
    """DuckDuckGo's results through ddgs, in a worker thread (the library is synchronous). ddgs is imported here, so
    only a bot that searches DuckDuckGo loads it; its backend is pinned to DuckDuckGo (ddgs's default, `auto`, asks
    other engines too, which the operator did not choose)."""
    from ddgs import DDGS
    from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException

    try:
        return DDGS(timeout=max(1, round(timeout_s))).text(
            query, max_results=count, backend="duckduckgo", region="wt-wt", safesearch="moderate"
        )
    except RatelimitException:
        raise ProviderError("DuckDuckGo refused: too many searches; try again later") from None
    except TimeoutException:
        raise ProviderError(f"DuckDuckGo did not answer within {timeout_s:g} s") from None
    except DDGSException as e:
        if str(e) == "No results found.":  # also what ddgs says when DuckDuckGo answered with no result page
            return []
        raise ProviderError(f"DuckDuckGo could not be searched ({one_line(str(e))})") from None


def connection_problem(e: aiohttp.ClientError) -> str:
    """What went wrong with the connection, in a few words (no address, no header)."""
    if isinstance(e, aiohttp.ClientConnectorError):
        err = e.os_error
        if isinstance(err, socket.gaierror):
            return "its name could not be resolved"
        if isinstance(err, ssl.SSLError | ssl.CertificateError):
            return "its TLS certificate was not accepted"
        return os.strerror(err.errno).lower() if err.errno else one_line(err.strerror or type(err).__name__)
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "the connection was closed"
    if isinstance(e, aiohttp.ClientPayloadError):
        return "the answer was cut off"
    return type(e).__name__


class Search:
    """Web search with the operator's provider: `search(query, count)`, answered from memory for WEB_SEARCH_CACHE_S.

    `enabled` is False for WEB_SEARCH_PROVIDER=none (the tool is not offered). The HTTP session opens at the first
    search; `close()` closes it. `brave_url` and `tavily_url` are the providers' endpoints (tests point them at fakes);
    `clock` says when a remembered search is too old.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock = system_clock,
        brave_url: str = BRAVE_URL,
        tavily_url: str = TAVILY_URL,
        timeout_s: float = WEB_SEARCH_TIMEOUT_S,
        cache_s: float = WEB_SEARCH_CACHE_S,
        cache_entries: int = WEB_SEARCH_CACHE_ENTRIES,
    ) -> None:
        """Choose the provider (chosen_provider) and keep what it needs; nothing is opened or imported yet."""
        self.provider: SearchProvider = chosen_provider(settings)
        self._searxng_url = settings.SEARXNG_URL
        secret = {"brave": settings.BRAVE_API_KEY, "tavily": settings.TAVILY_API_KEY}.get(self.provider)
        self._key = secret.get_secret_value() if secret is not None else ""
        self._brave_url = brave_url
        self._tavily_url = tavily_url
        self._timeout_s = timeout_s
        self._clock = clock
        self._keep = timedelta(seconds=cache_s)
        self._cache_entries = cache_entries
        self._cache: OrderedDict[tuple[str, str, int], tuple[datetime, tuple[Result, ...]]] = OrderedDict()
        self._session: aiohttp.ClientSession | None = None

    @property
    def enabled(self) -> bool:
        """Whether there is a provider to search with (False: WEB_SEARCH_PROVIDER=none, the tool is not offered)."""
        return self.provider != "none"

    @property
    def label(self) -> str:
        """The provider's name as people know it (SearXNG, Brave, …)."""
        return LABELS[self.provider]

    async def search(self, query: str, count: int) -> list[Result] | SearchFailed:
        """At most `count` results (kept within 1 and WEB_SEARCH_MAX_RESULTS) for `query`, or one line saying why not.
        The same (provider, query, count) within WEB_SEARCH_CACHE_S is answered from memory, without a request."""
        if not self.enabled:
            return SearchFailed("web search is off here (WEB_SEARCH_PROVIDER=none)")
        text = " ".join(strip_nul(query).split())
        if not text:
            return SearchFailed("web search needs a query: the words to search for")
        if len(text) > WEB_SEARCH_QUERY_CHARS:
            return SearchFailed(f"the search query is longer than {WEB_SEARCH_QUERY_CHARS} characters: use fewer words")
        n = clamp_count(count)
        key = (self.provider, text, n)
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and now < hit[0]:
            self._cache.move_to_end(key)
            return list(hit[1])
        try:
            async with asyncio.timeout(self._timeout_s):
                results = await self._ask(text, n)
        except ProviderError as e:
            return self._failed(str(e))
        except TimeoutError:
            return self._failed(f"{self.label} did not answer within {self._timeout_s:g} s")
        except aiohttp.ClientError as e:
            return self._failed(f"{self.label} could not be reached ({connection_problem(e)})")
        except Exception as e:  # a surprise in a library: still one line for the person, the kind of error logged
            return self._failed(f"{self.label} could not be searched ({type(e).__name__})")
        self._remember(key, now, results)
        return results

    async def close(self) -> None:
        """Close the HTTP session (a later search opens a new one)."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    async def _ask(self, query: str, count: int) -> list[Result]:
        """The provider's results for one search (no cache); a ProviderError or the HTTP client's error on failure."""
        if self.provider == "searxng":
            assert self._searxng_url is not None, "the settings require SEARXNG_URL for searxng"
            params = {"q": query, "format": "json"}
            payload = await self._json("GET", f"{self._searxng_url}/search", params=params)
        elif self.provider == "brave":
            headers = {"X-Subscription-Token": self._key, "Accept": "application/json"}
            params = {"q": query, "count": str(count)}
            payload = await self._json("GET", self._brave_url, params=params, headers=headers)
        elif self.provider == "tavily":
            headers = {"Authorization": f"Bearer {self._key}"}
            body = {"query": query, "max_results": count, "search_depth": "basic"}
            payload = await self._json("POST", self._tavily_url, body=body, headers=headers)
        else:
            rows = await asyncio.to_thread(duckduckgo_rows, query, count, self._timeout_s)
            payload = {"results": rows}
        results = results_of(self.provider, payload, count)
        if not results and self.provider == "searxng":
            stalled = unresponsive_engines(payload)
            if stalled:
                raise ProviderError(f"SearXNG found nothing: its engines did not answer ({stalled})")
        return results

    async def _json(
        self,
        method: str,
        url: str,
        *,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> object:
        """One request to the provider, its JSON answer decoded; a ProviderError for a status other than 200 or an
        answer that is not JSON."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s))
        async with self._session.request(method, url, params=params, json=body, headers=headers) as resp:
            if resp.status != 200:
                raise ProviderError(self._status_line(resp.status))
            raw = await resp.read()
        try:
            return json.loads(raw)
        except ValueError:
            raise ProviderError(f"{self.label}'s answer was not JSON") from None

    def _status_line(self, status: int) -> str:
        """What an HTTP status other than 200 means, with what to do about it where there is something."""
        if status == 429:
            return f"{self.label} refused: too many searches (HTTP 429); try again later"
        if status in (401, 403) and self.provider in KEY_SETTINGS:
            return f"{self.label} refused the key (HTTP {status}): check {KEY_SETTINGS[self.provider]}"
        if status == 403 and self.provider == "searxng":
            return "SearXNG refused the JSON format (HTTP 403): add json to search.formats in its settings.yml"
        if status == 404 and self.provider == "searxng":
            return "SearXNG has no /search (HTTP 404): is SEARXNG_URL the address of its start page?"
        kind = "is in trouble" if status >= 500 else "refused the search"
        return f"{self.label} {kind} (HTTP {status})"

    def _failed(self, line: str) -> SearchFailed:
        """The failure as the person and the log see it: one line, the key taken out should it ever appear."""
        message = redact(f"web search failed: {line}", [self._key] if self._key else [])
        logger.warning("%s", message)
        return SearchFailed(message)

    def _remember(self, key: tuple[str, str, int], now: datetime, results: list[Result]) -> None:
        """Keep a search's results until WEB_SEARCH_CACHE_S from `now`, the least recently used going past the cap."""
        self._cache[key] = (now + self._keep, tuple(results))
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)


def unresponsive_engines(payload: object) -> str:
    """SearXNG's engines that did not answer (`unresponsive_engines`: [name, reason] pairs), as `google (timeout), …`;
    empty when none is named."""
    stalled = payload.get("unresponsive_engines") if isinstance(payload, dict) else None
    if not isinstance(stalled, list):
        return ""
    named = [
        f"{pair[0]} ({pair[1]})" if len(pair) > 1 and pair[1] else str(pair[0])
        for pair in stalled
        if isinstance(pair, list | tuple) and pair
    ]
    return one_line(", ".join(named))
