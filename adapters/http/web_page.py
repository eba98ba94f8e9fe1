"""The web chat page: `GET /` serves the static page (adapters/http/static: no build step, no CDN), which talks to the
sessions API with the sign-in cookie; `/signin` turns a /web link into that cookie, `/signout` ends it.

Opening a link only shows a page with a button: the code is spent by the POST the button sends, so a link previewer
(a chat app fetching the URL to draw a preview) cannot use it up. Neither page leaks the code in a Referer. The POST
must come from the page itself (Sec-Fetch-Site, Origin), so another site cannot sign a visitor in to its own account."""

from __future__ import annotations

import html
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from adapters.http.errors import error_response
from adapters.http.limits import SIGNIN_FORM_BYTES
from adapters.http.routes import NO_CSRF, HttpApi
from adapters.http.signin_cookie import CSRF_HEADER, clear_signin_cookie, set_signin_cookie, signin_secret
from core import SIGNIN_PATH

STATIC = Path(__file__).parent / "static"
STATIC_PATH = "/static"
# Every page: scripts, styles and requests from this origin only; no framing; no Referer (a sign-in URL holds a code).
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; base-uri 'none'; object-src 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
ASK_AGAIN = "Send /web to the bot in a private chat for a new link."
CONFIRM = "This link signs this browser in to the web chat as you."
BAD_LINK = "This sign-in link is wrong, used or expired."
NOT_FROM_HERE = "This sign-in did not come from the bot's own page."
OPEN_AGAIN = "Open the link /web gave you again, in this browser."

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>Sign in · web chat</title>
<link rel="stylesheet" href="static/app.css">
<link rel="icon" href="static/favicon.svg" type="image/svg+xml">
</head>
<body class="card-page">
<main class="card">
<h1>Sign in to the web chat</h1>
{body}
</main>
</body>
</html>
"""
_FORM = """<p>{confirm}</p>
<form method="post" action="{action}">
<input type="hidden" name="code" value="{code}">
<button type="submit" class="primary">Sign in</button>
</form>
"""
_FAILED = """<p class="error">{line}</p>
<p>{hint}</p>
"""


def page(body: str, status: int = 200) -> HTMLResponse:
    """A small page of the sign-in flow."""
    return HTMLResponse(_PAGE.format(body=body), status, headers=PAGE_HEADERS)


def failed(line: str, status: int, hint: str = ASK_AGAIN) -> HTMLResponse:
    """The page of a sign-in that did not work: one line, and what to do."""
    return page(_FAILED.format(line=html.escape(line), hint=html.escape(hint)), status)


def from_elsewhere(request: Request) -> bool:
    """Whether a POST was sent by another site's page (a sign-in page's own POST carries `Origin: null`: it sends no
    Referer, and browsers then hide the origin of a form's POST; Sec-Fetch-Site still says same-origin)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin", "null")
    return origin != "null" and urlsplit(origin).netloc != request.headers.get("host", "")


async def form_code(request: Request) -> str:
    """The code a sign-in form sent ('' when there is none, or the body is too large for one)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > SIGNIN_FORM_BYTES:
            return ""
    values = parse_qs(body.decode("utf-8", "replace")).get("code", [""])
    return values[0].strip()


def add_web_page(app: FastAPI, http: HttpApi) -> None:
    """Serve the web chat page on `app`: GET /, the static files, GET and POST /signin, POST /signout."""

    def base() -> str | None:
        """The bot's public address (its scheme decides the cookie's Secure)."""
        return http.core.settings.public_base_url

    async def index(request: Request) -> Response:
        """The chat page (it asks GET /v1/me whether the browser is signed in)."""
        return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)

    async def signin_page(request: Request) -> Response:
        """A /web link: a button that signs in (the GET itself spends nothing)."""
        code = request.query_params.get("code", "").strip()
        if not code:
            return failed(BAD_LINK, 400)
        action = SIGNIN_PATH.lstrip("/")  # relative: the public address may have a proxy's path prefix
        return page(_FORM.format(confirm=html.escape(CONFIRM), action=action, code=html.escape(code, quote=True)))

    async def signin(request: Request) -> Response:
        """Spend the link's code: the sign-in cookie, then the chat page (303)."""
        if from_elsewhere(request):
            return failed(NOT_FROM_HERE, 403, OPEN_AGAIN)
        login = await http.api.redeem_link(await form_code(request))
        if login is None:
            return failed(BAD_LINK, 400)
        response = RedirectResponse("./", status_code=303, headers={"Cache-Control": "no-store"})
        max_age = int((login.expires_at - http.core.now()).total_seconds())
        set_signin_cookie(response, request, base(), login.secret, max_age)
        return response

    async def signout(request: Request) -> Response:
        """End the browser's sign-in and clear its cookie (403 without the sign-in's CSRF token)."""
        secret = signin_secret(request, base())
        if secret is not None and (found := await http.api.web_caller(secret)) is not None:
            if not http.api.csrf_matches(found[1], request.headers.get(CSRF_HEADER)):
                return error_response(403, "forbidden", NO_CSRF)
            await http.api.sign_out(secret)
        response = Response(status_code=204, headers={"Cache-Control": "no-store"})
        clear_signin_cookie(response, request, base())
        return response

    app.add_route("/", index, methods=["GET"], include_in_schema=False)
    app.add_route(SIGNIN_PATH, signin_page, methods=["GET"], include_in_schema=False)
    app.add_route(SIGNIN_PATH, signin, methods=["POST"], include_in_schema=False)
    app.add_route("/signout", signout, methods=["POST"], include_in_schema=False)
    app.mount(STATIC_PATH, StaticFiles(directory=STATIC), name="static")
