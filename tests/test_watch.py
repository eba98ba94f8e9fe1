"""Watching a page (/watch, watch_page): the baseline read at once, checks claimed once across processes, an
unchanged page costs nothing, a change is one message with its diff, failures are reported once and a day of them
pauses the watch; its place in /watch, /tasks, /export and MAX_OPEN_TASKS. A page server on 127.0.0.1 stands for the
web, and a small aiohttp reader in this file for the safe fetch."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from aiohttp import web

from core.accounts.own_data import FileAnswer
from core.buttons import Buttons, Confirm
from core.front_door import Core
from core.lifecycle import summarizer
from core.reminders.engine import ReminderEngine
from core.reminders.watching import Reading, diff_lines, every_text, read_every
from core.settings import Settings
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeSettings
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, incoming, run, tool_names
from tests.test_reminders import Outbox, _never

PAGE = """<html><head><title>Prices</title></head><body>
<h1>Prices</h1>
<p>Apples 3 EUR</p>
<p>Pears 4 EUR</p>
</body></html>"""


@dataclass
class Site:
    """A web server on 127.0.0.1 whose page the test changes (`status` other than 200: it fails)."""

    base: str = ""
    body: str = PAGE
    status: int = 200
    hits: int = 0
    paths: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The watched page's address."""
        return f"{self.base}/prices"


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    """The page server, on an ephemeral port."""
    state = Site()

    async def page(request: web.Request) -> web.Response:
        state.hits += 1
        state.paths.append(request.path)
        if request.path != "/prices":
            return web.Response(status=404, text="not here")
        return web.Response(status=state.status, text=state.body, content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    runner = web.AppRunner(app)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.base = f"http://127.0.0.1:{port}"
    yield state
    await runner.cleanup()


MakeWatchCore = Callable[..., Core]


@pytest.fixture
async def make_watch_core(
    pool: Pool, make_settings: MakeSettings, clock: FakeClock, make_llm: Callable[[Settings], Any], site: Site
) -> AsyncIterator[MakeWatchCore]:
    """A Core that reads pages through the safe fetch, the page server allowed (WEB_ALLOW_PRIVATE); its settings:
    Berlin time plus the keyword overrides."""
    made: list[Core] = []
    allow = site.base.removeprefix("http://")

    def make(**overrides: Any) -> Core:
        settings = make_settings(**{"DEFAULT_TIMEZONE": "Europe/Berlin", "WEB_ALLOW_PRIVATE": allow, **overrides})
        made.append(Core(settings, pool, make_llm(settings), clock=clock))
        return made[-1]

    yield make
    for core in made:
        await core.drain(0)
        await core.close()


def engine(core: Core, clock: FakeClock, outbox: Outbox, pool: Pool | None = None, **kw: Any) -> ReminderEngine:
    """An engine that checks watched pages as the core reads them and sums changes up with the core's model."""
    kw.setdefault("summarize", summarizer(core.llm, core.spending, 10.0))
    return ReminderEngine(pool or core.pool, {"telegram": outbox}, clock, reader=core.page_reader, sleep=_never, **kw)


async def checks(eng: ReminderEngine, clock: FakeClock, n: int = 1, every: timedelta = timedelta(hours=1)) -> None:
    """Let `n` check times pass, each run to its end."""
    for _ in range(n):
        clock.advance(seconds=every.total_seconds())
        await eng.tick()
        await eng.drain()


async def watch(core: Core, text: str, user: str = "100") -> Any:
    """/watch as typed by `user` in their private chat."""
    return await core.command(incoming(f"/watch {text}", user=user), "watch", text)


async def test_watch_reads_the_page_at_once_and_says_what_how_often_and_when_next(
    make_watch_core: MakeWatchCore, site: Site, fake_llm: FakeOpenAI
) -> None:
    core = make_watch_core()
    said = await watch(core, site.url)
    assert said == (
        f"👀 Watching {site.url} (“Prices”) every 1 hour; next check Sat 21 Nov 12:00 CET. "
        "I tell you here when it changes."
    )
    assert site.hits == 1  # the baseline
    row = await core.pool.fetchrow("SELECT kind, status, seen_hash FROM tasks JOIN watches ON task_id = tasks.id")
    assert row is not None and row["kind"] == "watch" and row["status"] == "pending" and row["seen_hash"]
    other = await watch(core, f"{site.base}/prices?b every 2 hours", user="200")
    assert "every 2 hours; next check Sat 21 Nov 13:00 CET" in other
    again = await watch(core, site.url)
    assert again.startswith(f"You already watch {site.url} (#") and site.hits == 2  # not read again
    assert fake_llm.requests == []
    assert core.lifecycle.page_reader is core.page_reader and core.lifecycle.summarize is not None  # the engine's


async def test_a_page_that_cannot_be_read_is_answered_at_once_and_nothing_is_made(
    make_watch_core: MakeWatchCore, site: Site
) -> None:
    core = make_watch_core()
    assert await watch(core, f"{site.base}/gone") == f"could not fetch {site.base}/gone: HTTP 404"
    site.status = 503
    assert await watch(core, site.url) == f"could not fetch {site.url}: HTTP 503"
    closed = "http://127.0.0.1:9/x"  # a loopback port WEB_ALLOW_PRIVATE does not list: never asked
    assert await watch(core, closed) == "refused: 127.0.0.1 is a loopback address"
    assert await watch(core, "http://169.254.169.254/latest/") == (
        "refused: 169.254.169.254 is a cloud metadata address"
    )
    assert (await watch(core, "ftp://example.com/file")).startswith("Give the page's web address")
    assert await core.pool.fetchval("SELECT count(*) FROM tasks") == 0
    assert await core.pool.fetchval("SELECT count(*) FROM watches") == 0


async def test_checking_more_often_than_job_min_interval_is_refused_before_reading(
    make_watch_core: MakeWatchCore, site: Site
) -> None:
    core = make_watch_core()
    said = await watch(core, f"{site.url} every 5 minutes")
    assert said.startswith("I check a page at most every 15 minutes (asked: every 5 minutes)")
    assert "Tell me" not in said and site.hits == 0
    assert (await watch(core, f"{site.url} every blue moon")).startswith("I could not read how often")
    assert await core.pool.fetchval("SELECT count(*) FROM tasks") == 0
    assert "every 15 minutes" in await watch(core, f"{site.url} every 15 minutes")


async def test_an_unchanged_page_costs_no_model_call_and_sends_nothing(
    make_watch_core: MakeWatchCore, site: Site, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_watch_core()
    await watch(core, site.url)
    out = Outbox()
    eng = engine(core, clock, out)
    site.body = PAGE.replace("<p>Apples", "\n\n   <p>Apples")  # only whitespace changed
    await checks(eng, clock, 3)
    assert out.sent == [] and fake_llm.requests == []
    assert site.hits == 4
    statuses = [r["status"] for r in await core.pool.fetch("SELECT status FROM occurrences ORDER BY scheduled_at")]
    assert statuses == ["checked"] * 3
    due = await core.pool.fetchval("SELECT due_at FROM tasks")
    assert due == clock() + timedelta(hours=1)  # the next check is planned


async def test_a_change_is_one_message_with_its_diff_and_a_summary(
    make_watch_core: MakeWatchCore, site: Site, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_watch_core()
    await watch(core, site.url)
    out = Outbox()
    eng = engine(core, clock, out)
    site.body = PAGE.replace("Apples 3 EUR", "Apples 2 EUR").replace("</body>", "<p>Plums 5 EUR</p></body>")
    fake_llm.script(Reply(text="Apples got cheaper and plums are new."))
    await checks(eng, clock)
    assert len(out.sent) == 1
    msg = out.sent[0]
    assert msg.text == (
        "👀 Prices changed\n\nApples got cheaper and plums are new.\n\n"
        f"```\n− Apples 3 EUR\n+ Apples 2 EUR\n+ Plums 5 EUR\n```\n{site.url}"
    )
    assert msg.buttons == () and msg.chat_id == "100"
    assert len(fake_llm.requests) == 1 and "tools" not in fake_llm.requests[0]  # one call, no tools
    assert "+ Plums 5 EUR" in fake_llm.requests[0]["messages"][1]["content"]
    await checks(eng, clock, 2)  # the new text is the one seen now
    assert len(out.sent) == 1 and len(fake_llm.requests) == 1
    assert await core.pool.fetchval("SELECT count(*) FROM token_usage") == 1  # the summary's usage is the owner's


async def test_without_budget_the_diff_goes_alone(
    make_watch_core: MakeWatchCore, site: Site, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_watch_core(USER_DAILY_TOKENS="1000")
    await watch(core, site.url)
    account = await core.pool.fetchval("SELECT user_id FROM tasks")
    await core.pool.execute(
        "INSERT INTO token_usage (account_id, day, model, prompt_tokens, completion_tokens, cached_tokens, calls)"
        " VALUES ($1, '2026-11-21', 'fake-model', 5000, 0, 0, 1)",
        account,
    )
    out = Outbox()
    eng = engine(core, clock, out)
    site.body = PAGE.replace("Pears 4 EUR", "Pears sold out")
    await checks(eng, clock)
    assert [m.text for m in out.sent] == [f"👀 Prices changed\n\n```\n− Pears 4 EUR\n+ Pears sold out\n```\n{site.url}"]
    assert fake_llm.requests == []


async def test_a_long_change_shows_at_most_15_lines() -> None:
    old = "\n".join(f"line {i}" for i in range(40))
    new = "\n".join(f"line {i}!" for i in range(40))
    lines = diff_lines(old, new)
    assert len(lines) == 16 and lines[-1] == "… and 65 more changed lines"
    assert lines[0] == "− line 0" and all(line[0] in "+−" for line in lines[:15])


async def test_a_send_that_fails_is_retried_with_the_same_text_and_the_page_is_not_read_again(
    make_watch_core: MakeWatchCore, site: Site, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_watch_core(LLM_PROVIDER="none")  # no model: the diff alone
    await watch(core, site.url)
    out = Outbox(fail_first=1)
    eng = engine(core, clock, out, summarize=None)
    site.body = PAGE.replace("Pears 4 EUR", "Pears 5 EUR")
    await checks(eng, clock)
    assert out.sent == [] and site.hits == 2
    site.body = PAGE.replace("Pears 4 EUR", "Pears 6 EUR")  # changes again before the retry: the retry is the same
    await checks(eng, clock, every=timedelta(seconds=5))
    assert [m.text.count("Pears 5 EUR") for m in out.sent] == [1] and site.hits == 2
    assert await core.pool.fetchval("SELECT status FROM occurrences") == "delivered"


async def test_three_failures_are_reported_once_and_a_day_of_them_pauses_the_watch(
    make_watch_core: MakeWatchCore, site: Site, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_watch_core()
    await watch(core, site.url)
    out = Outbox()
    eng = engine(core, clock, out)
    site.status = 500
    await checks(eng, clock, 2)
    assert out.sent == []
    await checks(eng, clock)
    assert [m.text for m in out.sent] == [
        f"👀 I could not check {site.url} 3 times in a row: could not fetch {site.url}: HTTP 500. I keep trying."
    ]
    await checks(eng, clock, 21)  # 24 failures, the first 23 hours ago
    assert len(out.sent) == 1
    await checks(eng, clock)  # a day since the first
    assert len(out.sent) == 2
    assert out.sent[1].text == (
        f"👀 I stopped checking {site.url}: it could not be read for a day (could not fetch {site.url}: HTTP 500). "
        f"/watch {site.url} starts again."
    )
    assert await core.pool.fetchval("SELECT status FROM tasks") == "paused"
    hits = site.hits
    await checks(eng, clock, 3)
    assert len(out.sent) == 2 and site.hits == hits  # paused: no longer read
    listed = await core.command(incoming("/tasks"), "tasks")
    assert isinstance(listed, str) and f"⏸ Paused: {site.url} — could not be read since Sat 21 Nov 12:00 CET" in listed
    assert fake_llm.requests == []
    site.status = 200
    assert (await watch(core, site.url)).startswith(f"👀 Watching {site.url}")  # starts again
    assert await core.pool.fetchval("SELECT count(*) FROM tasks") == 1
    assert await core.pool.fetchval("SELECT status FROM tasks") == "pending"


async def test_a_page_that_recovers_is_not_reported(
    make_watch_core: MakeWatchCore, site: Site, clock: FakeClock
) -> None:
    core = make_watch_core()
    await watch(core, site.url)
    out = Outbox()
    eng = engine(core, clock, out)
    for _ in range(3):
        site.status = 500
        await checks(eng, clock, 2)
        site.status = 200
        await checks(eng, clock)
    assert out.sent == []
    assert await core.pool.fetchval("SELECT failures FROM watches") == 0


async def test_watch_alone_lists_with_stop_buttons_and_only_the_owner_stops(
    make_watch_core: MakeWatchCore, site: Site
) -> None:
    core = make_watch_core()
    assert (await watch(core, "")).startswith("You watch no pages.")
    await watch(core, site.url)
    await watch(core, f"{site.url}?2 every 1 day")
    ids = [r["id"] for r in await core.pool.fetch("SELECT id FROM tasks ORDER BY id")]
    listed = await watch(core, "")
    assert isinstance(listed, Buttons)
    assert f"- #{ids[0]} 👀 Watching {site.url} every 1 hour, next check Sat 21 Nov 12:00 CET" in listed.text
    assert f"- #{ids[1]} 👀 Watching {site.url}?2 every 1 day, next check Sun 22 Nov 11:00 CET" in listed.text
    buttons = [b for row in listed.rows for b in row]
    assert [b.label for b in buttons] == [f"⏹ Stop #{i}" for i in ids]
    assert [b.press for b in buttons] == [Confirm("watch", {"stop": str(i)}, "100") for i in ids]
    stranger = await core.command(incoming("/watch", user="200"), "watch", {"stop": str(ids[0])})
    assert stranger == f"You have no watch #{ids[0]} here (/watch lists yours)."
    assert await core.pool.fetchval("SELECT count(*) FROM watches") == 2
    pressed = await core.command(incoming("/watch"), "watch", dict(buttons[0].press.args))  # type: ignore[union-attr]
    assert pressed == f"⏹ Stopped watching {site.url}."
    assert await watch(core, f"stop {ids[1]}") == f"⏹ Stopped watching {site.url}?2."
    assert await core.pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_tasks_and_export_show_watches(make_watch_core: MakeWatchCore, site: Site) -> None:
    core = make_watch_core()
    await core.command(incoming("/remind"), "remind", "in 10 minutes Tea")
    await watch(core, site.url)
    listed = await core.command(incoming("/tasks"), "tasks")
    assert isinstance(listed, str)
    assert "- #1 Tea — Sat 21 Nov 11:10 CET" in listed
    assert f"👀 Watching {site.url} every 1 hour, next check Sat 21 Nov 12:00 CET" in listed
    assert "Watch http" not in listed  # not also listed as a task
    exported = await core.command(incoming("/export"), "export")
    assert isinstance(exported, FileAnswer)
    tasks = json.loads(exported.data)["tasks"]
    assert [t["kind"] for t in tasks] == ["reminder", "watch"]
    assert tasks[1]["watch"]["url"] == site.url and tasks[0]["watch"] is None


async def test_watches_count_among_max_open_tasks(make_watch_core: MakeWatchCore, site: Site) -> None:
    core = make_watch_core(MAX_OPEN_TASKS=2)
    await core.command(incoming("/remind"), "remind", "in 10 minutes Tea")
    assert (await watch(core, site.url)).startswith("👀 Watching")
    full = await watch(core, f"{site.url}?other")
    assert full == "you have 2 open tasks, the most this bot keeps per person; complete or delete some first"
    assert await core.pool.fetchval("SELECT count(*) FROM tasks") == 2


async def test_two_processes_check_a_due_watch_once(
    make_watch_core: MakeWatchCore, site: Site, clock: FakeClock, pool: Pool, pool_b: Pool
) -> None:
    core = make_watch_core(LLM_PROVIDER="none")
    await watch(core, site.url)
    out_a, out_b = Outbox(), Outbox()
    a = engine(core, clock, out_a, pool, summarize=None, instance="a")
    b = engine(core, clock, out_b, pool_b, summarize=None, instance="b")
    site.body = PAGE.replace("Pears 4 EUR", "Pears 5 EUR")
    clock.advance(hours=1)
    await asyncio.gather(a.tick(), b.tick())
    await asyncio.gather(a.drain(), b.drain())
    assert len(out_a.sent) + len(out_b.sent) == 1 and site.hits == 2


async def test_a_check_left_by_a_dead_process_is_taken_over_after_its_lease(
    make_watch_core: MakeWatchCore, site: Site, clock: FakeClock
) -> None:
    core = make_watch_core(LLM_PROVIDER="none")
    await watch(core, site.url)
    stuck = asyncio.Event()

    async def hangs(url: str) -> Reading | str:
        stuck.set()
        await asyncio.Event().wait()
        raise AssertionError("never")

    dead = ReminderEngine(core.pool, {"telegram": Outbox()}, clock, reader=hangs, sleep=_never, instance="dead")
    site.body = PAGE.replace("Pears 4 EUR", "Pears 5 EUR")
    clock.advance(hours=1)
    await dead.tick()
    await asyncio.wait_for(stuck.wait(), 5)
    await dead.close()  # killed while reading: its claim stays
    out = Outbox()
    alive = engine(core, clock, out, summarize=None, instance="alive")
    await alive.tick()
    assert out.sent == []  # the lease still holds
    await checks(alive, clock, every=timedelta(minutes=2))
    assert len(out.sent) == 1 and "+ Pears 5 EUR" in out.sent[0].text


async def test_the_model_watches_a_page_with_the_watch_page_tool(
    make_watch_core: MakeWatchCore, site: Site, fake_llm: FakeOpenAI
) -> None:
    core = make_watch_core()
    fake_llm.script(
        Reply(tool_calls=[("watch_page", {"url": site.url, "every_minutes": 120})]),
        Reply(text="I'll tell you when it changes."),
    )
    assert answer(await run(core, incoming("tell me when this page changes " + site.url))).text.startswith("I'll")
    assert "watch_page" in tool_names(fake_llm.requests[0])
    result = json.loads(fake_llm.requests[1]["messages"][-1]["content"])
    assert result["ok"] and result["result"]["every"] == "every 2 hours"
    assert await core.pool.fetchval("SELECT url FROM watches") == site.url
    fake_llm.script(Reply(tool_calls=[("watch_page", {"url": site.url, "every_minutes": 5})]), Reply(text="no"))
    answer(await run(core, incoming("every 5 minutes please")))
    refused = json.loads(fake_llm.requests[3]["messages"][-1]["content"])
    assert refused["error"]["code"] == "forbidden" and "at most every 15 minutes" in refused["error"]["message"]


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("every 30 minutes", 30),
        ("every 2 hours", 120),
        ("every hour", 60),
        ("2h", 120),
        ("every day", 1440),
        ("every 3 days", 4320),
        ("hourly", 60),
        ("daily", 1440),
        ("every 1 week", 10080),
        ("15 min", 15),
    ],
)
def test_how_often_is_read_from_plain_words(text: str, minutes: int) -> None:
    assert read_every(text) == minutes


def test_what_is_not_an_interval_gets_one_line() -> None:
    for text in ("every blue moon", "every 0 minutes", "often", "every 1.5 hours"):
        got = read_every(text)
        assert isinstance(got, str) and got.startswith("I could not read how often")
    assert [every_text(m) for m in (60, 30, 1, 1440, 2880, 90)] == [
        "every 1 hour",
        "every 30 minutes",
        "every 1 minute",
        "every 1 day",
        "every 2 days",
        "every 90 minutes",
    ]


async def test_manage_tasks_does_not_turn_a_watch_into_something_else(
    make_watch_core: MakeWatchCore, site: Site, fake_llm: FakeOpenAI
) -> None:
    core = make_watch_core()
    await watch(core, site.url)
    task_id = await core.pool.fetchval("SELECT id FROM tasks")
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "update", "id": task_id, "job": "summarise my day"})]),
        Reply(text="no"),
    )
    answer(await run(core, incoming("make it a job")))
    refused = json.loads(fake_llm.requests[1]["messages"][-1]["content"])
    assert "is a page watch" in refused["error"]["message"]
    assert await core.pool.fetchval("SELECT kind FROM tasks") == "watch"
