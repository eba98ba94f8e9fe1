"""The web chat page (issue 22; adapters/http/web_page.py, adapters/http/static): in a real browser (Playwright driving
the system's Chromium) sign in through a /web link, send a message and see the answer stream in with its steps,
reload and see the history, the tasks panel, a reminder arriving, the phone layout, sign out; over httpx the
sign-in cookie's attributes, the CSRF rule, a link that works once, a cross-site sign-in refused, ALLOWED_USERS.

A missing Chromium fails these tests (never a skip): install Debian's `chromium` (.ci/run does) or set CHROMIUM.
UPDATE_SCREENSHOT=1 also saves the page as docs/web-page.png (the README shows it)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import ConsoleMessage, Dialog, Locator, Page, Route, async_playwright, expect

from adapters.http import HttpApi, serve_api
from bot.web import WebServer
from core import Core, ReminderMessage
from core.storage.db import Pool
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import incoming
from tests.test_web import free_port

ANN, BOB = "8300", "8400"
TURN_MS = 15_000  # how long a check waits for an answer (a loaded machine; a pass waits only as long as it takes)
LINK = re.compile(r"<(https?://[^>\s]+/signin\?code=([A-Za-z0-9_-]+))>")
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "web-page.png"
FINAL = "Noted: **Buy milk** is on your list.\n\n- due *tomorrow*\n- ask me to `list` it any time"
TRAP = '<img src=x onerror="window.pwned=1"> [a trap](javascript:window.pwned=1) and [the docs](https://example.com/)'


@dataclass
class Site:
    """A running server with the API and the web page, reachable at `url` (= PUBLIC_BASE_URL)."""

    core: Core
    http: HttpApi
    url: str

    async def link(self, user: str = ANN) -> tuple[str, str]:
        """(url, code) of the link /web answers the user with in a private chat."""
        said = await self.core.command(incoming("/web", user=user, name="Ann"), "web", "", must_answer=True)
        found = LINK.search(said if isinstance(said, str) else "")
        assert found is not None, said
        return found.group(1), found.group(2)

    def client(self) -> httpx.AsyncClient:
        """An httpx client for the site (cookies are sent by hand: the jar would not send a Secure one over http)."""
        return httpx.AsyncClient(base_url=self.url, timeout=10, follow_redirects=False)


Serve = Callable[..., Awaitable[Site]]


@pytest.fixture
async def serve_page(make_core: MakeCore) -> AsyncIterator[Serve]:
    """Start a WebServer with the API and the web page (as bot/app.py does) for a Core (settings overrides by name)."""
    started: list[WebServer] = []

    async def start(core: Core | None = None, **overrides: Any) -> Site:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        core = core or make_core(PUBLIC_BASE_URL=url, **overrides)
        server = WebServer(core, (), port, host="127.0.0.1")
        http = serve_api(server.app, core)
        await server.start()
        started.append(server)
        return Site(core, http, url)

    yield start
    for server in started:
        await server.stop()


def chromium() -> str:
    """The system's Chromium (CHROMIUM, else `chromium` on PATH); a missing one fails the test."""
    path = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.fail(
            "No Chromium for the browser test: install Debian's chromium package (apt-get install chromium; "
            ".ci/run does) or set CHROMIUM to its path",
            pytrace=False,
        )
    return path


def cookies_of(response: httpx.Response) -> dict[str, str]:
    """The Set-Cookie headers of a response, by cookie name."""
    return {h.partition("=")[0]: h for h in response.headers.get_list("set-cookie")}


def secret_of(set_cookie: str) -> str:
    """The value of one Set-Cookie header."""
    return set_cookie.partition("=")[2].partition(";")[0]


async def signed_in(site: Site, user: str = ANN, **headers: str) -> httpx.Response:
    """POST a fresh /web link's code as the sign-in page's button does."""
    _, code = await site.link(user)
    async with site.client() as c:
        return await c.post("/signin", data={"code": code}, headers={"Sec-Fetch-Site": "same-origin", **headers})


