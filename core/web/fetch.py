"""A web page's main text as Markdown, in pages: fetch_page (one page of it) and fetch_document (all of them).

Every address, the first and each redirect's, passes core/web/safety.py before a request goes out, and the
connection goes to the addresses it checked. The body is streamed and decompressed here within WEB_FETCH_MAX_MB
(past it the fetch is refused, never cut), only the content types in READABLE are read, nothing is executed.
HTML's main text is found by trafilatura; a PDF goes through core.media.documents.extract."""

from __future__ import annotations

import asyncio
import codecs
import re
import zlib
from dataclasses import dataclass
from typing import Literal

import aiohttp
from yarl import URL

from core.constants import (
    MEDIA_DOC_DETECT_BYTES,
    WEB_CHARSET_SNIFF_BYTES,
    WEB_FETCH_TIMEOUT_S,
    WEB_MAX_REDIRECTS,
    WEB_PAGE_CHARS,
    WEB_READ_CHUNK_BYTES,
)
from core.media.documents import DocumentRefused, extract, split_pages
from core.settings import AllowedTarget, Settings
from core.textsafe import strip_nul
from core.web.body import CappedBody
from core.web.safety import Failed, NoPage, PinnedResolver, Refused, Resolve, check, shown, system_resolve

__all__ = ["Failed", "FetchPolicy", "NoPage", "Page", "Refused", "WebDocument", "fetch_document", "fetch_page"]

