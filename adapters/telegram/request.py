"""PTB plumbing: a request class on aiohttp (about 1 ms less CPU per Bot API call than httpx), the bot class (PTB's,
plus getUpdates as Telegram sent it) and a rate limiter that keeps this process to its share of the bot's messages
(Telegram's 30 per second are per bot, shared by every process running it), waits out every 429 within a budget and
keeps best-effort calls (typing, drafts) out of it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, cast

import aiohttp

# the types of the request methods this class overrides: PTB declares them only in its private _utils (mypy checks the
# overrides' signatures against them)
from telegram._utils.defaultvalue import DefaultValue
from telegram._utils.types import JSONDict, ODVInput
from telegram.constants import FloodLimit
from telegram.error import NetworkError, RetryAfter, TimedOut
from telegram.ext import AIORateLimiter, ExtBot
from telegram.request import BaseRequest, RequestData

from adapters.telegram.limits import TELEGRAM_CONNECTIONS, TELEGRAM_REQUEST_TIMEOUT_S, TELEGRAM_SEND_SHARE

log = logging.getLogger(__name__)

BEST_EFFORT = frozenset({"sendChatAction", "sendMessageDraft"})  # previews: sent at once or not at all
BOT_MESSAGES_PER_S = int(FloodLimit.MESSAGES_PER_SECOND)  # Telegram's limit per bot, however many processes run it
_TOKEN_IN_URL = re.compile(r"/bot[^/\s]+")


# PTB loggers that may print a Bot API URL (e.g. "Set Bot API URL: …/bot<token>" at DEBUG when a bot is built)
_URL_LOGGERS = ("telegram.Bot", "telegram.ext.ExtBot", "telegram.ext.Updater", "telegram.ext.Application", "httpx")


def redact_token(text: str) -> str:
    """`text` with the bot token of any Bot API URL in it replaced by `<token>`."""
    return _TOKEN_IN_URL.sub("/bot<token>", text)


def one_line(e: BaseException) -> str:
    """The error's message on one line (its type when it says nothing), without a bot token."""
    return " ".join(redact_token(str(e)).split()) or type(e).__name__


class _RedactToken(logging.Filter):
    """Rewrites a record's message without the bot token."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Format the message once, redacted; always keep the record."""
        message = record.getMessage()
        if "/bot" in message:
            record.msg, record.args = redact_token(message), None
        return True


def redact_tokens_in_logs() -> None:
    """Install the token filter on PTB's (and httpx's) loggers, once."""
    for name in _URL_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactToken) for f in logger.filters):
            logger.addFilter(_RedactToken())


class AiohttpRequest(BaseRequest):
    """PTB's BaseRequest over one aiohttp session (text parameters, and multipart for a file the bot sends)."""

    def __init__(
        self,
        *,
        read_timeout: float | None = TELEGRAM_REQUEST_TIMEOUT_S,
        connect_timeout: float | None = TELEGRAM_REQUEST_TIMEOUT_S,
        pool_size: int = TELEGRAM_CONNECTIONS,
        on_success: Callable[[], None] | None = None,
    ) -> None:
        """Configure timeouts and the connection pool; `on_success` runs after each 200 answer."""
        self._read_timeout = read_timeout
        self._connect_timeout = connect_timeout
        self._pool_size = pool_size
        self._on_success = on_success
        self._session: aiohttp.ClientSession | None = None

    @property
    def read_timeout(self) -> float | None:
        """Seconds a call waits for Telegram's answer unless it says otherwise (PTB adds a long poll's wait to it)."""
        return self._read_timeout

    async def initialize(self) -> None:
        """Open the session (inside the running event loop)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self._pool_size))

    async def shutdown(self) -> None:
        """Close the session."""
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        write_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        connect_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        pool_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        """Send one request; network trouble becomes PTB's NetworkError / TimedOut."""
        if self._session is None or self._session.closed:
            raise RuntimeError("AiohttpRequest is not initialized")
        read = self._read_timeout if isinstance(read_timeout, DefaultValue) else read_timeout
        connect = self._connect_timeout if isinstance(connect_timeout, DefaultValue) else connect_timeout
        upload = request_data is not None and request_data.contains_files
        total = write_timeout if upload and not isinstance(write_timeout, DefaultValue) else None
        timeout = aiohttp.ClientTimeout(total=total, sock_connect=connect, sock_read=read)
        data: Any = None
        if request_data is not None:
            data = _form(request_data) if upload else request_data.json_parameters
        try:
            async with self._session.request(
                method, url, data=data, timeout=timeout, headers={"User-Agent": self.USER_AGENT}
            ) as resp:
                body = await resp.read()
                status = resp.status
        except TimeoutError as e:
            raise TimedOut from e
        except (aiohttp.ClientError, ValueError) as e:  # some carry the URL, which holds the token (ValueError: yarl)
            raise NetworkError(redact_token(f"aiohttp.{type(e).__name__}: {e}")) from None
        if status == 200 and self._on_success is not None:
            self._on_success()
        return status, body