async def test_the_page_in_a_browser(serve_page: Serve, fake_llm: FakeOpenAI, pool: Pool) -> None:
    site = await serve_page()
    link, _ = await site.link()
    release = asyncio.Event()

    async def slow(body: dict[str, Any]) -> Reply:
        await release.wait()
        return Reply(text=FINAL)

    fake_llm.script(
        Reply(text="Let me note that.", tool_calls=[("manage_tasks", {"action": "create", "title": "Buy milk"})]),
        slow,
    )
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        where = message.location.get("url", "")
        expected = (where.endswith("/v1/me") and "401" in message.text) or (
            where.endswith("/signin") and "400" in message.text
        )  # signed out, and the used link
        if message.type == "error" and not expected:  # a script error, a CSP violation, a missing file
            problems.append(f"{message.text} ({where})")

    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 800})
            page = await context.new_page()
            page.on("console", on_console)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("dialog", accept)

            # the link shows a button; only pressing it signs in
            opened = await page.goto(link)
            assert opened is not None and opened.headers["referrer-policy"] == "no-referrer"
            await page.get_by_role("button", name="Sign in").click()
            await expect(page.locator("#who")).to_have_text("Ann")
            assert page.url == f"{site.url}/"
            (cookie,) = await context.cookies()
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and not cookie["secure"]

            # a message: the step shows while the answer still runs, then the answer streams in
            await page.locator("#input").fill("add buy milk")
            await page.locator("#input").press("Enter")
            running = page.locator("article.message.assistant.running")
            await expect(running.locator("details.steps summary")).to_have_text(re.compile(r"^1 step"), timeout=TURN_MS)
            await expect(running).to_contain_text("Let me note that.")
            release.set()
            answer = page.locator("article.message.assistant.done")
            await expect(answer).to_contain_text("is on your list.", timeout=TURN_MS)
            await expect(answer.locator("strong")).to_have_text("Buy milk")
            await expect(answer.locator("li em")).to_have_text("tomorrow")
            await expect(answer.locator("li code")).to_have_text("list")
            steps = answer.locator("details.steps")
            await expect(steps.locator("li")).not_to_be_visible()
            await steps.locator("summary").click()
            await expect(steps.locator("li.ok")).to_have_text(re.compile(r"^manage_tasks create → ok: created #1"))
            await expect(page.locator("#tasks")).to_contain_text("Buy milk")
            await expect(page.locator("#sessions li.current")).to_have_text("add buy milk")
            shot = await page.screenshot(path=str(SCREENSHOT) if os.environ.get("UPDATE_SCREENSHOT") else None)
            assert shot.startswith(b"\x89PNG")

            # untrusted text stays text: no element, no javascript: link
            fake_llm.script(Reply(text=TRAP))
            await page.locator("#input").fill("and a trap?")
            await page.locator("#send").click()
            trap = page.locator("article.message.assistant.done").nth(1)
            await expect(trap).to_contain_text(
                '<img src=x onerror="window.pwned=1"> [a trap](javascript:', timeout=TURN_MS
            )
            await expect(trap.locator('a[href="https://example.com/"]')).to_have_text("the docs")
            assert await trap.locator("a").count() == 1
            assert await page.locator("#message-list img").count() == 0
            assert await page.evaluate("window.pwned === undefined")

            # reload: the history is back, in the same session
            session_id = page.url.partition("#")[2]
            assert session_id.startswith("ses_")
            await page.reload()
            await expect(page.locator("article.message.user")).to_have_text(["add buy milk", "and a trap?"])
            await expect(page.locator("article.message.assistant").first).to_contain_text("is on your list.")

            # a reminder delivered into the session shows when the page is looked at again
            task_id = await pool.fetchval("SELECT id FROM tasks WHERE title = 'Buy milk'")
            msg = ReminderMessage(task_id, site.core.now(), "api", session_id, "", "private", ANN, "Ann", "⏰ Buy milk")
            assert await site.http.api.send_reminder(msg)
            await page.evaluate("window.dispatchEvent(new Event('focus'))")
            await expect(page.locator("article.message.reminder")).to_contain_text("⏰ Buy milk")

            # /reset and /memory wipe as buttons (confirmed)
            await page.locator("#reset").click()
            await expect(page.locator("#notice")).not_to_be_empty()
            await page.locator("#wipe-memory").click()
            await expect(page.locator("#notice")).to_contain_text("emory")

            # a phone's screen: one column, the panel behind a button
            await page.set_viewport_size({"width": 390, "height": 800})
            await expect(page.locator("#panel")).not_to_be_visible()
            await expect(page.locator("#sessions-pane")).not_to_be_visible()
            await page.locator("#toggle-panel").click()
            await expect(page.locator("#tasks")).to_be_visible()
            await page.set_viewport_size({"width": 1280, "height": 800})

            # sign out: the signed-out view, also after a reload; the link does not work again
            await page.locator("#sign-out").click()
            await expect(page.locator("#signed-out")).to_be_visible()
            assert await context.cookies() == []
            await page.reload()
            await expect(page.locator("#signed-out")).to_contain_text("/web")
            await page.goto(link)
            await page.get_by_role("button", name="Sign in").click()
            await expect(page.locator("p.error")).to_have_text("This sign-in link is wrong, used or expired.")
            await expect(page.locator("body")).to_contain_text("Send /web to the bot")
        finally:
            await browser.close()
    assert problems == [], problems


