"""core/web/fetch.py and safety.py: a page's main text as Markdown in pages, and every way a fetch is refused.

Real aiohttp servers on 127.0.0.1 (ephemeral ports). The one a test fetches from is allowed by WEB_ALLOW_PRIVATE's
`127.0.0.1:<port>`; a second one on another port counts its requests, and every refusal of an address asserts it got
none. Names resolve through an injected resolver (nothing leaves the machine); every fetch has the policy's time cap."""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest
from aiohttp import web

from core.settings import SettingsError, load_settings, parse_allow_private
from core.web.fetch import FetchPolicy, Page, WebDocument, fetch_document, fetch_page
from core.web.safety import Failed, Refused, check, refusal
from tests.loopback import LoopbackServer
from tests.test_media_documents import pdf

MB = 1_000_000
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PARAGRAPH = (
    "Tides are the rise and fall of sea levels caused by the combined effects of the gravitational forces exerted "
    "by the Moon and the Sun, and the rotation of the Earth. Most coasts see two high tides and two low tides a day."
)


def article(paragraphs: int = 3) -> str:
    """An article page with navigation, a sidebar, a cookie banner and a footer around its main text."""
    body = "".join(f"<h2>Part {i}</h2><p>{PARAGRAPH} (part {i})</p>" for i in range(1, paragraphs + 1))
    return (
        "<!doctype html><html><head><title>How tides work | Ocean Weekly</title>"
        "<script>document.title = 'ran'</script></head><body>"
        "<nav><a href='/'>Home</a> <a href='/news'>News</a> <a href='/login'>Log in</a></nav>"
        "<div class='cookie-banner'>We use cookies. <button>Accept all</button></div>"
        "<aside class='sidebar'><h3>Popular</h3><ul><li><a href='/a'>Whale songs ranked</a></li></ul></aside>"
        f"<main><article><h1>How tides work</h1>{body}"
        "<p>See <a href='https://en.wikipedia.org/wiki/Tide'>the encyclopedia</a>.</p></article></main>"
        "<footer>© Ocean Weekly. All rights reserved. <a href='/privacy'>Privacy</a></footer></body></html>"
    )


class Site(LoopbackServer):
    """A server on 127.0.0.1 with the routes a test gives it, counting the requests it gets."""

    def __init__(self, routes: dict[str, Handler] | None = None) -> None:
        """Serve `routes` (path → handler); any other path answers 200 "hello"."""
        super().__init__()
        self.requests: list[str] = []
        self.hosts: list[str] = []
        self._routes = routes or {}
        self._app.router.add_route("*", "/{tail:.*}", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        """Count the request, then answer it."""
        self.requests.append(request.path)
        self.hosts.append(request.host)
        handler = self._routes.get(request.path)
        return await handler(request) if handler is not None else web.Response(text="hello")

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.origin.rpartition(":")[2])


@pytest.fixture
async def bystander() -> AsyncIterator[Site]:
    """A loopback server nobody allowed: a refused fetch must not reach it."""
    async with Site() as site:
        yield site


def policy_for(*sites: Site, max_mb: int = 5, page_chars: int = 3000, timeout_s: float = 10.0) -> FetchPolicy:
    """WEB_ALLOW_PRIVATE=127.0.0.1:<port> for each site (parsed as the setting is)."""
    allow = parse_allow_private(",".join(f"127.0.0.1:{s.port}" for s in sites))
    return FetchPolicy(allow, max_mb, timeout_s=timeout_s, page_chars=page_chars)


def resolver(table: dict[str, list[str]], calls: list[str] | None = None) -> Callable[[str], Awaitable[Sequence[str]]]:
    """A resolver answering from `table` (no network), recording each name it is asked for."""

    async def resolve(host: str) -> Sequence[str]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise OSError(f"{host} is not in the test's table")
        return table[host]

    return resolve


async def never_resolve(host: str) -> Sequence[str]:
    """A resolver that must not be asked (numeric hosts are read, not looked up)."""
    raise AssertionError(f"asked to resolve {host}")


