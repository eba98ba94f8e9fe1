"""Health and metrics: /healthz, /readyz (database, adapters, shutting down) and /metrics without user data."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any

import aiohttp
import asyncpg
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from bot.app import run_platforms
from bot.web import Handler, WebServer
from core.agent.llm import LLM
from core.front_door import Core
from core.metrics import Metrics
from core.reminders.engine import DeliveryRefused, ReminderEngine
from core.reminders.messages import ReminderMessage
from core.settings import Settings, StartupError
from core.storage.db import Pool
from core.types import ToolCall
from tests.conftest import FakeClock, MakeCore, MakeSettings
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.helpers import answer, final, incoming, run, until

TOKEN = "424242:AAE-secret_token_value-0123456789abcd"
USER_ID = "9081726354"
CHAT_ID = "-4455667788"
USER_TEXT = "please remember Zanzibar-Quokka-7731 for me"
MADE_UP_TOOL = "exfiltrate_Zanzibar"


class Outbox:
    """A platform that accepts every reminder."""

    def __init__(self) -> None:
        """Nothing sent yet."""
        self.sent: list[ReminderMessage] = []

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Record one send."""
        self.sent.append(msg)
        return str(len(self.sent))


async def _never(_: float) -> None:
    """Lease renewal that never comes round (the test clock does not move while a send runs)."""
    await asyncio.Event().wait()


def free_port() -> int:
    """A port nobody listens on (bound and closed again by the test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A real HTTP client."""
    async with aiohttp.ClientSession() as session:
        yield session


async def get(http: aiohttp.ClientSession, server: WebServer, path: str) -> tuple[int, str]:
    """GET a path of the server: status and body."""
    async with http.get(f"http://127.0.0.1:{server.port}{path}") as resp:
        return resp.status, await resp.text()


@pytest.fixture
async def make_server(make_settings: MakeSettings, clock: FakeClock) -> AsyncIterator[Callable[..., Any]]:
    """Start a WebServer on 127.0.0.1 (an ephemeral port) for a Core on `pool` with its own Metrics."""
    servers: list[WebServer] = []
    llms: list[LLM] = []

    async def make(pool: Pool, adapters: tuple[str, ...] = ("telegram",), **overrides: Any) -> WebServer:
        settings: Settings = make_settings(TELEGRAM_BOT_TOKEN=TOKEN, **overrides)
        metrics = Metrics()
        llm = LLM.from_settings(settings, max_retries=1, metrics=metrics)
        llms.append(llm)
        server = WebServer(Core(settings, pool, llm, clock=clock, metrics=metrics), adapters, 0, host="127.0.0.1")
        await server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()
    for llm in llms:
        await llm.aclose()


async def test_healthz_says_alive(make_server: Any, pool: Pool, http: aiohttp.ClientSession) -> None:
    server = await make_server(pool)
    assert await get(http, server, "/healthz") == (200, '{"status": "alive"}')


async def test_readyz_ready_when_the_database_answers_and_adapters_are_connected(
    make_server: Any, pool: Pool, http: aiohttp.ClientSession
) -> None:
    server = await make_server(pool, ("telegram", "discord"))
    assert await get(http, server, "/readyz") == (503, '{"status": "not ready", "reason": "telegram: not connected"}')
    server.core.report_state("telegram", "@test_bot")
    server.core.report_state("discord", "Bot#1 in 2 server(s)")
    assert await get(http, server, "/readyz") == (200, '{"status": "ready"}')


async def test_readyz_503_when_an_adapter_is_disconnected(
    make_server: Any, pool: Pool, http: aiohttp.ClientSession
) -> None:
    server = await make_server(pool, ("telegram", "discord"))
    server.core.report_state("telegram", "@test_bot")
    down = "disconnected since 2026-11-21 10:00 UTC: 4004 Authentication failed"
    server.core.report_state("discord", down, connected=False)
    status, body = await get(http, server, "/readyz")
    assert (status, body) == (503, '{"status": "not ready", "reason": "discord: disconnected"}')


async def test_readyz_503_when_the_database_is_gone(make_server: Any, http: aiohttp.ClientSession) -> None:
    port = free_port()  # closed: every connection attempt is refused at once
    dsn = f"postgresql://bot:pw-Secret-1234@127.0.0.1:{port}/bot"
    gone = await asyncpg.create_pool(dsn, min_size=0, max_size=1)
    try:
        server = await make_server(gone)
        server.core.report_state("telegram", "@test_bot")
        status, body = await get(http, server, "/readyz")
    finally:
        await gone.close()
    assert status == 503
    assert body == '{"status": "not ready", "reason": "database unreachable (ConnectionRefusedError)"}'
    assert str(port) not in body and "Secret" not in body
    assert (await get(http, server, "/healthz"))[0] == 200  # alive all the same


