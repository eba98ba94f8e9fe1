"""Web search (core/web/search.py) against fake SearXNG, Brave and Tavily servers on 127.0.0.1 and a fake DuckDuckGo
results page: results mapped and cut to the count, the memory of recent searches (an injected clock, no sleeping),
every failure one line without the key, the provider chosen from the settings, and the settings' checks."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from core.constants import WEB_SEARCH_CACHE_S, WEB_SEARCH_MAX_RESULTS
from core.settings import Settings, SettingsError, load_settings
from core.web.search import Result, Search, SearchFailed, chosen_provider, results_of
from tests.loopback import LoopbackServer

ROOT = Path(__file__).resolve().parent.parent
BRAVE_KEY = "BSA-brave-secret-0123456789"
TAVILY_KEY = "tvly-dev-secret-0123456789"


@dataclass
class Seen:
    """One request a fake provider got."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


class FakeProviders(LoopbackServer):
    """SearXNG at /searxng, Brave at /brave/res/v1/web/search, Tavily at /tavily/search and DuckDuckGo's HTML page at
    /ddg/html/, each answering `hits` results (Brave and Tavily at most the count asked for). `status`, `raw` and
    `delay` make every provider fail: an HTTP status whose body repeats the keys, a body that is not JSON, a slow
    answer."""

    def __init__(self, hits: int = 12) -> None:
        """The routes; nothing failing yet."""
        super().__init__()
        self.hits = hits
        self.status = 200
        self.raw: bytes | None = None
        self.delay = 0.0
        self.seen: list[Seen] = []
        self._app.router.add_get("/searxng/search", self._searxng)
        self._app.router.add_get("/brave/res/v1/web/search", self._brave)
        self._app.router.add_post("/tavily/search", self._tavily)
        self._app.router.add_post("/ddg/html/", self._duckduckgo)

    def searches(self, path: str) -> list[Seen]:
        """The requests to one provider's path."""
        return [s for s in self.seen if s.path == path]

    async def _record(self, request: web.Request) -> web.Response | None:
        """Note the request; the failure being played, if any."""
        body = await request.read()
        self.seen.append(Seen(request.method, request.path, dict(request.query), dict(request.headers), body))
        self._notify()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.status != 200:
            leak = json.dumps({"error": f"no: {BRAVE_KEY} {TAVILY_KEY}"})  # a provider repeating the key it got
            return web.Response(status=self.status, text=leak, content_type="application/json")
        if self.raw is not None:
            return web.Response(body=self.raw, content_type="text/html")
        return None

    def _items(self, n: int, snippet_key: str) -> list[dict[str, Any]]:
        """`n` results shaped as a provider's, the first one with HTML in its title and a duplicate address after it."""
        items = [
            {"title": f"Result {i}", "url": f"https://example.com/{i}", snippet_key: f"About   result\n{i}"}
            for i in range(1, n + 1)
        ]
        if items:
            items[0]["title"] = "<strong>Result</strong> 1 &amp; more"
        return items

    async def _searxng(self, request: web.Request) -> web.Response:
        """SearXNG's JSON API: it has no count, it answers a page of results."""
        if (failed := await self._record(request)) is not None:
            return failed
        return web.json_response({"query": request.query["q"], "results": self._items(self.hits, "content")})

    async def _brave(self, request: web.Request) -> web.Response:
        """Brave's web search: `count` results at most, under web.results."""
        if (failed := await self._record(request)) is not None:
            return failed
        items = self._items(min(self.hits, int(request.query.get("count", "20"))), "description")
        return web.json_response({"type": "search", "web": {"type": "search", "results": items}})

    async def _tavily(self, request: web.Request) -> web.Response:
        """Tavily's search: `max_results` results at most."""
        if (failed := await self._record(request)) is not None:
            return failed
        asked = await request.json()
        items = self._items(min(self.hits, int(asked.get("max_results", 5))), "content")
        return web.json_response({"query": asked["query"], "results": items, "response_time": 0.5})

    async def _duckduckgo(self, request: web.Request) -> web.Response:
        """DuckDuckGo's HTML results page (html.duckduckgo.com/html/), as ddgs reads it."""
        if (failed := await self._record(request)) is not None:
            return failed
        blocks = "".join(
            f'<div class="result results_links web-result"><div class="links_main links_deep result__body">'
            f'<h2 class="result__title"><a class="result__a" href="https://example.com/{i}">Result {i}</a></h2>'
            f'<a class="result__snippet" href="https://example.com/{i}">About <b>result</b> {i}</a></div></div>'
            for i in range(1, self.hits + 1)
        )
        return web.Response(text=f"<html><body><div id='links'>{blocks}</div></body></html>", content_type="text/html")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        """Start at a fixed moment."""
        self.now = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        """The current (fake) time."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move on by `seconds`."""
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No configuration from the environment or a .env in the working directory."""
    monkeypatch.chdir(tmp_path)
    for name in Settings.model_fields:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
async def fake() -> Any:
    """The fake providers, started."""
    async with FakeProviders() as server:
        yield server


@pytest.fixture
def warnings_seen(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The log records of the search module (warnings and up)."""
    with caplog.at_level(logging.WARNING, logger="core.web.search"):
        yield caplog


