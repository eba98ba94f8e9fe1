"""The HTTP front end: the sessions API under /v1 (with Server-Sent Events), the OpenAI-compatible endpoint and the
web page, served on the process's one HTTP server (bot/web.py)."""

from fastapi import FastAPI

from adapters.http.errors import install_errors
from adapters.http.gate import CallerFirst
from adapters.http.routes import HttpApi
from adapters.http.schema import describe
from adapters.http.web_page import add_web_page
from core import Core, app_version

API_TITLE = "Assistant bot"


def serve_api(app: FastAPI, core: Core) -> HttpApi:
    """Everything the HTTP front end serves, on `app`: the /v1 API (its errors in the API's one shape), the web page
    and its sign-in; /openapi.json describes the API with the bot's version."""
    http = HttpApi(core)
    app.title, app.version = API_TITLE, app_version()
    install_errors(app)
    app.include_router(http.router())
    describe(app, http.api.models())  # /openapi.json as the server behaves (adapters/http/schema.py)
    app.add_middleware(CallerFirst, http=http)  # the caller before the body (adapters/http/gate.py)
    add_web_page(app, http)
    return http


__all__ = ["HttpApi", "install_errors", "serve_api"]
