"""The web page's sign-in cookie: its name and attributes, and whether a request reached the bot over https.

The cookie is HttpOnly (no script reads it), SameSite=Strict (a browser never sends it with a request another site
starts, not even a link followed from another site: the page itself is static, and every request that needs the
cookie is the page's own), Path=/ and Secure with the `__Host-` name prefix over https (a sibling subdomain can then
neither set nor overwrite it). "Over https" is true when the public address (PUBLIC_BASE_URL, or the webhook's
origin) is https, when the connection itself is, or when X-Forwarded-Proto says https: each of them can only add
Secure, never take it away, so a forged header at worst makes a client's own cookie unusable over plain http."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "bot_signin"
SECURE_COOKIE = "__Host-bot_signin"  # over https: Secure, Path=/, no Domain (what the prefix requires)
CSRF_HEADER = "X-CSRF-Token"  # every change a signed-in page makes carries the sign-in's CSRF token here
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def over_https(request: Request, base_url: str | None) -> bool:
    """Whether the request reached the bot over https (see the module's docstring)."""
    forwarded = request.headers.get("x-forwarded-proto", "").partition(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https" or (base_url or "").startswith("https:")


def cookie_name(secure: bool) -> str:
    """The cookie's name over https (prefixed) or plain http."""
    return SECURE_COOKIE if secure else COOKIE


def signin_secret(request: Request, base_url: str | None) -> str | None:
    """The sign-in secret the request's cookie carries (over https only the prefixed cookie counts)."""
    return request.cookies.get(cookie_name(over_https(request, base_url))) or None


def set_signin_cookie(response: Response, request: Request, base_url: str | None, secret: str, max_age: int) -> None:
    """Give the browser its sign-in."""
    secure = over_https(request, base_url)
    response.set_cookie(
        cookie_name(secure), secret, max_age=max_age, path="/", secure=secure, httponly=True, samesite="strict"
    )


def clear_signin_cookie(response: Response, request: Request, base_url: str | None) -> None:
    """Take the sign-in out of the browser."""
    secure = over_https(request, base_url)
    response.delete_cookie(cookie_name(secure), path="/", secure=secure, httponly=True, samesite="strict")
