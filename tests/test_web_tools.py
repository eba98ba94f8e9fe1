"""The web tools in real turns: a page read is cited at the answer's end, taints the turn (no admin tool offered from
then on, nor in later turns while it is replayed), a refused fetch reaches no server and the model reads one
`refused:` line, and the person's daily web calls are capped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from core.activity import step_line
from core.constants import WEB_PAGES_KEEP_S
from tests.adapter_kit.conftest import searx
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, incoming, run, tool_messages, tool_names
from tests.test_console import bot_cli
from tests.test_http_api import ANN, Serve, token_of
from tests.test_http_api import serve as serve  # its fixture
from tests.test_web_fetch import Site, article, html

ADMIN = "telegram:100"
ADMIN_TOOLS = {"execute_sql", "write_capability", "manage_capability", "restart"}


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    """A page on 127.0.0.1 that WEB_ALLOW_PRIVATE lets the bot read."""
    async with Site({"/tides": html(article()), "/search": searx}) as served:
        yield served


@pytest.fixture
async def bystander() -> AsyncIterator[Site]:
    """A loopback server nobody allowed."""
    async with Site() as served:
        yield served


async def test_a_page_read_is_cited_and_the_turn_gets_no_admin_tool_after_it(
    make_core: MakeCore, fake_llm: FakeOpenAI, site: Site
) -> None:
    core = make_core(ADMINS=ADMIN, WEB_ALLOW_PRIVATE=f"127.0.0.1:{site.port}")
    url = f"http://127.0.0.1:{site.port}/tides"
    fake_llm.script(Reply(tool_calls=[("web_fetch", {"url": url})]), Reply(text="Two high tides a day."))
    said = answer(await run(core, incoming("how do tides work?", user="100")))
    assert said.text == (f"Two high tides a day.\n\nSources:\n1. [How tides work]({url}) — 127.0.0.1")
    first, second = fake_llm.requests
    assert ADMIN_TOOLS <= set(tool_names(first)), "an admin's own words: admin tools offered"
    assert not ADMIN_TOOLS & set(tool_names(second)), "after the page came in: none"
    [page] = tool_messages(second)
    assert page["ok"] and "gravitational forces" in page["result"]["text"] and page["result"]["pages"] == 1
    assert site.requests == ["/tides"]
    assert [step_line(s) for s in said.steps] == [f"✅ web_fetch → {url}"]  # the steps show what was read
    fake_llm.script(Reply(text="ok"))
    answer(await run(core, incoming("thanks", user="100")))
    later = fake_llm.requests[-1]
    assert not ADMIN_TOOLS & set(tool_names(later)), "the page is still in the replayed context"
    replayed = [m for m in later["messages"] if m["role"] == "tool"]
    assert replayed and "gravitational forces" in replayed[0]["content"]


async def test_a_refused_fetch_reaches_no_server_and_the_model_reads_why(
    make_core: MakeCore, fake_llm: FakeOpenAI, site: Site, bystander: Site
) -> None:
    core = make_core(WEB_ALLOW_PRIVATE=f"127.0.0.1:{site.port}")
    urls = [f"http://127.0.0.1:{bystander.port}/admin", "http://169.254.169.254/latest/meta-data/"]
    fake_llm.script(
        Reply(tool_calls=[("web_fetch", {"url": u}) for u in urls]),
        Reply(text="I may not read those."),
    )
    said = answer(await run(core, incoming("read these")))
    assert said.text == "I may not read those.", "nothing read: nothing cited"
    errors = [m["error"]["message"] for m in tool_messages(fake_llm.requests[1])]
    assert errors[0] == "refused: 127.0.0.1 is a loopback address"
    assert errors[1].startswith("refused: 169.254.169.254 is a cloud metadata address")
    assert bystander.requests == []


async def test_the_daily_web_calls_are_capped_with_one_clear_line(
    make_core: MakeCore, fake_llm: FakeOpenAI, site: Site
) -> None:
    core = make_core(USER_DAILY_WEB_CALLS="1", WEB_ALLOW_PRIVATE=f"127.0.0.1:{site.port}")
    url = f"http://127.0.0.1:{site.port}/tides"
    fake_llm.script(Reply(tool_calls=[("web_fetch", {"url": url}), ("web_fetch", {"url": url})]), Reply(text="ok"))
    answer(await run(core, incoming("read it twice")))
    first, second = tool_messages(fake_llm.requests[1])
    assert first["ok"] and not second["ok"]
    assert second["error"]["message"] == "refused: you used your 1 web searches and fetches for today; more tomorrow."
    assert site.requests == ["/tides"], "the capped call fetched nothing"


async def test_the_api_and_the_terminal_show_the_sources_too(
    serve: Serve, fake_llm: FakeOpenAI, site: Site, db_dsn: str, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{site.port}/tides"
    cited = f"Two high tides a day.\n\nSources:\n1. [How tides work]({url}) — 127.0.0.1"
    web = {"WEB_ALLOW_PRIVATE": f"127.0.0.1:{site.port}", "SEARXNG_URL": f"http://127.0.0.1:{site.port}"}

    def search_read_answer() -> None:
        fake_llm.script(
            Reply(tool_calls=[("web_search", {"query": "tides"})]),
            Reply(tool_calls=[("web_fetch", {"url": url})]),
            Reply(text="Two high tides a day."),
        )

    s = await serve(**web)
    search_read_answer()
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        body = (await c.post(f"/v1/sessions/{sid}/messages", json={"content": "tides?"})).json()
    text = [p for p in body["parts"] if p["type"] == "text"]
    assert text == [{"type": "text", "text": cited}]  # the web page renders its links as anchors
    search_read_answer()
    env = {"DATABASE_URL": db_dsn, "LLM_BASE_URL": fake_llm.base_url, **web}
    code, out, err = await bot_cli("ask", "tides?", env=env, cwd=tmp_path)
    assert code == 0, err
    assert out.startswith(cited + "\n   🔧 2 steps")  # bot ask on a pipe: the Markdown as written
    assert site.requests == ["/search", "/tides"] * 2


async def test_search_then_read_then_answer_cites_the_page_read_and_the_result_named(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    other, unnamed = "https://tides.example.org/tables", "https://unnamed.example.net/"

    async def results(request: web.Request) -> web.StreamResponse:
        """SearXNG's JSON API: the page on this server first, then two elsewhere."""
        found = [
            {"title": "How tides work", "url": f"http://{request.host}/tides", "content": "The rise and fall…"},
            {"title": "Tide tables", "url": other, "content": "High and low water times."},
            {"title": "Not named", "url": unnamed, "content": "Another page."},
        ]
        return web.json_response({"results": found})

    async with Site({"/search": results, "/tides": html(article())}) as searx:
        page = f"http://127.0.0.1:{searx.port}/tides"
        core = make_core(SEARXNG_URL=f"http://127.0.0.1:{searx.port}", WEB_ALLOW_PRIVATE=f"127.0.0.1:{searx.port}")
        fake_llm.script(
            Reply(tool_calls=[("web_search", {"query": "how do tides work", "count": 3})]),
            Reply(tool_calls=[("web_fetch", {"url": page})]),
            Reply(text=f"Two a day; times are at {other}."),
        )
        said = answer(await run(core, incoming("how do tides work?")))
        assert said.text == (
            f"Two a day; times are at {other}.\n\nSources:\n"
            f"1. [How tides work]({page}) — 127.0.0.1\n2. [Tide tables]({other}) — tides.example.org"
        )
        assert [step_line(s) for s in said.steps] == [
            "✅ web_search → 'how do tides work': 3 results",
            f"✅ web_fetch → {page}",
        ]
        [listed] = tool_messages(fake_llm.requests[1])
        assert [r["url"] for r in listed["result"]["results"]] == [page, other, unnamed]
        assert searx.requests == ["/search", "/tides"]
        assert "web_search" in tool_names(fake_llm.requests[0])


