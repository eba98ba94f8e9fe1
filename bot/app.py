"""The composition root: settings → database → LLM → core → adapters → run."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from adapters import console
from adapters.base import Adapter
from bot.hosts import ALL_INTERFACES, LOOPBACK, is_loopback
from bot.platforms import configured
from core import API_PLATFORM, Core, Outbox, Settings, open_core

if TYPE_CHECKING:  # the web server, the HTTP API and each platform's library load only when this start uses them
    from adapters.http import HttpApi
    from bot.web import Handler, WebServer

log = logging.getLogger(__name__)


SERVING = "Serving the HTTP API on {where} (Ctrl-C stops)"  # the first line `bot serve` prints once it listens
PAGE = "The web page: {url} (/web gives you a sign-in link)\n"  # the terminal chat's first line, with PORT set


async def run_bot(
    settings: Settings, *, ask_text: str | None = None, ask_continue: bool = False, serve: bool = False
) -> int:
    """Run until stopped; with `ask_text`, answer it in the terminal (continuing the previous ask) and return; with
    `serve`, run the HTTP API alone (`bot serve`)."""
    asyncio.get_running_loop().set_exception_handler(quiet_dropped_connections)
    async with open_core(settings) as core:
        if serve:
            return await run_serve(settings, core)
        if ask_text is not None:
            answer, answered = await console.ask_once(core, ask_text, fresh=not ask_continue)
            print(answer)
            return core.exit_code if core.exit_code is not None else 0 if answered else 1
        if not configured(settings):
            return await run_console(core)
        return await run_platforms(settings, core)


def quiet_dropped_connections(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncpg closes an expired pool connection in a task nobody awaits: when the database dropped it, its socket
    error would be logged with a traceback ("Task exception was never retrieved"); it is one warning line instead.
    Everything else goes to asyncio's default handler."""
    future, error = context.get("future"), context.get("exception")
    coro = getattr(future, "get_coro", lambda: None)() if future is not None else None
    if isinstance(error, OSError) and getattr(coro, "__qualname__", "") == "Connection.close":
        log.warning("a dropped database connection could not be closed cleanly (%s)", type(error).__name__)
        return
    loop.default_exception_handler(context)


def freeze_startup_objects() -> None:
    """Keep what start-up built (modules, the libraries' objects) out of the garbage collector's full collections:
    they then scan only what turns allocate (a full collection over everything paused a turn for 13–87 ms)."""
    gc.collect()
    gc.freeze()


async def run_console(core: Core) -> int:
    """The terminal chat, with reminders printed into it while it runs; Ctrl-C leaves it like /quit."""

    def write(text: str) -> None:
        print(text, end="", flush=True)

    show = console.markdown_for(sys.stdout)
    outbox = console.ConsoleOutbox(write, show, model=not core.settings.model_off)
    async with local_page(core, write) as page, core.running({"console": outbox, **page}):
        if await until_interrupted(console.chat_loop(core, until_exit(core, console.stdin_lines()), write, show)):
            write("\n")
    return core.exit_code or 0


@asynccontextmanager
async def local_page(core: Core, write: console.Write) -> AsyncIterator[dict[str, Outbox]]:
    """The terminal chat's web page and API while the block runs, when PORT is set (on HOST, else loopback): the
    outbox of its sessions (none without PORT); /web then signs the terminal's user in there."""
    settings = core.settings
    if not settings.serve_http:
        yield {}
        return
    host = serve_host(settings)
    web = web_server(core, (), settings.PORT, host, public=not is_loopback(host))
    http = serve_api(web)
    await web.start()
    try:
        core.web_url = reachable_url(web.host, web.port)
        write(PAGE.format(url=core.web_url))
        yield {API_PLATFORM: http.api}
    finally:
        core.web_url = None
        await web.stop()


async def until_interrupted(chat: Coroutine[Any, Any, None]) -> bool:
    """Run the chat until it ends or Ctrl-C (SIGINT) cuts it, at once, whatever it is doing (every Ctrl-C while it
    runs does); True when cut. Afterwards the process is leaving and ignores Ctrl-C: a second one must not cut the
    embedded database's stop (its pg_ctl runs in this terminal's process group and inherits the ignoring)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(chat)
    loop.add_signal_handler(signal.SIGINT, task.cancel)
    try:
        await asyncio.wait({task})
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if not task.done():  # this coroutine itself was cancelled
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        return True
    task.result()  # its failure, if any
    return False


async def until_exit(core: Core, lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The lines, until an answer asked the bot to exit (checked before reading the next line)."""
    async for line in lines:
        yield line
        if core.exit_code is not None:
            return