async def test_signin_sets_a_strict_httponly_cookie_and_changes_need_the_csrf_token(serve_page: Serve) -> None:
    site = await serve_page()
    url, code = await site.link()
    async with site.client() as c:
        # opening the link spends nothing (a link previewer does just that), and leaks nothing in a Referer
        shown = await c.get(url.removeprefix(site.url))
        assert shown.status_code == 200 and f'value="{code}"' in shown.text
        assert shown.headers["referrer-policy"] == "no-referrer"
        assert "default-src 'self'" in shown.headers["content-security-policy"]
        again = await c.get(url.removeprefix(site.url))
        assert again.status_code == 200
        signin = await c.post("/signin", data={"code": code}, headers={"Sec-Fetch-Site": "same-origin"})
        assert signin.status_code == 303 and signin.headers["location"] == "./"
        set_cookie = cookies_of(signin)["bot_signin"]
        attributes = {a.strip().lower() for a in set_cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/", f"max-age={30 * 24 * 3600}"} <= attributes
        assert "secure" not in attributes, "plain http: no Secure (the browser would drop the cookie)"
        cookie = {"Cookie": f"bot_signin={secret_of(set_cookie)}"}

        # the link works once
        used = await c.post("/signin", data={"code": code}, headers={"Sec-Fetch-Site": "same-origin"})
        assert used.status_code == 400 and "wrong, used or expired" in used.text and "/web" in used.text
        assert "set-cookie" not in used.headers

        # the cookie acts as Ann; GET /v1/me gives the page its CSRF token
        me = (await c.get("/v1/me", headers=cookie)).json()
        assert me["identity"] == f"telegram:{ANN}" and me["display_name"] == "Ann" and me["csrf"]
        csrf = {"X-CSRF-Token": me["csrf"]}
        refused = await c.post("/v1/sessions", json={}, headers=cookie)
        assert refused.status_code == 403
        assert refused.json()["error"]["type"] == "forbidden" and "X-CSRF-Token" in refused.json()["error"]["message"]
        wrong = await c.post("/v1/sessions", json={}, headers={**cookie, "X-CSRF-Token": me["csrf"][::-1]})
        assert wrong.status_code == 403
        made = await c.post("/v1/sessions", json={"title": "web"}, headers={**cookie, **csrf})
        assert made.status_code == 201
        assert (await c.delete(f"/v1/sessions/{made.json()['id']}", headers=cookie)).status_code == 403
        assert (await c.get("/v1/sessions", headers=cookie)).json()["sessions"][0]["title"] == "web"
        # a bearer token never needs it, and its /v1/me has no CSRF token
        token = await site.core.new_api_token(incoming("/token", user=ANN), "laptop")
        assert isinstance(token, str)
        bearer = {"Authorization": f"Bearer {token}"}
        assert (await c.post("/v1/sessions", json={}, headers=bearer)).status_code == 201
        assert (await c.get("/v1/me", headers=bearer)).json()["csrf"] is None

        # sign out: CSRF-checked too; then the cookie is cleared and no longer works
        assert (await c.post("/signout", headers=cookie)).status_code == 403
        out = await c.post("/signout", headers={**cookie, **csrf})
        assert out.status_code == 204
        assert "max-age=0" in cookies_of(out)["bot_signin"].lower()
        after = await c.get("/v1/sessions", headers=cookie)
        assert after.status_code == 401 and "/web" in after.json()["error"]["message"]


async def test_the_page_is_served_with_its_policy(serve_page: Serve) -> None:
    site = await serve_page()
    async with site.client() as c:
        index = await c.get("/")
        assert index.status_code == 200 and '<script type="module" src="static/app.js">' in index.text
        policy = index.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        for name, kind in (("app.js", "javascript"), ("markdown.js", "javascript"), ("app.css", "text/css")):
            served = await c.get(f"/static/{name}")
            assert served.status_code == 200 and kind in served.headers["content-type"], name
        assert (await c.get("/static/nothing.js")).json()["error"]["type"] == "not_found"
        assert (await c.get("/v1/me")).status_code == 401
        # a code is shown escaped (it is only ever text)
        hostile = await c.get("/signin", params={"code": '"><script>alert(1)</script>'})
        assert "<script>" not in hostile.text and "&lt;script&gt;" in hostile.text


async def test_secure_cookie_over_https(serve_page: Serve, make_core: MakeCore) -> None:
    site = await serve_page()
    signin = await signed_in(site, **{"X-Forwarded-Proto": "https"})
    set_cookie = cookies_of(signin)["__Host-bot_signin"]
    assert "secure" in set_cookie.lower() and "path=/" in set_cookie.lower()
    secret = secret_of(set_cookie)
    async with site.client() as c:
        # over https only the prefixed cookie counts (a sibling subdomain cannot plant that one)
        https = {"X-Forwarded-Proto": "https"}
        assert (await c.get("/v1/me", headers={**https, "Cookie": f"__Host-bot_signin={secret}"})).status_code == 200
        assert (await c.get("/v1/me", headers={**https, "Cookie": f"bot_signin={secret}"})).status_code == 401
    # an https public address makes the cookie Secure whatever the request says
    core = make_core(PUBLIC_BASE_URL="https://bot.example.com")
    behind_proxy = await serve_page(core)
    assert "__Host-bot_signin" in cookies_of(await signed_in(behind_proxy))


async def test_a_signin_post_from_another_site_is_refused(serve_page: Serve) -> None:
    site = await serve_page()
    _, code = await site.link()
    async with site.client() as c:
        for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
            refused = await c.post("/signin", data={"code": code}, headers=headers)
            assert refused.status_code == 403 and "set-cookie" not in refused.headers
            assert "did not come from the bot" in refused.text and "Open the link /web gave you again" in refused.text
        # the code was not spent: the page's own POST (Origin: null, as a no-referrer page sends) still works
        ok = await c.post("/signin", data={"code": code}, headers={"Sec-Fetch-Site": "same-origin", "Origin": "null"})
        assert ok.status_code == 303


async def test_a_signin_no_longer_allowed_is_refused(serve_page: Serve, make_core: MakeCore) -> None:
    everyone = make_core(ALLOWED_USERS="*", PUBLIC_BASE_URL="http://127.0.0.1")
    _, code = await Site(everyone, HttpApi(everyone), "").link(BOB)
    site = await serve_page(make_core(ALLOWED_USERS=f"telegram:{ANN}", PUBLIC_BASE_URL="http://127.0.0.1"))
    async with site.client() as c:
        signin = await c.post("/signin", data={"code": code}, headers={"Sec-Fetch-Site": "same-origin"})
        secret = secret_of(cookies_of(signin)["bot_signin"])
        refused = await c.get("/v1/me", headers={"Cookie": f"bot_signin={secret}"})
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden"


async def test_the_rate_is_counted_per_signin(serve_page: Serve) -> None:
    site = await serve_page(API_REQUESTS_PER_MINUTE=2)
    phone = secret_of(cookies_of(await signed_in(site))["bot_signin"])
    laptop = secret_of(cookies_of(await signed_in(site))["bot_signin"])
    async with site.client() as c:
        statuses = [(await c.get("/v1/me", headers={"Cookie": f"bot_signin={phone}"})).status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        assert (await c.get("/v1/me", headers={"Cookie": f"bot_signin={laptop}"})).status_code == 200


@asynccontextmanager
async def in_a_browser(width: int = 1280, height: int = 800) -> AsyncIterator[tuple[Page, list[str]]]:
    """A page of the system's Chromium at this viewport, and the script errors it logs (none expected)."""
    problems: list[str] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            context = await browser.new_context(viewport={"width": width, "height": height})
            page = await context.new_page()
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" and "401" not in m.text else None)
            yield page, problems
        finally:
            await browser.close()


async def said(page: Page, text: str) -> Locator:
    """Type `text` in the message box and send it; the answer's article, once it is done."""
    answers = page.locator("article.message.assistant.done")
    before = await answers.count()
    await page.locator("#input").fill(text)
    await page.locator("#input").press("Enter")
    await expect(answers).to_have_count(before + 1, timeout=TURN_MS)
    return answers.nth(before)


async def test_commands_and_buttons_work_on_the_page_without_reloading(
    serve_page: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    from tests.test_memory_command import remember

    site = await serve_page()
    await remember(site.core, incoming("/memory", user=ANN), ["Name: Ann", "Likes: tea"])
    link, _ = await site.link()
    async with in_a_browser() as (page, problems):
        await page.goto(link)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#memory")).to_contain_text("Name: Ann", timeout=TURN_MS)
        await page.evaluate("window.stayed = true")  # gone if anything reloads the page

        # a command typed on the page is the command, and its answer stays when the page looks again
        made = await said(page, "/remind in 10 minutes Tea")
        await expect(made).to_contain_text("⏰ #1 Tea", timeout=TURN_MS)
        await expect(page.locator("#tasks")).to_contain_text("Tea", timeout=TURN_MS)
        await expect(await said(page, "/tasks")).to_contain_text("#1 Tea", timeout=TURN_MS)
        # what the memory panel tells the person to type works typed
        await expect(await said(page, "/memory forget human 1")).to_contain_text(
            "Forgot line 1 of [human]", timeout=TURN_MS
        )
        await expect(page.locator("#memory")).not_to_contain_text("Name: Ann", timeout=TURN_MS)
        await expect(page.locator("#memory")).to_contain_text("Likes: tea", timeout=TURN_MS)

        # Undo under /remind's answer
        await made.get_by_role("button", name="↩️ Undo").click()
        await expect(made).to_contain_text("↩️ Undone: #1 Tea", timeout=TURN_MS)
        await expect(made.locator("button")).to_have_count(0, timeout=TURN_MS)
        await expect(page.locator("#tasks")).to_contain_text("no open tasks", timeout=TURN_MS)
        await page.evaluate("document.querySelectorAll('article').forEach((a) => { a.dataset.before = '1'; })")
        await page.evaluate("window.dispatchEvent(new Event('focus'))")  # the page reads the session again
        await expect(page.locator("article[data-before]")).to_have_count(0, timeout=TURN_MS)  # drawn anew
        await expect(page.locator("article.message.assistant")).to_have_count(3, timeout=TURN_MS)
        await expect(made).to_contain_text("↩️ Undone: #1 Tea", timeout=TURN_MS)

        # a reminder delivered into the session has Done and Snooze
        await said(page, "/remind in 1 hour Stretch")
        task_id = await pool.fetchval("SELECT id FROM tasks WHERE title = 'Stretch'")
        session_id = page.url.partition("#")[2]
        msg = ReminderMessage(task_id, site.core.now(), "api", session_id, "", "private", ANN, "Ann", "⏰ Stretch")
        assert await site.http.api.send_reminder(msg)
        await page.evaluate("window.dispatchEvent(new Event('focus'))")
        reminder = page.locator("article.message.reminder")
        await expect(reminder.locator("button")).to_have_text(["✅ Done", "😴 10 min", "😴 1 h"], timeout=TURN_MS)
        await reminder.get_by_role("button", name="😴 10 min").click()
        await expect(reminder).to_contain_text("😴 Snoozed: Stretch — until 10:10", timeout=TURN_MS)
        await expect(reminder.locator("button")).to_have_count(0, timeout=TURN_MS)
        assert await page.evaluate("window.stayed === true"), "no reload"
        assert await pool.fetchval("SELECT due_at FROM tasks WHERE id = $1", task_id) > site.core.now()

        # after a reload the reminder still says what was done, and has no buttons
        await page.reload()
        await expect(reminder).to_contain_text("😴 Snoozed: Stretch — until 10:10", timeout=TURN_MS)
        await expect(reminder.locator("button")).to_have_count(0, timeout=TURN_MS)
    assert problems == [], problems
    assert fake_llm.requests == [], "no command went to the model"


async def test_a_confirmation_and_a_choice_are_pressed_on_the_page(
    serve_page: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    from core import WIPE_LABEL
    from tests.test_memory_command import remember

    site = await serve_page(LLM_MODELS="fake-model, fake-big")
    await remember(site.core, incoming("/memory", user=ANN), ["Name: Ann"], ["old note"])
    link, _ = await site.link()
    async with in_a_browser() as (page, problems):
        await page.goto(link)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#memory")).to_contain_text("Name: Ann", timeout=TURN_MS)
        await page.evaluate("window.stayed = true")  # gone if anything reloads the page

        # /memory wipe asks; its button wipes
        asked = await said(page, "/memory wipe")
        await expect(asked).to_contain_text("It cannot be undone.", timeout=TURN_MS)
        await expect(asked.locator("button")).to_have_text([WIPE_LABEL])
        await expect(asked.locator("button.danger")).to_have_count(1)
        await asked.get_by_role("button", name=WIPE_LABEL).click()
        await expect(asked).to_contain_text("Done — I erased 1 line and 1 archival entry", timeout=TURN_MS)
        await expect(asked.locator("button")).to_have_count(0, timeout=TURN_MS)
        await expect(page.locator("#memory")).not_to_contain_text("Name: Ann", timeout=TURN_MS)

        # /model offers the models; a press switches
        shown = await said(page, "/model")
        await expect(shown.locator("button")).to_have_text(["fake-model", "fake-big"], timeout=TURN_MS)
        await shown.get_by_role("button", name="fake-big").click()
        await expect(shown).to_contain_text("fake-big answers you from now on", timeout=TURN_MS)
        await expect(shown.locator("button")).to_have_count(0, timeout=TURN_MS)
        assert await page.evaluate("window.stayed === true"), "no reload"
    assert problems == [], problems
    assert fake_llm.requests == [], "no command went to the model"
    assert await pool.fetchval("SELECT count(*) FROM archival_memory") == 0
    assert await pool.fetchval("SELECT model FROM accounts") == "fake-big"


async def test_a_running_answer_keeps_its_steps_whatever_the_page_reads_again(
    serve_page: Serve, fake_llm: FakeOpenAI
) -> None:
    """Each read of the page overlapping an answer's stream, made to: the page's own first reads ending after the first
    message was sent (they opened no chat over it), and a read of the session answered with a snapshot taken while the
    answer had no step yet (it undid nothing). The answer stays running with its step until it is released."""
    site = await serve_page()
    link, _ = await site.link()
    asked = [asyncio.Event(), asyncio.Event()]  # the model was asked the first time in answer 1, in answer 2
    go = [asyncio.Event(), asyncio.Event()]  # ... and answers with a step
    release = [asyncio.Event(), asyncio.Event()]  # ... and then with the final text

    def held(n: int, title: str) -> Callable[[dict[str, Any]], Awaitable[Reply]]:
        async def answer(body: dict[str, Any]) -> Reply:
            asked[n].set()
            await go[n].wait()
            return Reply(text="Let me note that.", tool_calls=[("manage_tasks", {"action": "create", "title": title})])

        return answer

    def final(n: int) -> Callable[[dict[str, Any]], Awaitable[Reply]]:
        async def answer(body: dict[str, Any]) -> Reply:
            await release[n].wait()
            return Reply(text="Noted.")

        return answer

    fake_llm.script(held(0, "Buy milk"), final(0), held(1, "Buy bread"), final(1))
    wait_s = TURN_MS / 1000
    step = re.compile(r"^1 step")
    async with in_a_browser() as (page, problems):
        running = page.locator("article.message.assistant.running")
        posted = asyncio.Event()
        page.on("request", lambda r: posted.set() if r.method == "POST" and r.url.endswith("/messages") else None)

        async def panel_late(route: Route) -> None:
            await asyncio.wait_for(posted.wait(), wait_s)
            await route.continue_()

        # the page's first reads end after the first message went out (a loaded machine's order)
        await page.route("**/v1/tasks", panel_late)
        await page.goto(link)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#who")).to_have_text("Ann", timeout=TURN_MS)
        await page.locator("#input").fill("add buy milk")
        await page.locator("#input").press("Enter")
        await asyncio.wait_for(asked[0].wait(), wait_s)
        await expect(page.locator("#tasks")).to_contain_text("no open tasks", timeout=TURN_MS)  # the first reads ended
        await page.unroute("**/v1/tasks")
        go[0].set()
        await expect(running.locator("details.steps summary")).to_have_text(step, timeout=TURN_MS)
        release[0].set()
        await expect(page.locator("article.message.assistant.done")).to_contain_text("Noted.", timeout=TURN_MS)
        await expect(page.locator("#sessions li.current")).to_have_text("add buy milk", timeout=TURN_MS)

        # a read of the session starts, a message is sent, the read answers with the session as stored meanwhile
        turn_stored, snapshot, deliver = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def stale(route: Route) -> None:
            if route.request.method != "GET":
                await route.fallback()
                return
            await asyncio.wait_for(turn_stored.wait(), wait_s)
            response = await route.fetch()  # the answer running, no step yet
            snapshot.set()
            await asyncio.wait_for(deliver.wait(), wait_s)
            await route.fulfill(response=response)

        await page.route("**/v1/sessions/*/messages", stale)
        async with page.expect_request(lambda r: r.method == "GET" and r.url.endswith("/messages")):
            await page.evaluate("window.dispatchEvent(new Event('focus'))")
        await page.locator("#input").fill("add buy bread")
        await page.locator("#input").press("Enter")
        await asyncio.wait_for(asked[1].wait(), wait_s)  # the turn is stored as running
        turn_stored.set()
        await asyncio.wait_for(snapshot.wait(), wait_s)
        go[1].set()
        await expect(running.locator("details.steps summary")).to_have_text(step, timeout=TURN_MS)
        await page.evaluate("document.querySelectorAll('article').forEach((a) => { a.dataset.before = '1'; })")
        deliver.set()
        await expect(page.locator("article[data-before]")).to_have_count(0, timeout=TURN_MS)  # drawn from the read
        await expect(running.locator("details.steps summary")).to_have_text(step)
        await expect(running).to_contain_text("Let me note that.")
        release[1].set()
        await expect(page.locator("article.message.assistant.done")).to_have_count(2, timeout=TURN_MS)
        await expect(
            page.locator("article.message.assistant.done").nth(1).locator("details.steps summary")
        ).to_have_text(step)
    assert problems == [], problems


async def test_the_signin_card_keeps_a_margin_on_a_phone(serve_page: Serve) -> None:
    site = await serve_page()
    link, _ = await site.link()
    async with in_a_browser(390, 844) as (page, problems):
        for url, card in ((link, "main.card"), (f"{site.url}/", "#signed-out")):
            await page.goto(url)
            await expect(page.locator(card)).to_be_visible()
            box = await page.locator(card).bounding_box()
            assert box is not None
            assert box["x"] >= 12 and box["x"] + box["width"] <= 390 - 12, (url, box)
    assert problems == [], problems