def settings(**values: object) -> Settings:
    """Settings from `values` alone (no .env)."""
    return load_settings(_env_file=None, **values)


def searching(fake: FakeProviders, provider: str, clock: Clock | None = None, **options: Any) -> Search:
    """A Search with `provider` pointed at the fakes."""
    values: dict[str, object] = {
        "WEB_SEARCH_PROVIDER": provider,
        "SEARXNG_URL": f"{fake.origin}/searxng/",
        "BRAVE_API_KEY": BRAVE_KEY,
        "TAVILY_API_KEY": TAVILY_KEY,
    }
    return Search(
        settings(**values),
        clock=clock or Clock(),
        brave_url=f"{fake.origin}/brave/res/v1/web/search",
        tavily_url=f"{fake.origin}/tavily/search",
        **options,
    )


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_searxng_results_are_mapped_and_cut_to_the_count(clean_env: Path, fake: FakeProviders) -> None:
    search = searching(fake, "searxng")
    try:
        results = await search.search("  python\n asyncio ", 5)
        assert results == [
            Result("Result 1 & more", "https://example.com/1", "About result 1"),
            *(Result(f"Result {i}", f"https://example.com/{i}", f"About result {i}") for i in range(2, 6)),
        ]
        (seen,) = fake.searches("/searxng/search")
        assert seen.method == "GET" and seen.query == {"q": "python asyncio", "format": "json"}
        most = await search.search("python", 50)
        assert isinstance(most, list) and len(most) == WEB_SEARCH_MAX_RESULTS == 8
        one = await search.search("python", 0)
        assert isinstance(one, list) and len(one) == 1
    finally:
        await search.close()


async def test_brave_gets_its_key_in_its_header_and_the_count(clean_env: Path, fake: FakeProviders) -> None:
    search = searching(fake, "brave")
    try:
        results = await search.search("pydantic settings", 3)
        assert isinstance(results, list) and [r.url for r in results] == [f"https://example.com/{i}" for i in (1, 2, 3)]
        assert results[0] == Result("Result 1 & more", "https://example.com/1", "About result 1")
        (seen,) = fake.searches("/brave/res/v1/web/search")
        assert seen.method == "GET" and seen.query == {"q": "pydantic settings", "count": "3"}
        assert seen.headers["X-Subscription-Token"] == BRAVE_KEY
        assert "Authorization" not in seen.headers and TAVILY_KEY not in str(seen)
        most = await search.search("pydantic", 20)
        assert isinstance(most, list) and len(most) == 8  # Brave is asked for 8 at most
        assert fake.searches("/brave/res/v1/web/search")[-1].query["count"] == "8"
    finally:
        await search.close()


async def test_tavily_gets_the_query_and_a_bearer_key(clean_env: Path, fake: FakeProviders) -> None:
    search = searching(fake, "tavily")
    try:
        results = await search.search("tavily api", 4)
        assert isinstance(results, list) and len(results) == 4 and results[1].snippet == "About result 2"
        (seen,) = fake.searches("/tavily/search")
        assert seen.method == "POST" and seen.headers["Authorization"] == f"Bearer {TAVILY_KEY}"
        assert json.loads(seen.body) == {"query": "tavily api", "max_results": 4, "search_depth": "basic"}
        assert "X-Subscription-Token" not in seen.headers and BRAVE_KEY not in str(seen)
    finally:
        await search.close()