async def test_readyz_503_while_shutting_down(make_server: Any, pool: Pool, http: aiohttp.ClientSession) -> None:
    server = await make_server(pool)
    server.core.report_state("telegram", "@test_bot")
    await server.core.drain(0)  # SIGTERM: the load balancer stops sending before the adapters stop
    assert await get(http, server, "/readyz") == (503, '{"status": "not ready", "reason": "shutting down"}')


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text exposition, by name and labels (parsed with prometheus-client's parser)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """One sample's value (0 when absent)."""
    return found.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_count_turns_tools_llm_and_reminders_without_user_data(
    make_server: Any, pool: Pool, http: aiohttp.ClientSession, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    server = await make_server(pool)
    core: Core = server.core
    before = samples((await get(http, server, "/metrics"))[1])
    assert value(before, "bot_turns_total", outcome="ok") == 0
    fake_llm.script(
        Reply(
            tool_calls=[
                ("manage_tasks", {"action": "create", "title": USER_TEXT, "due_at": "2026-11-21T10:01"}),
                (MADE_UP_TOOL, {"what": USER_TEXT}),
            ]
        ),
        Reply(text=f"Done: {USER_TEXT}"),
        Reply(status=400, text=f"the request is too long: {USER_TEXT}"),
    )
    answer(await run(core, incoming(USER_TEXT, user=USER_ID, chat=CHAT_ID, kind="group", name="Zanzibar")))
    refused = final(await run(core, incoming(f"again {USER_TEXT}", user=USER_ID, chat=CHAT_ID, kind="group")))
    assert refused.type == "error"
    clock.now = datetime(2026, 11, 21, 10, 1, 3, tzinfo=UTC)  # 3 s after the reminder was due
    out = Outbox()
    engine = ReminderEngine(pool, {"telegram": out}, clock, sleep=_never, metrics=core.metrics)
    assert await engine.tick() == 1
    assert USER_TEXT in out.sent[0].text

    status, text = await get(http, server, "/metrics")
    assert status == 200
    found = samples(text)
    assert value(found, "bot_turns_total", outcome="ok") == 1
    assert value(found, "bot_turns_total", outcome="llm_unavailable") == 1
    assert value(found, "bot_turn_seconds_count") == 2
    assert value(found, "bot_tool_calls_total", tool="manage_tasks", outcome="ok") == 1
    assert value(found, "bot_tool_calls_total", tool="unknown", outcome="unknown_function") == 1
    assert value(found, "bot_llm_request_seconds_count") == 3
    assert value(found, "bot_llm_errors_total", kind="refused") == 1
    assert value(found, "bot_reminders_delivered_total") == 1
    assert value(found, "bot_reminders_late_total") == 0
    assert value(found, "bot_reminder_lateness_seconds_count") == 1
    assert value(found, "bot_reminder_lateness_seconds_sum") == 3.0
    assert value(found, "bot_reminder_lateness_seconds_bucket", le="5.0") == 1
    assert value(found, "bot_reminder_lateness_seconds_bucket", le="2.0") == 0
    for private in (USER_TEXT, "Zanzibar", USER_ID, CHAT_ID, TOKEN, TOKEN.split(":")[1], MADE_UP_TOOL):
        assert private not in text, private


async def test_metrics_count_retried_and_failed_reminders(
    make_server: Any, pool: Pool, http: aiohttp.ClientSession, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    server = await make_server(pool)
    core: Core = server.core
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "a", "due_at": "2026-11-21T10:01"})]),
        Reply(text="ok"),
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "b", "due_at": "2026-11-21T10:01"})]),
        Reply(text="ok"),
    )
    answer(await run(core, incoming("a", user="1")))
    answer(await run(core, incoming("b", user="2")))
    clock.now = datetime(2026, 11, 21, 10, 1, tzinfo=UTC)

    class Flaky:
        """Refuses user 1's chat for good; user 2's send fails for now."""

        async def send_reminder(self, msg: ReminderMessage) -> str | None:
            """Fail one way or the other."""
            if msg.chat_id == "1":
                raise DeliveryRefused("bot was blocked by the user")
            raise ConnectionError("platform down")

    engine = ReminderEngine(pool, {"telegram": Flaky()}, clock, sleep=_never, metrics=core.metrics)
    assert await engine.tick() == 0
    found = samples((await get(http, server, "/metrics"))[1])
    assert value(found, "bot_reminders_failed_total") == 1
    assert value(found, "bot_reminders_retried_total") == 1
    assert value(found, "bot_reminders_delivered_total") == 0


async def test_each_core_has_its_own_registry(make_server: Any, pool: Pool, fake_llm: FakeOpenAI) -> None:
    first, second = await make_server(pool), await make_server(pool)
    fake_llm.script(Reply(text="hi"))
    answer(await run(first.core, incoming("hello")))
    assert value(samples_of(first), "bot_turns_total", outcome="ok") == 1
    assert value(samples_of(second), "bot_turns_total", outcome="ok") == 0


def samples_of(server: WebServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples of a server's registry, read directly."""
    return samples(generate_latest(server.core.metrics.registry).decode())


def test_port_is_set_only_when_given(make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    unset = make_settings()
    assert (unset.serve_http, unset.PORT) == (False, 8080)  # the default waits for webhook mode
    assert (make_settings(PORT="").serve_http, make_settings(PORT="").PORT) == (False, 8080)
    monkeypatch.setenv("PORT", "9000")  # how a PaaS sets it
    given = make_settings()
    assert (given.serve_http, given.PORT) == (True, 9000)


async def test_polling_mode_serves_health_when_port_is_set(
    tg: FakeTelegram, make_core: MakeCore, http: aiohttp.ClientSession
) -> None:
    port = free_port()
    core = make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url, PORT=str(port))
    running = asyncio.create_task(run_platforms(core.settings, core))
    try:
        await until(lambda: core.status_board.adapters.get("telegram") is not None)
        async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
            assert (resp.status, await resp.text()) == (200, '{"status": "ready"}')
        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200 and "bot_turn_seconds_count 0.0" in await resp.text()
        assert gc.get_freeze_count() > 0  # start-up's objects are out of the full collections' way
    finally:
        gc.unfreeze()
        os.kill(os.getpid(), signal.SIGTERM)  # run_platforms stops: adapters, then the HTTP server
        assert await asyncio.wait_for(running, 10) == 0
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.get(f"http://127.0.0.1:{port}/healthz"):
            pass


async def test_a_port_in_use_stops_the_start_with_one_line_naming_port(make_server: Any, pool: Pool) -> None:
    server = await make_server(pool)
    second = WebServer(server.core, (), server.port, host="127.0.0.1")
    with pytest.raises(StartupError) as raised:
        await second.start()
    assert str(raised.value) == f"PORT: cannot listen on 127.0.0.1:{server.port} (Address already in use)"


StartWith = Callable[[dict[str, Handler]], Awaitable[WebServer]]


@pytest.fixture
async def start_with(make_server: Any, pool: Pool) -> AsyncIterator[StartWith]:
    """Start a WebServer with extra routes (path → handler, added before start); stopped at the end."""
    servers: list[WebServer] = []

    async def start(routes: dict[str, Handler]) -> WebServer:
        server = WebServer((await make_server(pool)).core, (), 0, host="127.0.0.1")
        for path, handler in routes.items():
            server.app.add_route(path, handler)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


async def test_health_answers_head_too_and_every_answer_is_dated(
    make_server: Any, pool: Pool, http: aiohttp.ClientSession
) -> None:
    server = await make_server(pool)
    async with http.head(f"http://127.0.0.1:{server.port}/healthz") as resp:
        assert resp.status == 200  # as the aiohttp server did: probes that send HEAD
    async with http.get(f"http://127.0.0.1:{server.port}/healthz") as resp:
        assert resp.status == 200 and resp.headers["Date"].endswith(" GMT")


async def test_stop_lets_a_request_under_way_finish_and_takes_no_new_ones(
    start_with: StartWith, http: aiohttp.ClientSession
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(request: Request) -> Response:
        entered.set()
        await release.wait()
        return PlainTextResponse("finished")

    server = await start_with({"/slow": slow})
    server.close_grace_s = 30.0
    port = server.port
    asked = asyncio.create_task(http.get(f"http://127.0.0.1:{port}/slow"))
    await asyncio.wait_for(entered.wait(), 10)
    stopping = asyncio.create_task(server.stop())
    done, _ = await asyncio.wait({stopping}, timeout=0.1)  # room for a stop that does not wait
    assert not done
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.get(f"http://127.0.0.1:{port}/healthz"):
            pass
    release.set()
    resp = await asked
    assert (resp.status, await resp.text()) == (200, "finished")
    await stopping


async def test_stop_ends_an_open_stream_after_the_grace_without_an_error(
    start_with: StartWith, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async def events() -> AsyncIterator[bytes]:
        yield b"data: hello\n\n"
        await asyncio.Event().wait()  # an event stream that never ends by itself

    async def stream(request: Request) -> Response:
        return StreamingResponse(events(), media_type="text/event-stream")

    server = await start_with({"/stream": stream})
    server.close_grace_s = 0.05
    async with http.get(f"http://127.0.0.1:{server.port}/stream") as resp:
        assert await resp.content.readline() == b"data: hello\n"
        await asyncio.wait_for(server.stop(), 5)  # the stream is closed, not waited for (nor cancelled: no ERROR)
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.content.read()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]  # cancelled: "Exception in ASGI"


async def test_the_server_leaves_signals_and_logging_to_the_bot(
    start_with: StartWith, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, allowed_errors: list[str]
) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    root = list(logging.getLogger().handlers)

    async def broken(request: Request) -> Response:
        raise RuntimeError("Zanzibar-broken-route")

    server = await start_with({"/broken": broken})
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers  # SIGINT/SIGTERM stay the bot's
    assert logging.getLogger().handlers == root and not logging.getLogger("uvicorn").handlers
    allowed_errors.append("Exception in ASGI application")
    async with http.get(f"http://127.0.0.1:{server.port}/broken") as resp:
        assert resp.status == 500
    [failed] = [r for r in caplog.records if r.exc_info and "Zanzibar-broken-route" in str(r.exc_info[1])]
    assert failed.name == "uvicorn.error"  # reached the root logger (caplog): the bot's handlers and format


async def test_a_turn_closed_before_its_answer_counts_as_interrupted(
    make_server: Any, pool: Pool, fake_llm: FakeOpenAI
) -> None:
    server = await make_server(pool)
    fake_llm.script(Reply(tool_calls=[("set_timezone", {"timezone": "Europe/Berlin"})]), Reply(text="done"))
    async with aclosing(server.core.handle(incoming("I live in Berlin"))) as events:
        async for event in events:
            assert isinstance(event, ToolCall)
            break  # the adapter gives up on the turn (e.g. its task was cancelled)
    found = samples_of(server)
    assert value(found, "bot_turns_total", outcome="interrupted") == 1
    assert value(found, "bot_turn_seconds_count") == 1


METRICS_SECRET = "scrape-Me-Not-7f3a9c"
WEBHOOK_URL = "https://bot.example.com/telegram"


async def get_with(
    http: aiohttp.ClientSession, server: WebServer, path: str, authorization: str | None
) -> tuple[int, str, str | None]:
    """GET a path with an optional Authorization header: status, body and the WWW-Authenticate challenge."""
    headers = {} if authorization is None else {"Authorization": authorization}
    async with http.get(f"http://127.0.0.1:{server.port}{path}", headers=headers) as resp:
        return resp.status, await resp.text(), resp.headers.get("WWW-Authenticate")


async def test_metrics_need_the_bearer_token_when_metrics_token_is_set(
    make_server: Any, pool: Pool, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server = await make_server(pool, METRICS_TOKEN=METRICS_SECRET)
    for wrong in (None, "", "Bearer", "Bearer wrong-token", f"Basic {METRICS_SECRET}", f"Bearer {METRICS_SECRET}x"):
        status, body, challenge = await get_with(http, server, "/metrics", wrong)
        assert (status, challenge) == (401, 'Bearer realm="metrics"'), wrong
        assert "bot_turns_total" not in body and METRICS_SECRET not in body
    for right in (f"Bearer {METRICS_SECRET}", f"bearer {METRICS_SECRET}"):  # the scheme is case-insensitive
        status, body, _ = await get_with(http, server, "/metrics", right)
        assert status == 200 and "bot_turn_seconds_count 0.0" in body
    assert (await get(http, server, "/healthz"))[0] == 200  # probes need no token
    assert (await get(http, server, "/readyz"))[0] == 503
    assert METRICS_SECRET not in caplog.text


async def test_webhook_mode_without_a_token_serves_no_metrics_and_says_how_to_enable_them(
    make_server: Any, pool: Pool, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bot.web")
    server = await make_server(pool, TELEGRAM_WEBHOOK_URL=WEBHOOK_URL)  # the port is on the internet
    status, _, _ = await get_with(http, server, "/metrics", None)
    assert status == 404
    assert (await get(http, server, "/healthz"))[0] == 200
    said = [r.getMessage() for r in caplog.records if r.name == "bot.web" and "/metrics" in r.getMessage()]
    assert said == [
        f"health on http://127.0.0.1:{server.port} (/healthz, /readyz); /metrics is off on this public port: set"
        " METRICS_TOKEN and scrape it with Authorization: Bearer <token>"
    ]


async def test_webhook_mode_with_a_token_serves_metrics_to_the_bearer_only(
    make_server: Any, pool: Pool, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server = await make_server(pool, TELEGRAM_WEBHOOK_URL=WEBHOOK_URL, METRICS_TOKEN=METRICS_SECRET)
    assert (await get_with(http, server, "/metrics", None))[0] == 401
    status, body, _ = await get_with(http, server, "/metrics", f"Bearer {METRICS_SECRET}")
    assert status == 200 and "bot_turns_total" in body
    assert METRICS_SECRET not in caplog.text