def _form(request_data: RequestData) -> aiohttp.FormData:
    """A request with a file (sendDocument) as multipart form data: its parameters, then its files."""
    form = aiohttp.FormData()
    for name, value in request_data.json_parameters.items():
        form.add_field(name, value)
    for name, (filename, content, mimetype) in request_data.multipart_data.items():
        form.add_field(name, content, filename=filename, content_type=mimetype)
    return form


class TelegramBot(ExtBot[int]):
    """PTB's ExtBot (sends paced by the rate limiter) that can also fetch updates as Telegram sent them: the poller
    stores that very JSON and parses it once (PTB's get_updates parses it, and storing its Updates would take turning
    them back into dicts, which costs as much again)."""

    async def updates_as_sent(self, offset: int, timeout: int, allowed: Sequence[str]) -> list[JSONDict]:
        """getUpdates: the updates from `offset` on, waiting up to `timeout` s for one (the read timeout is the
        getUpdates request's own)."""
        data: JSONDict = {"offset": offset, "timeout": timeout, "allowed_updates": list(allowed)}
        return cast(list[JSONDict], await self._post("getUpdates", data))


Callback = Callable[..., Coroutine[Any, Any, bool | JSONDict | list[JSONDict]]]


def fleet_share(processes: int) -> tuple[float, float]:
    """One of `processes` processes' part of the bot's messages, as (burst, rate a second) of a leaky bucket: 1/n of
    the fleet's TELEGRAM_SEND_SHARE of Telegram's 30 (27 at once, 27 a second), so the n of them together send at most
    27 + 27·t in any t seconds; a process may always send one at once, so past 27 processes that burst is n."""
    n = max(1, processes)
    fleet = BOT_MESSAGES_PER_S * TELEGRAM_SEND_SHARE
    return max(1.0, fleet / n), fleet / n


class SendBucket:
    """A leaky bucket of sends (the caller passes the time): each send pours in one, `rate` a second leak out, and a
    send fits while the bucket holds at most `burst` - 1, so any t seconds see at most burst + rate·t sends."""

    SLACK = 1e-9  # float rounding: a bucket this close to holding one more send holds it

    def __init__(self, burst: float, rate: float) -> None:
        """An empty bucket letting `burst` sends out at once and `rate` a second after that."""
        self.burst, self.rate = burst, rate
        self._level = 0.0  # sends still in the bucket
        self._at: float | None = None  # when the level was last brought up to date

    def resize(self, burst: float, rate: float, now: float) -> None:
        """Let `burst` out at once and `rate` a second from `now` on (sends already made stay in the bucket)."""
        self._leak(now)
        self.burst, self.rate = max(1.0, burst), rate

    def _leak(self, now: float) -> None:
        """Let out what leaked since the level was last brought up to date (nothing if the clock went back)."""
        if self._at is not None and now > self._at:
            self._level = max(0.0, self._level - (now - self._at) * self.rate)
        self._at = now

    def free(self, now: float) -> int:
        """How many sends fit at `now`."""
        self._leak(now)
        return max(0, math.floor(self.burst - self._level + self.SLACK))

    def wait_s(self, now: float) -> float:
        """Seconds from `now` until one more send fits (0: at once)."""
        self._leak(now)
        over = self._level + 1 - self.burst
        return over / self.rate if over > self.SLACK else 0.0

    def record(self, now: float) -> None:
        """A send was made at `now`."""
        self._leak(now)
        self._level += 1