async def test_a_search_is_remembered_for_its_window_and_asked_again_after_it(
    clean_env: Path, fake: FakeProviders
) -> None:
    clock = Clock()
    search = searching(fake, "brave", clock)
    path = "/brave/res/v1/web/search"
    try:
        first = await search.search("the weather in Berlin", 3)
        assert await search.search("the  weather in Berlin", 3) == first  # the same words: no second request
        clock.advance(WEB_SEARCH_CACHE_S - 1)
        assert await search.search("the weather in Berlin", 3) == first
        assert len(fake.searches(path)) == 1
        assert isinstance(await search.search("the weather in Berlin", 4), list)  # another count: asked
        assert len(fake.searches(path)) == 2
        clock.advance(1)  # the window of the first has ended
        assert await search.search("the weather in Berlin", 3) == first
        assert len(fake.searches(path)) == 3
        fake.status = 500
        clock.advance(WEB_SEARCH_CACHE_S)
        assert isinstance(await search.search("the weather in Berlin", 3), SearchFailed)
        fake.status = 200
        assert await search.search("the weather in Berlin", 3) == first  # a failure is not remembered
        assert len(fake.searches(path)) == 5
    finally:
        await search.close()


async def test_the_memory_keeps_only_the_searches_used_last(clean_env: Path, fake: FakeProviders) -> None:
    search = searching(fake, "searxng", cache_entries=2)
    try:
        for query in ("one", "two", "one", "three"):  # "two" is the least recently used when "three" comes
            await search.search(query, 3)
        assert [s.query["q"] for s in fake.seen] == ["one", "two", "three"]
        await search.search("one", 3)
        await search.search("two", 3)
        assert [s.query["q"] for s in fake.seen] == ["one", "two", "three", "two"]
    finally:
        await search.close()


async def test_a_provider_that_is_down_is_one_line(clean_env: Path, warnings_seen: pytest.LogCaptureFixture) -> None:
    search = Search(settings(SEARXNG_URL=f"http://127.0.0.1:{closed_port()}"), clock=Clock())
    try:
        assert search.provider == "searxng"
        failed = await search.search("anything", 3)
        assert failed == SearchFailed("web search failed: SearXNG could not be reached (connection refused)")
    finally:
        await search.close()
    assert [r.getMessage() for r in warnings_seen.records] == [failed.message]
    assert all(r.exc_info is None for r in warnings_seen.records), "no traceback in the log"


@pytest.mark.parametrize(
    ("provider", "status", "line"),
    [
        ("brave", 429, "web search failed: Brave refused: too many searches (HTTP 429); try again later"),
        ("tavily", 429, "web search failed: Tavily refused: too many searches (HTTP 429); try again later"),
        ("brave", 401, "web search failed: Brave refused the key (HTTP 401): check BRAVE_API_KEY"),
        ("tavily", 401, "web search failed: Tavily refused the key (HTTP 401): check TAVILY_API_KEY"),
        ("tavily", 432, "web search failed: Tavily refused the search (HTTP 432)"),
        ("brave", 502, "web search failed: Brave is in trouble (HTTP 502)"),
        ("searxng", 403, "web search failed: SearXNG refused the JSON format (HTTP 403): add json to search.formats"),
        ("searxng", 404, "web search failed: SearXNG has no /search (HTTP 404): is SEARXNG_URL the address of its"),
    ],
)
async def test_an_http_error_is_one_line_without_the_key(
    clean_env: Path,
    fake: FakeProviders,
    warnings_seen: pytest.LogCaptureFixture,
    provider: str,
    status: int,
    line: str,
) -> None:
    fake.status = status
    search = searching(fake, provider)
    try:
        failed = await search.search("anything", 3)
    finally:
        await search.close()
    assert isinstance(failed, SearchFailed) and failed.message.startswith(line) and "\n" not in failed.message
    logged = "\n".join(r.getMessage() for r in warnings_seen.records)
    for text in (failed.message, logged):
        assert BRAVE_KEY not in text and TAVILY_KEY not in text
    assert logged == failed.message


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        (b"<html>Cloudflare says hi</html>", "web search failed: Tavily's answer was not JSON"),
        (b'{"results": "none"}', "web search failed: Tavily's answer was not the JSON expected (results is no list)"),
        (b"[1, 2]", "web search failed: Tavily's answer was not the JSON expected (no results)"),
    ],
)
async def test_an_answer_that_is_not_the_json_expected_is_one_line(
    clean_env: Path, fake: FakeProviders, raw: bytes, line: str
) -> None:
    fake.raw = raw
    search = searching(fake, "tavily")
    try:
        assert await search.search("anything", 3) == SearchFailed(line)
    finally:
        await search.close()