async def test_no_search_tool_when_the_provider_is_none(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(WEB_SEARCH_PROVIDER="none")
    fake_llm.script(Reply(text="ok"))
    answer(await run(core, incoming("hi")))
    offered = tool_names(fake_llm.requests[0])
    assert "web_fetch" in offered and "web_search" not in offered


async def test_the_next_pages_of_a_document_come_without_a_new_fetch_until_it_is_old(
    make_core: MakeCore, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    async with Site({"/long": html(article(30))}) as long:
        core = make_core(WEB_ALLOW_PRIVATE=f"127.0.0.1:{long.port}")
        url = f"http://127.0.0.1:{long.port}/long"
        pages: list[tuple[str, str | dict[str, Any]]] = [("web_fetch", {"url": url, "page": n}) for n in (1, 2)]
        fake_llm.script(Reply(tool_calls=pages), Reply(text="ok"))
        answer(await run(core, incoming("read it all")))
        first, second = (m["result"] for m in tool_messages(fake_llm.requests[1]))
        assert (first["page"], second["page"]) == (1, 2) and first["pages"] == second["pages"] >= 2
        assert first["text"] != second["text"]
        assert long.requests == ["/long"], "page 2 came from the document read for page 1"
        clock.advance(seconds=WEB_PAGES_KEEP_S + 1)
        fake_llm.script(Reply(tool_calls=[pages[1]]), Reply(text="ok"))
        answer(await run(core, incoming("page 2 again", message_id="2")))
        assert long.requests == ["/long", "/long"], "read again once it is old"