Kind = Literal["html", "text", "pdf"]
READABLE: dict[str, Kind] = {
    "text/html": "html",
    "application/xhtml+xml": "html",
    "text/plain": "text",
    "text/markdown": "text",
    "application/json": "text",
    "application/pdf": "pdf",
    "application/x-pdf": "pdf",
}
REDIRECTS = frozenset({301, 302, 303, 307, 308})
HEADERS = {
    "User-Agent": "Mozilla/5.0 (compatible; assistant-bot; reads a page a person asked for)",
    "Accept": "text/html,application/xhtml+xml,text/markdown;q=0.9,text/plain;q=0.9,application/pdf;q=0.8,"
    "application/json;q=0.5",
    "Accept-Encoding": "gzip, deflate",  # the only codings CappedBody decodes (within the cap)
}
META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]+)""", re.IGNORECASE)


@dataclass(frozen=True)
class FetchPolicy:
    """What a fetch may reach and read: the private addresses allowed anyway (WEB_ALLOW_PRIVATE), the size cap
    (WEB_FETCH_MAX_MB), the time cap for the whole fetch, redirects followed and the characters of one page."""

    allow_private: tuple[AllowedTarget, ...]
    max_mb: int
    timeout_s: float = WEB_FETCH_TIMEOUT_S
    max_redirects: int = WEB_MAX_REDIRECTS
    page_chars: int = WEB_PAGE_CHARS

    @classmethod
    def from_settings(cls, settings: Settings) -> FetchPolicy:
        """The policy the operator configured."""
        return cls(settings.web_allow_private, settings.WEB_FETCH_MAX_MB)

    @property
    def max_bytes(self) -> int:
        """The cap in bytes (an MB is a million bytes, as MEDIA_MAX_MB's)."""
        return self.max_mb * 1_000_000


@dataclass(frozen=True)
class Page:
    """One page of a fetched document: its Markdown `text`, the page's `title`, the final `url` (after redirects),
    `page` (from 1) of `pages`, and the `content_type` the server gave."""

    url: str
    title: str
    text: str
    page: int
    pages: int
    content_type: str


@dataclass(frozen=True)
class WebDocument:
    """A fetched document whole, split into pages (keep it to read several pages with one fetch)."""

    url: str
    title: str
    content_type: str
    pages: tuple[str, ...]

    def page(self, number: int) -> Page | Failed:
        """Page `number` (from 1), or Failed when there is no such page."""
        if not 1 <= number <= len(self.pages):
            return Failed(f"{shown(self.url)} has {len(self.pages)} page(s): there is no page {number}")
        return Page(self.url, self.title, self.pages[number - 1], number, len(self.pages), self.content_type)


async def fetch_page(
    url: str, page: int, policy: FetchPolicy, *, resolve: Resolve = system_resolve
) -> Page | Refused | Failed:
    """Page `page` (from 1) of the document at `url` as Markdown, or why not in one line (Refused: `refused: …`).

    `resolve` turns a host name into its addresses (the platform's resolver unless a test injects one)."""
    if page < 1:
        return Failed(f"pages count from 1: there is no page {page}")
    document = await fetch_document(url, policy, resolve=resolve)
    return document if isinstance(document, Refused | Failed) else document.page(page)


async def fetch_document(
    url: str, policy: FetchPolicy, *, resolve: Resolve = system_resolve
) -> WebDocument | Refused | Failed:
    """The document at `url` (after at most policy.max_redirects checked redirects) in pages, within the size and time
    caps; or Refused / Failed with one line."""
    try:
        async with asyncio.timeout(policy.timeout_s):
            return await _fetch(url, policy, resolve)
    except TimeoutError:
        return Failed(f"could not fetch {shown(url)}: no answer within {policy.timeout_s:g} s")
    except aiohttp.ClientError as e:
        return Failed(f"could not fetch {shown(url)}: {_network_reason(e)}")
    except OSError as e:
        return Failed(f"could not fetch {shown(url)}: {e.strerror or type(e).__name__}")


async def _fetch(url: str, policy: FetchPolicy, resolve: Resolve) -> WebDocument | Refused | Failed:
    """The request loop: check an address, pin it, ask for it, follow a redirect back to the check."""
    pins = PinnedResolver()
    connector = aiohttp.TCPConnector(resolver=pins, use_dns_cache=False, force_close=True)
    async with aiohttp.ClientSession(
        connector=connector,
        headers=HEADERS,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,  # _Body decompresses, counting the decoded bytes against the cap
        trust_env=False,  # no proxy from the environment: the connection goes to the checked address
    ) as session:
        current: URL | str = url
        for _ in range(policy.max_redirects + 1):
            target = await check(current, policy.allow_private, resolve)
            if isinstance(target, Refused | Failed):
                return target
            assert not isinstance(target, NoPage)
            pins.pin(target)
            async with session.get(target.url, allow_redirects=False) as response:
                if response.status in REDIRECTS:
                    location = response.headers.get("Location", "").strip()
                    if not location:
                        return Failed(f"could not fetch {shown(target.url)}: HTTP {response.status} without a Location")
                    try:
                        current = target.url.join(URL(location))
                    except ValueError:
                        return Refused("refused: the redirect leads to no web address")
                    continue
                if response.status >= 300 or response.status < 200:
                    return Failed(f"could not fetch {shown(target.url)}: HTTP {response.status}")
                return await _read(response, target.url, policy)
        return Refused(f"refused: too many redirects (more than {policy.max_redirects})")


async def _read(response: aiohttp.ClientResponse, url: URL, policy: FetchPolicy) -> WebDocument | Refused | Failed:
    """The answer's body, streamed within the cap, as a document in pages."""
    content_type = response.content_type.lower()
    kind = READABLE.get(content_type)
    if kind is None:
        return Refused(f"refused: {content_type} is not a page I can read")
    too_large = Refused(f"refused: the page is over {policy.max_mb} MB")
    if response.content_length is not None and response.content_length > policy.max_bytes:
        return too_large
    coding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if coding not in CappedBody.CODINGS:
        return Failed(f"could not fetch {shown(url)}: the page came {coding}-encoded, which I do not read")
    body = CappedBody(coding, policy.max_bytes)
    try:
        async for chunk in response.content.iter_chunked(WEB_READ_CHUNK_BYTES):
            if not body.feed(chunk):
                return too_large
        if not body.finish():
            return too_large
    except zlib.error:
        return Failed(f"could not fetch {shown(url)}: its compressed body is damaged")
    data = body.data()
    final = str(url)
    if kind == "pdf":
        name = url.name or "page.pdf"
        try:
            document = await extract(data, name, "application/pdf", max_bytes=policy.max_bytes)
        except DocumentRefused as e:
            return Failed(f"could not read the PDF at {shown(url)}: {e}")
        pages = tuple(p for p in document.pages if p.strip()) or document.pages
        return WebDocument(final, name, content_type, pages)
    if kind == "html":
        title, text = await asyncio.to_thread(_html_markdown, _decode(data, response.charset, html=True), final)
    else:
        title, text = url.name or url.host or final, _decode(data, response.charset, html=False)
    text = re.sub(r"\n{3,}", "\n\n", strip_nul(text).strip())
    if not text:
        return Failed(f"could not read {shown(url)}: the page has no text")
    return WebDocument(final, strip_nul(title), content_type, tuple(split_pages(text, policy.page_chars)))


def _decode(data: bytes, charset: str | None, *, html: bool) -> str:
    """Bytes as text: the charset the server named, else an HTML page's <meta charset>, else UTF-8, else a guess."""
    named = [charset]
    if html:
        found = META_CHARSET.search(data[:WEB_CHARSET_SNIFF_BYTES])
        named.append(found.group(1).decode("ascii") if found else None)
    for candidate in named:
        if candidate:
            try:
                return data.decode(codecs.lookup(candidate).name, errors="replace")
            except LookupError:
                continue
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        import charset_normalizer  # loaded by the first page that is not UTF-8

        guess = charset_normalizer.from_bytes(data[:MEDIA_DOC_DETECT_BYTES]).best()
        return data.decode(guess.encoding if guess else "latin-1", errors="replace")


def _html_markdown(html: str, url: str) -> tuple[str, str]:
    """An HTML page's title and main text as Markdown (trafilatura: no scripts run, navigation and boilerplate left
    out; the whole visible text if it finds no main text). Runs in a worker thread."""
    import trafilatura  # here: its import takes ~0.3 s, which a bot that never fetches a page should not pay

    text = None
    for recall in (False, True):  # the main text; when none is found, again favouring recall
        text = text or trafilatura.extract(
            html,
            url=url,
            output_format="markdown",
            favor_recall=recall,
            include_links=True,
            include_tables=True,
            include_formatting=True,
            include_comments=False,
        )
    if not text:
        text = trafilatura.html2txt(html)
    metadata = trafilatura.extract_metadata(html, default_url=url, extensive=False)
    title = metadata.title if metadata is not None and metadata.title else ""
    return title.strip() or URL(url).host or url, text or ""


def _network_reason(error: aiohttp.ClientError) -> str:
    """A network failure in a few words (no traceback; the address is said by the caller)."""
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        return "its certificate is not valid"
    if isinstance(error, aiohttp.ClientConnectorError):
        return "could not connect" + (f" ({error.os_error.strerror})" if error.os_error.strerror else "")
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(error, aiohttp.ClientPayloadError):
        return "the answer was cut short"
    if isinstance(error, aiohttp.InvalidURL):
        return "not a web address"
    return type(error).__name__