async def test_a_slow_provider_is_given_up_after_the_time_cap(clean_env: Path, fake: FakeProviders) -> None:
    fake.delay = 1.0
    search = searching(fake, "brave", timeout_s=0.2)
    try:
        assert await search.search("anything", 3) == SearchFailed(
            "web search failed: Brave did not answer within 0.2 s"
        )
    finally:
        await search.close()


async def test_searxng_names_its_engines_that_did_not_answer(clean_env: Path, fake: FakeProviders) -> None:
    fake.raw = json.dumps({"results": [], "unresponsive_engines": [["google", "timeout"], ["bing", ""]]}).encode()
    search = searching(fake, "searxng")
    try:
        assert await search.search("anything", 3) == SearchFailed(
            "web search failed: SearXNG found nothing: its engines did not answer (google (timeout), bing)"
        )
        fake.raw = b'{"results": []}'
        assert await search.search("something else", 3) == []  # nothing found is no failure
    finally:
        await search.close()


async def test_an_empty_or_overlong_query_is_refused_without_a_request(clean_env: Path, fake: FakeProviders) -> None:
    search = searching(fake, "searxng")
    try:
        assert await search.search(" \n ", 3) == SearchFailed("web search needs a query: the words to search for")
        failed = await search.search("word " * 100, 3)
        assert isinstance(failed, SearchFailed) and "longer than 400 characters" in failed.message
        assert fake.seen == []
    finally:
        await search.close()


def test_the_mapping_keeps_http_addresses_once_and_cuts_long_text() -> None:
    payload = {
        "results": [
            {"title": "a", "url": "javascript:alert(1)", "content": "x"},
            {"title": "", "url": "https://example.com/a", "content": "x" * 900},
            {"title": "again", "url": "https://example.com/a", "content": "the same address"},
            "not an object",
            {"title": "no address"},
            {"title": "b\x00", "url": "HTTP://example.com/b", "content": None},
        ]
    }
    results = results_of("searxng", payload, 8)
    assert [(r.title, r.url) for r in results] == [
        ("https://example.com/a", "https://example.com/a"),  # no title: its address
        ("b", "HTTP://example.com/b"),
    ]
    assert len(results[0].snippet) == 500 and results[0].snippet.endswith("…") and results[1].snippet == ""
    assert results_of("brave", {"type": "search"}, 8) == []  # Brave leaves out `web` when it found nothing


def test_the_provider_is_the_one_named_else_the_first_configured(clean_env: Path) -> None:
    assert chosen_provider(settings()) == "duckduckgo"
    assert chosen_provider(settings(TAVILY_API_KEY=TAVILY_KEY)) == "tavily"
    assert chosen_provider(settings(TAVILY_API_KEY=TAVILY_KEY, BRAVE_API_KEY=BRAVE_KEY)) == "brave"
    everything = {"TAVILY_API_KEY": TAVILY_KEY, "BRAVE_API_KEY": BRAVE_KEY, "SEARXNG_URL": "http://searxng:8080/"}
    assert chosen_provider(settings(**everything)) == "searxng"
    assert chosen_provider(settings(**everything, WEB_SEARCH_PROVIDER="Tavily")) == "tavily"
    assert chosen_provider(settings(**everything, WEB_SEARCH_PROVIDER="duckduckgo")) == "duckduckgo"
    assert chosen_provider(settings(BRAVE_API_KEY="")) == "duckduckgo"  # an empty variable is unset
    assert settings(SEARXNG_URL="https://search.example.org/searx/").SEARXNG_URL == "https://search.example.org/searx"