def html(text: str) -> Handler:
    """A handler answering `text` as HTML."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(text=text, content_type="text/html")

    return handle


def redirect(location: Callable[[], str]) -> Handler:
    """A handler answering 302 to location()."""

    async def handle(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(location())

    return handle


# What is read


async def test_an_article_becomes_its_main_text_as_markdown_with_its_title() -> None:
    async with Site({"/tides": html(article())}) as site:
        got = await fetch_page(f"{site.origin}/tides", 1, policy_for(site))
    assert isinstance(got, Page), got
    assert (got.title, got.url, got.page, got.pages, got.content_type) == (
        "How tides work",
        f"{site.origin}/tides",
        1,
        1,
        "text/html",
    )
    assert got.text.startswith("# How tides work")
    assert "## Part 2" in got.text and PARAGRAPH in got.text
    assert "[the encyclopedia](https://en.wikipedia.org/wiki/Tide)" in got.text
    for boilerplate in ("Log in", "Accept all", "Whale songs", "All rights reserved", "document.title"):
        assert boilerplate not in got.text


async def test_a_long_page_is_split_into_pages_and_page_two_is_readable() -> None:
    async with Site({"/long": html(article(40))}) as site:
        policy = policy_for(site)
        first = await fetch_page(f"{site.origin}/long", 1, policy)
        second = await fetch_page(f"{site.origin}/long", 2, policy)
        past = await fetch_page(f"{site.origin}/long", 99, policy)
        whole = await fetch_document(f"{site.origin}/long", policy)
    assert isinstance(first, Page) and isinstance(second, Page) and isinstance(whole, WebDocument)
    assert first.pages == second.pages == len(whole.pages) >= 3
    assert all(len(p) <= 3000 for p in whole.pages)
    assert "(part 1)" in first.text and "(part 1)" not in second.text and "## Part" in second.text
    assert second.text == whole.pages[1]
    assert isinstance(past, Failed) and past.message.endswith("there is no page 99")


async def test_the_final_url_after_an_allowed_redirect() -> None:
    async with Site() as site:
        site._routes.update({"/old": redirect(lambda: "/new"), "/new": html(article())})
        got = await fetch_page(f"{site.origin}/old", 1, policy_for(site))
    assert isinstance(got, Page), got
    assert got.url == f"{site.origin}/new" and site.requests == ["/old", "/new"]


async def test_a_pdf_goes_through_the_document_extractor() -> None:
    async def report(request: web.Request) -> web.StreamResponse:
        return web.Response(body=pdf(["First page of the report", "Second page"]), content_type="application/pdf")

    async with Site({"/report.pdf": report}) as site:
        first = await fetch_page(f"{site.origin}/report.pdf", 1, policy_for(site))
        second = await fetch_page(f"{site.origin}/report.pdf", 2, policy_for(site))
    assert isinstance(first, Page) and isinstance(second, Page), (first, second)
    assert (first.title, first.pages, first.content_type) == ("report.pdf", 2, "application/pdf")
    assert "First page of the report" in first.text and "Second page" in second.text


async def test_plain_text_gzip_and_a_legacy_charset_are_read() -> None:
    async def notes(request: web.Request) -> web.StreamResponse:
        body = gzip.compress("Grüße aus Köln\n".encode("latin-1"))
        headers = {"Content-Encoding": "gzip", "Content-Type": "text/plain; charset=iso-8859-1"}
        return web.Response(body=body, headers=headers)

    async with Site({"/notes.txt": notes}) as site:
        got = await fetch_page(f"{site.origin}/notes.txt", 1, policy_for(site))
    assert isinstance(got, Page), got
    assert (got.text, got.title) == ("Grüße aus Köln", "notes.txt")


async def test_a_name_is_resolved_once_and_the_connection_goes_to_the_checked_address() -> None:
    """intranet.test exists only in the injected resolver: the fetch works only because aiohttp connects to the
    address the check pinned (it never looks the name up again), and the server sees the name in Host."""
    calls: list[str] = []
    async with Site({"/": html(article())}) as site:
        resolve = resolver({"intranet.test": ["127.0.0.1"]}, calls)
        got = await fetch_page(f"http://intranet.test:{site.port}/", 1, policy_for(site), resolve=resolve)
    assert isinstance(got, Page), got
    assert calls == ["intranet.test"] and site.hosts == [f"intranet.test:{site.port}"]


# Refused: where a fetch may not go (the server behind the address gets no request)


async def test_a_loopback_port_not_listed_is_refused(bystander: Site) -> None:
    async with Site() as allowed:
        got = await fetch_page(f"{bystander.origin}/", 1, policy_for(allowed))
        fine = await fetch_page(f"{allowed.origin}/", 1, policy_for(allowed))
    assert got == Refused("refused: 127.0.0.1 is a loopback address")
    assert isinstance(fine, Page) and bystander.requests == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://10.0.0.5/", "refused: 10.0.0.5 is a private address"),
        ("http://192.168.1.1/", "refused: 192.168.1.1 is a private address"),
        ("http://100.64.0.1/", "refused: 100.64.0.1 is a carrier-grade NAT address"),
        ("http://169.254.1.1/", "refused: 169.254.1.1 is a link-local address"),
        ("http://224.0.0.1/", "refused: 224.0.0.1 is a multicast address"),
        ("http://240.0.0.1/", "refused: 240.0.0.1 is a private address"),
        ("http://[::1]/", "refused: ::1 is a loopback address"),
        ("http://[fd12::1]/", "refused: fd12::1 is a private address"),
        ("http://[fe80::1]/", "refused: fe80::1 is a link-local address"),
        ("http://[::]/", "refused: :: is the unspecified address"),
        ("http://169.254.169.254/latest/meta-data/", "refused: 169.254.169.254 is a cloud metadata address"),
        ("http://[fd00:ec2::254]/", "refused: fd00:ec2::254 is a cloud metadata address"),
        (
            "http://metadata.google.internal/computeMetadata/v1/",
            "refused: metadata.google.internal is a cloud metadata address",
        ),
        ("http://2002:7f00:1::/", "refused: that is not a web address"),
        ("http://[2002:7f00:1::]/", "refused: 2002:7f00:1:: is a loopback address inside an IPv6 address"),
        ("http://[64:ff9b::a00:5]/", "refused: 64:ff9b::a00:5 is a private address inside an IPv6 address"),
        ("ftp://example.com/file", "refused: only http and https"),
        ("file:///etc/passwd", "refused: only http and https"),
        ("javascript:alert(1)", "refused: only http and https"),
        ("not a url", "refused: only http and https"),
    ],
)
async def test_addresses_that_are_not_public_are_refused_without_a_lookup(url: str, message: str) -> None:
    assert await fetch_page(url, 1, FetchPolicy((), 5, timeout_s=10.0), resolve=never_resolve) == Refused(message)


async def test_metadata_stays_refused_even_when_listed() -> None:
    allow = parse_allow_private("169.254.0.0/16,0.0.0.0")
    for url, message in [
        ("http://169.254.169.254/", "refused: 169.254.169.254 is a cloud metadata address"),
        ("http://0.0.0.0/", "refused: 0.0.0.0 is the unspecified address"),
    ]:
        assert await fetch_page(url, 1, FetchPolicy(allow, 5), resolve=never_resolve) == Refused(message)


@pytest.mark.parametrize(
    ("host", "means"),
    [
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("[::ffff:127.0.0.1]", "127.0.0.1"),
    ],
)
async def test_numeric_tricks_are_refused_like_the_address_they_mean(bystander: Site, host: str, means: str) -> None:
    async with Site() as allowed:
        got = await fetch_page(f"http://{host}:{bystander.port}/", 1, policy_for(allowed), resolve=never_resolve)
        # the same form on the allowed port reaches 127.0.0.1: it is read as that address, not as a name
        fine = await fetch_page(f"http://{host}:{allowed.port}/", 1, policy_for(allowed), resolve=never_resolve)
    shown = "::ffff:7f00:1" if host.startswith("[") else host
    assert got == Refused(f"refused: {shown} is {means}, a loopback address")
    assert isinstance(fine, Page), fine
    assert bystander.requests == [] and allowed.requests == ["/"]


async def test_zero_and_an_impossible_number_are_refused(bystander: Site) -> None:
    policy = FetchPolicy(parse_allow_private(f"127.0.0.1:{bystander.port}"), 5)
    assert await fetch_page("http://0.0.0.0/", 1, policy, resolve=never_resolve) == Refused(
        "refused: 0.0.0.0 is the unspecified address"
    )
    assert await fetch_page(f"http://0:{bystander.port}/", 1, policy, resolve=never_resolve) == Refused(
        "refused: 0 is 0.0.0.0, the unspecified address"
    )
    assert await fetch_page("http://99999999999/", 1, policy, resolve=never_resolve) == Refused(
        "refused: 99999999999 is not a valid address"
    )
    assert bystander.requests == []


async def test_a_name_resolving_to_loopback_is_refused(bystander: Site) -> None:
    calls: list[str] = []
    resolve = resolver({"sneaky.test": ["93.184.216.34", "127.0.0.1"]}, calls)  # one bad address is enough
    async with Site() as allowed:
        got = await fetch_page(f"http://sneaky.test:{bystander.port}/", 1, policy_for(allowed), resolve=resolve)
    assert got == Refused("refused: sneaky.test resolves to 127.0.0.1, a loopback address")
    assert calls == ["sneaky.test"] and bystander.requests == []


async def test_a_name_that_does_not_resolve_is_a_failure_in_one_line() -> None:
    got = await fetch_page("http://nowhere.test/", 1, FetchPolicy((), 5), resolve=resolver({}))
    assert got == Failed("could not fetch http://nowhere.test/: the name nowhere.test does not resolve")


async def test_credentials_in_the_url_are_refused(bystander: Site) -> None:
    policy = policy_for(bystander)  # even to an allowed server
    for url in (f"http://user:secret@127.0.0.1:{bystander.port}/", f"http://user@127.0.0.1:{bystander.port}/"):
        got = await fetch_page(url, 1, policy, resolve=never_resolve)
        assert got == Refused("refused: an address with a user name or password in it")
        assert "secret" not in got.message
    assert bystander.requests == []


async def test_a_redirect_into_an_unlisted_port_or_the_metadata_address_is_refused(bystander: Site) -> None:
    async with Site() as site:
        site._routes.update(
            {
                "/jump": redirect(lambda: f"{bystander.origin}/inside"),
                "/meta": redirect(lambda: "http://169.254.169.254/latest/meta-data/"),
                "/ftp": redirect(lambda: "ftp://example.com/"),
                "/named": redirect(lambda: f"http://intranet.test:{bystander.port}/"),
            }
        )
        policy = policy_for(site)
        resolve = resolver({"intranet.test": ["127.0.0.1"]})
        jump = await fetch_page(f"{site.origin}/jump", 1, policy, resolve=resolve)
        meta = await fetch_page(f"{site.origin}/meta", 1, policy, resolve=resolve)
        ftp = await fetch_page(f"{site.origin}/ftp", 1, policy, resolve=resolve)
        named = await fetch_page(f"{site.origin}/named", 1, policy, resolve=resolve)
    assert jump == Refused("refused: 127.0.0.1 is a loopback address")
    assert meta == Refused("refused: 169.254.169.254 is a cloud metadata address")
    assert ftp == Refused("refused: only http and https")
    assert named == Refused("refused: intranet.test resolves to 127.0.0.1, a loopback address")
    assert bystander.requests == [] and site.requests == ["/jump", "/meta", "/ftp", "/named"]


async def test_a_redirect_loop_stops_after_five() -> None:
    async with Site() as site:
        site._routes["/loop"] = redirect(lambda: "/loop")
        got = await fetch_page(f"{site.origin}/loop", 1, policy_for(site))
    assert got == Refused("refused: too many redirects (more than 5)")
    assert site.requests == ["/loop"] * 6  # the first request and five redirects followed, no seventh


# Refused: what a fetch does not read


async def test_a_page_over_the_cap_is_refused_whole(bystander: Site) -> None:
    async def declared(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"a" * (6 * MB), content_type="text/plain")

    async def streamed(request: web.Request) -> web.StreamResponse:
        """A 50 MB body without Content-Length (chunked), written 64 KB at a time."""
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = b"b" * 65536
        try:
            for _ in range(50 * MB // len(chunk)):
                await response.write(chunk)
        except (ConnectionError, RuntimeError):
            pass  # the client stopped reading at the cap
        return response

    async with Site({"/declared": declared, "/streamed": streamed}) as site:
        policy = policy_for(site, max_mb=5)
        declared_got = await fetch_page(f"{site.origin}/declared", 1, policy)
        tracemalloc.start()
        try:
            streamed_got = await fetch_page(f"{site.origin}/streamed", 1, policy)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert declared_got == streamed_got == Refused("refused: the page is over 5 MB")
    assert peak < 8 * MB, f"reading the body held {peak / MB:.1f} MB at its peak"


async def test_a_gzip_bomb_is_refused_at_the_cap_of_its_decoded_size() -> None:
    bomb = gzip.compress(b"\0" * (60 * MB), compresslevel=9)  # ~60 KB that decode to 60 MB
    deflated = zlib.compress(b"<p>x</p>" * (2 * MB), 9)

    async def gzipped(request: web.Request) -> web.StreamResponse:
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip", "Content-Type": "text/html"})

    async def deflate(request: web.Request) -> web.StreamResponse:
        return web.Response(body=deflated, headers={"Content-Encoding": "deflate", "Content-Type": "text/html"})

    async with Site({"/bomb": gzipped, "/deflate": deflate}) as site:
        tracemalloc.start()
        try:
            got = await fetch_page(f"{site.origin}/bomb", 1, policy_for(site, max_mb=5))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        deflate_got = await fetch_page(f"{site.origin}/deflate", 1, policy_for(site, max_mb=5))
    assert len(bomb) < MB
    assert got == deflate_got == Refused("refused: the page is over 5 MB")
    assert peak < 8 * MB, f"decoding held {peak / MB:.1f} MB at its peak"


@pytest.mark.parametrize(
    ("content_type", "message"),
    [
        ("image/png", "refused: image/png is not a page I can read"),
        ("application/octet-stream", "refused: application/octet-stream is not a page I can read"),
        ("application/javascript", "refused: application/javascript is not a page I can read"),
    ],
)
async def test_a_content_type_not_on_the_list_is_refused(content_type: str, message: str) -> None:
    async def image(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"\x89PNG\r\n\x1a\n" + b"\0" * 100, content_type=content_type)

    async with Site({"/x": image}) as site:
        assert await fetch_page(f"{site.origin}/x", 1, policy_for(site)) == Refused(message)


# Failures: one line each, never starting with "refused:"


async def test_http_errors_and_network_failures_are_one_line(bystander: Site) -> None:
    async def missing(request: web.Request) -> web.StreamResponse:
        return web.Response(status=404, text="not here")

    async def broken(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503, text="down")

    async with Site({"/missing": missing, "/broken": broken}) as site:
        policy = policy_for(site, bystander)
        not_found = await fetch_page(f"{site.origin}/missing", 1, policy)
        unavailable = await fetch_page(f"{site.origin}/broken", 1, policy)
    port = site.port
    closed = await fetch_page(f"http://127.0.0.1:{port}/", 1, policy)  # the server is gone now
    assert not_found == Failed(f"could not fetch {site.origin}/missing: HTTP 404")
    assert unavailable == Failed(f"could not fetch {site.origin}/broken: HTTP 503")
    assert isinstance(closed, Failed) and closed.message.startswith(f"could not fetch http://127.0.0.1:{port}/: ")
    assert "\n" not in closed.message and "Traceback" not in closed.message


async def test_a_server_that_never_answers_hits_the_time_cap() -> None:
    released = asyncio.Event()

    async def stall(request: web.Request) -> web.StreamResponse:
        await asyncio.wait_for(released.wait(), 30)  # set once the client has given up
        return web.Response(text="late")

    async with Site({"/stall": stall}) as site:
        got = await fetch_page(f"{site.origin}/stall", 1, policy_for(site, timeout_s=0.5))
        released.set()
    assert got == Failed(f"could not fetch {site.origin}/stall: no answer within 0.5 s")


# The setting and the checks on their own


def test_web_allow_private_entries_and_a_bad_one_in_one_line() -> None:
    settings = load_settings(WEB_ALLOW_PRIVATE="127.0.0.1:8080, 10.0.0.0/8,[::1]:443,::ffff:192.168.0.9")
    assert settings.web_allow_private == (
        (ipaddress.ip_network("127.0.0.1/32"), 8080),
        (ipaddress.ip_network("10.0.0.0/8"), None),
        (ipaddress.ip_network("::1/128"), 443),
        (ipaddress.ip_network("192.168.0.9/32"), None),
    )
    assert (load_settings().WEB_ALLOW_PRIVATE, load_settings().WEB_FETCH_MAX_MB) == ("", 5)
    for bad in ("intranet.local", "127.0.0.1:http", "10.0.0.0/40", "[::1]:0"):
        with pytest.raises(SettingsError) as caught:
            load_settings(WEB_ALLOW_PRIVATE=bad)
        assert str(caught.value).startswith("WEB_ALLOW_PRIVATE: ") and "\n" not in str(caught.value)
    with pytest.raises(SettingsError, match=r"^WEB_FETCH_MAX_MB: "):
        load_settings(WEB_FETCH_MAX_MB="0")


async def test_the_allow_list_matches_the_resolved_address_and_its_port() -> None:
    allow = parse_allow_private("10.1.2.3:8080,192.168.0.0/24")
    loopback = ipaddress.ip_address("10.1.2.3")
    assert refusal(loopback, 8080, allow) is None
    assert refusal(loopback, 8081, allow) == "a private address"
    assert refusal(ipaddress.ip_address("192.168.0.77"), 22, allow) is None
    assert refusal(ipaddress.ip_address("::ffff:192.168.0.77"), 22, allow) is None
    assert refusal(ipaddress.ip_address("93.184.216.34"), 80, ()) is None
    target = await check("https://example.test/a?b=1", allow, resolver({"example.test": ["10.1.2.3"]}))
    assert (
        isinstance(target, Refused)
        and target.message == "refused: example.test resolves to 10.1.2.3, a private address"
    )