async def run_platforms(settings: Settings, core: Core) -> int:
    """Start every configured platform adapter and the reminders, and run until interrupted."""
    adapters: list[Adapter] = []
    hooks: list[tuple[str, Handler]] = []  # (path, handler) of each webhook the web server takes
    for platform in configured(settings):
        adapter = platform.make(core, settings)
        adapters.append(adapter)
        path, handler = getattr(adapter, "webhook_path", None), getattr(adapter, "on_webhook", None)
        if path is not None and handler is not None:  # Telegram's webhook, Slack's Events API
            hooks.append((path, handler))
    if not adapters:
        return 2
    started: list[Adapter] = []
    # health and metrics while polling only when PORT is set; webhook mode always serves it (Telegram posts there)
    webhook = bool(hooks)  # Telegram's webhook or Slack's Events API: served on PORT
    host = settings.HOST or ALL_INTERFACES  # every interface unless HOST: a PaaS or container reaches it from outside
    serving = settings.serve_http or webhook
    web = web_server(core, [a.platform for a in adapters], settings.PORT, host) if serving else None
    http = serve_api(web) if web is not None else None
    for path, handler in hooks:
        if web is not None:
            web.add_webhook(path, handler)
    try:
        with stop_signals(core) as stop:
            if web is not None:  # first, so /healthz answers during a slow start (/readyz waits for the adapters)
                await web.start()
            for adapter in adapters:
                await adapter.start()
                started.append(adapter)
                log.info("%s adapter started", adapter.platform)
            freeze_startup_objects()
            outboxes: dict[str, Outbox] = {a.platform: a for a in started}
            if http is not None:  # reminders set in an API session are delivered into it
                outboxes[API_PLATFORM] = http.api
            await serve_until_stopped(settings, core, outboxes, stop)
    finally:
        for adapter in reversed(started):
            await adapter.stop()
        if web is not None:
            await web.stop()
    return core.exit_code or 0


@contextmanager
def stop_signals(core: Core) -> Iterator[asyncio.Event]:
    """An event set by the first SIGINT/SIGTERM (stop after draining running answers; a second one cuts them now)
    or by a full restart; the signals are the process's own again when the block ends."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            core.hurry()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    core.on_exit(stop.set)  # restart(mode="full"), after its answer was sent
    try:
        yield stop
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def serve_until_stopped(
    settings: Settings, core: Core, outboxes: Mapping[str, Outbox], stop: asyncio.Event
) -> None:
    """Run the reminders through `outboxes` until `stop`, then drain, in the fleet the whole time."""
    # in the fleet until drained: the answers still going out count in the processes sharing Telegram's rate
    async with core.in_fleet():
        async with core.running(outboxes):
            await stop.wait()
        # SIGTERM/SIGINT or a full restart: take no new updates; running answers finish within the grace, the
        # rest are cut and handed back to other processes; then the process leaves the fleet, the front ends stop
        await core.drain(settings.SHUTDOWN_GRACE_SECONDS)


def web_server(core: Core, adapters: Sequence[str], port: int, host: str, *, public: bool = False) -> WebServer:
    """The HTTP server (health, metrics, webhooks, the API), its libraries loaded now: only a start that serves HTTP
    pays for them."""
    from bot.web import WebServer

    return WebServer(core, adapters, port, host, public=public)


def serve_api(web: WebServer) -> HttpApi:
    """The sessions API on `web` (its /v1 routes, every error in the API's shape)."""
    from adapters.http import serve_api as serve_on

    return serve_on(web.app, web.core)


def reachable_url(host: str, port: int) -> str:
    """The URL to print for a server listening on host:port (all interfaces: this machine's loopback)."""
    if host in (ALL_INTERFACES, ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve_host(settings: Settings) -> str:
    """Where `bot serve` listens: HOST (`--host`), else every interface when the bot is deployed publicly
    (PUBLIC_BASE_URL or TELEGRAM_WEBHOOK_URL), else loopback only."""
    if settings.HOST is not None:
        return settings.HOST
    return ALL_INTERFACES if settings.public_base_url is not None else LOOPBACK


def listening_at(host: str, port: int) -> str:
    """Where a server on host:port listens, as its banner says it: its URL, or every interface and a URL here."""
    url = reachable_url(host, port)
    return f"all interfaces, port {port}: {url}" if host in (ALL_INTERFACES, "", "::") else url


async def run_serve(settings: Settings, core: Core) -> int:
    """`bot serve`: the HTTP API and the reminders (delivered into API sessions), no platform adapter, on PORT or,
    when PORT is unset, a free port, at `serve_host`; prints where once listening and runs until SIGINT/SIGTERM, then
    drains. Not on loopback, /metrics needs METRICS_TOKEN."""
    host = serve_host(settings)
    web = web_server(core, (), settings.PORT if settings.serve_http else 0, host, public=not is_loopback(host))
    http = serve_api(web)
    try:
        with stop_signals(core) as stop:
            await web.start()
            print(SERVING.format(where=listening_at(web.host, web.port)), flush=True)
            core.web_url = reachable_url(web.host, web.port)
            signin = await core.signin_line(console.console_incoming("/web"), core.web_url)  # like Jupyter's token
            if signin is not None:
                print(signin, flush=True)
            freeze_startup_objects()
            await serve_until_stopped(settings, core, {API_PLATFORM: http.api}, stop)
    finally:
        await web.stop()
    return core.exit_code or 0