class PatientRateLimiter(AIORateLimiter):
    """This process's share of the bot's messages (`share`: a leaky bucket, 27 at once and 27 a second divided among
    the processes running the bot) and AIORateLimiter's 20 per minute per group; a 429 is waited out as often as
    it takes within `max_wait_s` (PTB gives up after `max_retries`); best-effort calls bypass the share: they go out
    at once, are never retried, and are dropped while the bot is rate limited (by Telegram or by the share)."""

    def __init__(
        self,
        max_wait_s: float,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Wait at most `max_wait_s` in all for one request's 429s; `sleep`/`clock` are injectable for tests. The
        share starts as a single process's (all of the bot's messages)."""
        super().__init__(overall_max_rate=0, max_retries=0)  # no overall bucket: `budget` replaces it
        self.max_wait_s = max_wait_s
        self.sleep = sleep
        self.clock = clock
        self.limited_until = 0.0  # clock() before which Telegram asked us to send nothing
        self.processes = 1  # how many processes share the bot's messages (see share())
        self.budget = SendBucket(*fleet_share(1))
        self._budget_turn = asyncio.Lock()  # requests take places in the budget first come, first served
        self._stopping = asyncio.Event()  # set on shutdown: waiting requests give up at once

    def share(self, processes: int) -> None:
        """From now on send this process's share of the bot's messages when `processes` processes run the bot."""
        self.processes = max(1, processes)
        self.budget.resize(*fleet_share(self.processes), self.clock())

    def stop_waiting(self) -> None:
        """Shutting down: requests waiting out a 429 give up now (and later ones do not wait)."""
        self._stopping.set()

    async def _pause(self, seconds: float) -> None:
        """Sleep `seconds`, or raise RetryAfter as soon as stop_waiting() is called."""
        sleeper = asyncio.ensure_future(self.sleep(seconds))
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((sleeper, stopper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            stopper.cancel()
        if self._stopping.is_set():
            raise RetryAfter(int(seconds) + 1)

    def _note_retry_after(self, exc: RetryAfter) -> float:
        """Remember Telegram's pause for every request; return the wait in seconds (PTB's +0.1 s margin)."""
        wait = exc._retry_after.total_seconds() + 0.1  # the timedelta: retry_after's type varies by PTB version
        self.limited_until = max(self.limited_until, self.clock() + wait)
        return wait

    async def process_request(
        self,
        callback: Callback,
        args: Any,
        kwargs: dict[str, Any],
        endpoint: str,
        data: dict[str, Any],
        rate_limit_args: int | None,
    ) -> bool | JSONDict | list[JSONDict]:
        """Send through the buckets, sleeping out 429s until `max_wait_s` is used up; best effort bypasses."""
        if endpoint in BEST_EFFORT:
            return await self._best_effort(callback, args, kwargs)
        chat_id = data.get("chat_id")
        with contextlib.suppress(ValueError, TypeError):
            chat_id = int(chat_id)  # type: ignore[arg-type]
        group: int | str | bool = (
            chat_id if isinstance(chat_id, str) or (isinstance(chat_id, int) and chat_id < 0) else False
        )
        deadline = self.clock() + self.max_wait_s
        while True:
            pause = self.limited_until - self.clock()
            if pause > 0:
                if self.clock() + pause > deadline or self._stopping.is_set():
                    self._give_up(endpoint, pause)
                    raise RetryAfter(int(pause) + 1)
                await self._pause(pause)
            try:
                return await self._send(
                    chat_id is not None, group, bool(data.get("allow_paid_broadcast", False)), callback, args, kwargs
                )
            except RetryAfter as exc:
                wait = self._note_retry_after(exc)
                if self.clock() + wait > deadline or self._stopping.is_set():
                    self._give_up(endpoint, wait)
                    raise
                log.info("Telegram rate limit on %s: retrying in %.1f s", endpoint, wait)

    async def _send(
        self, chat: bool, group: int | str | bool, paid: bool, callback: Callback, args: Any, kwargs: dict[str, Any]
    ) -> bool | JSONDict | list[JSONDict]:
        """One attempt: a paid broadcast through its own bucket; else through the group's bucket and, for a call about
        a chat, a place in this process's share of the bot's messages."""
        if paid:
            async with self._apb_limiter:
                return await callback(*args, **kwargs)
        if group and self._group_max_rate:
            async with self._get_group_limiter(group):
                return await self._budgeted(chat, callback, args, kwargs)
        return await self._budgeted(chat, callback, args, kwargs)

    async def _budgeted(
        self, chat: bool, callback: Callback, args: Any, kwargs: dict[str, Any]
    ) -> bool | JSONDict | list[JSONDict]:
        """Call after taking a place in the share (calls about a chat only), waiting for one first come, first served;
        a wait is cut short (RetryAfter) when the bot stops."""
        if chat:
            async with self._budget_turn:
                while (wait := self.budget.wait_s(self.clock())) > 0:
                    await self._pause(wait)
                self.budget.record(self.clock())
        return await callback(*args, **kwargs)

    def _give_up(self, endpoint: str, wait: float) -> None:
        """Say why a request is abandoned: Telegram's wait would end past its budget, or the bot is stopping."""
        why = "the bot is stopping" if self._stopping.is_set() else f"past its {self.max_wait_s:.0f} s budget"
        log.warning("Telegram rate limit: %s would have to wait %.0f s more, %s; giving up", endpoint, wait, why)

    async def _best_effort(
        self, callback: Callback, args: Any, kwargs: dict[str, Any]
    ) -> bool | JSONDict | list[JSONDict]:
        """One attempt outside the buckets; dropped (RetryAfter) while Telegram has asked us to wait or while
        answers queue for the message budget (a preview then only delays them)."""
        pause = self.limited_until - self.clock()
        if pause > 0:
            raise RetryAfter(int(pause) + 1)
        if self._budget_turn.locked() or self.budget.free(self.clock()) == 0:
            raise RetryAfter(1)
        try:
            return await callback(*args, **kwargs)
        except RetryAfter as exc:
            self._note_retry_after(exc)
            raise
