"""GET /openapi.json (issue 22): a valid OpenAPI 3.1 document generated from the request/response models, versioned
with the bot, listing every /v1 route, with message parts as a discriminated union."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi.routing import APIRoute
from openapi_spec_validator import validate

from core import app_version
from tests import test_http_api
from tests.test_http_api import Serve

serve = test_http_api.serve  # the fixture: a server with the /v1 routes


async def test_openapi_is_valid_versioned_and_lists_every_route(serve: Serve) -> None:
    s = await serve()
    async with httpx.AsyncClient(base_url=s.url) as c:
        r = await c.get("/openapi.json")
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    validate(doc)  # raises on an invalid document
    assert doc["openapi"].startswith("3.1")
    assert doc["info"]["version"] == app_version() and doc["info"]["title"] == "Assistant bot"
    served = {
        (route.path, method)
        for route in s.http.router().routes  # the same routes as served (a fresh copy of the /v1 router)
        if isinstance(route, APIRoute)
        for method in route.methods or ()
    }
    described = {(path, method.upper()) for path, ops in doc["paths"].items() for method in ops}
    assert served and served <= described, served - described
    for path in ("/v1/sessions", "/v1/sessions/{session_id}/messages", "/v1/one-shot", "/v1/chat/completions"):
        assert path in doc["paths"]
    assert not any(p in doc["paths"] for p in ("/healthz", "/readyz", "/metrics")), "not part of the API"
    parts = doc["components"]["schemas"]["MessageOut"]["properties"]["parts"]["items"]
    assert parts["discriminator"]["propertyName"] == "type"
    assert {m["$ref"].rsplit("/", 1)[1] for m in parts["oneOf"]} == {
        "TextPartOut",
        "ToolCallPartOut",
        "ToolResultPartOut",
        "ErrorPartOut",
    }
    error = doc["paths"]["/v1/sessions/{session_id}"]["get"]["responses"]["404"]
    assert error["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")


async def test_what_the_description_says_the_server_does(serve: Serve) -> None:
    """Bearer auth described; no 422 anywhere; a 405's Allow names every method of the path; GET /v1/models/{id}."""
    s = await serve(LLM_MODELS="fake-model,other-model")
    secret = await test_http_api.token_of(s.core, test_http_api.ANN)
    auth = {"Authorization": f"Bearer {secret}"}
    async with httpx.AsyncClient(base_url=s.url, headers=auth) as c:
        doc: dict[str, Any] = (await c.get("/openapi.json")).json()
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert doc["security"] == [{"bearer": []}]
        assert not any("422" in op["responses"] for ops in doc["paths"].values() for op in ops.values())
        for path, ops in doc["paths"].items():
            if "{" in path:
                continue
            r = await c.request("PATCH", path)
            assert r.status_code == 405, path
            assert set(r.headers["Allow"].replace(" ", "").split(",")) == {m.upper() for m in ops}, path
        r = await c.request("PUT", "/v1/sessions/whatever")
        assert set(r.headers["Allow"].replace(" ", "").split(",")) == {"GET", "DELETE"}
        model = await c.get("/v1/models/other-model")
        assert model.status_code == 200 and model.json()["id"] == "other-model"
        assert (await c.get("/v1/models/gpt-secret")).status_code == 404
    chat = doc["components"]["schemas"]["ChatRequest"]["properties"]["model"]
    assert chat["enum"] == ["fake-model", "other-model"]
    assert "text/event-stream" in doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