async def test_none_offers_no_search(clean_env: Path, fake: FakeProviders) -> None:
    search = Search(settings(WEB_SEARCH_PROVIDER="none", SEARXNG_URL=f"{fake.origin}/searxng"))
    assert (search.provider, search.enabled) == ("none", False)
    assert await search.search("anything", 3) == SearchFailed("web search is off here (WEB_SEARCH_PROVIDER=none)")
    assert fake.seen == []
    assert searching(fake, "duckduckgo").enabled


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WEB_SEARCH_PROVIDER": "searxng"}, "WEB_SEARCH_PROVIDER: searxng needs SEARXNG_URL (the address of your"),
        ({"WEB_SEARCH_PROVIDER": "brave", "TAVILY_API_KEY": TAVILY_KEY}, "WEB_SEARCH_PROVIDER: brave needs BRAVE_API"),
        ({"WEB_SEARCH_PROVIDER": "TAVILY", "BRAVE_API_KEY": BRAVE_KEY}, "WEB_SEARCH_PROVIDER: tavily needs TAVILY_API"),
        ({"WEB_SEARCH_PROVIDER": "google"}, "WEB_SEARCH_PROVIDER: must be 'searxng', 'brave', 'tavily', 'duckduckgo'"),
        ({"SEARXNG_URL": "searxng:8080"}, "SEARXNG_URL: must be the http(s) address of your SearXNG"),
        ({"SEARXNG_URL": f"http://me:{BRAVE_KEY}@searxng:8080"}, "SEARXNG_URL: must be the http(s) address of your"),
        ({"USER_DAILY_WEB_CALLS": "-1"}, "USER_DAILY_WEB_CALLS: must be greater than or equal to 0 (got '-1')"),
    ],
)
def test_a_search_setting_that_cannot_work_stops_the_start_with_one_line(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as e:
        load_settings()
    message = str(e.value)
    assert message.startswith(expected) and "\n" not in message
    assert BRAVE_KEY not in message and TAVILY_KEY not in message


def test_the_keys_are_secrets(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRAVE_API_KEY", BRAVE_KEY)
    monkeypatch.setenv("TAVILY_API_KEY", TAVILY_KEY)
    s = load_settings()
    assert s.USER_DAILY_WEB_CALLS == 200 and s.WEB_SEARCH_PROVIDER is None
    assert BRAVE_KEY not in repr(s) and TAVILY_KEY not in repr(s)
    assert {BRAVE_KEY, TAVILY_KEY} <= set(s.secret_values())  # redacted from start-up errors and last-error.txt


def test_choosing_duckduckgo_imports_no_search_library_at_start(clean_env: Path) -> None:
    code = (
        "import sys\n"
        "import core\n"
        "from core.settings import load_settings\n"
        "from core.web.search import Search\n"
        "search = Search(load_settings(WEB_SEARCH_PROVIDER='duckduckgo', _env_file=None))\n"
        "assert search.provider == 'duckduckgo' and search.enabled\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] in ('ddgs', 'primp')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


async def test_duckduckgo_results_come_through_ddgs_from_its_results_page(
    clean_env: Path, fake: FakeProviders, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddgs.engines.duckduckgo import Duckduckgo

    monkeypatch.delenv("DDGS_PROXY", raising=False)
    monkeypatch.setattr(Duckduckgo, "search_url", f"{fake.origin}/ddg/html/")  # ddgs's one address for it
    search = searching(fake, "duckduckgo")
    try:
        results = await search.search("ddgs results", 3)
        assert isinstance(results, list) and len(results) == 3
        assert {r.url for r in results} == {f"https://example.com/{i}" for i in (1, 2, 3)}
        assert all(r.title == f"Result {r.url[-1]}" and r.snippet == f"About result {r.url[-1]}" for r in results)
        (seen,) = fake.searches("/ddg/html/")
        assert "q=ddgs+results" in seen.body.decode()
        fake.hits = 0
        assert await search.search("nothing at all", 3) == []  # ddgs's "No results found." is no failure
        monkeypatch.setattr(Duckduckgo, "search_url", f"http://127.0.0.1:{closed_port()}/html/")
        failed = await search.search("down", 3)
        assert isinstance(failed, SearchFailed) and failed.message.startswith(
            "web search failed: DuckDuckGo could not be searched ("
        )
        assert "\n" not in failed.message
    finally:
        await search.close()
