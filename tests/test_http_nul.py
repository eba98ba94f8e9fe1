"""NUL characters from HTTP clients (issue 31, point 3): PostgreSQL stores no U+0000, so an id holding one is a 404
like any unknown id, a title, prompt, message or file name holding one is answered without it, and a text file with a
stray one is read like any other; never a text/plain 500, never an ERROR in the log (the fixtures fail on one)."""

from __future__ import annotations

import base64
import json

from core.storage.db import Pool
from tests import test_http_api
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_http_api import ANN, Serve, token_of

serve = test_http_api.serve  # the fixture: a server with the /v1 routes

NOT_FOUND = {"error": {"type": "not_found", "message": "No such session."}}


async def test_an_id_with_nul_is_a_404_in_the_error_shape(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.default = Reply(text="ok")
    async with s.client("abt_" + "q" * 43) as made_up:
        r = await made_up.get("/v1/sessions/ses_%00x")
        assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        for method, path, body in (
            ("GET", f"/v1/sessions/{sid}%00", None),
            ("GET", f"/v1/sessions/{sid}%00/messages", None),
            ("POST", f"/v1/sessions/{sid}%00/messages", {"content": "hi"}),
            ("DELETE", f"/v1/sessions/{sid}%00", None),
            ("GET", f"/v1/sessions/{sid}%00/stream", None),
            ("POST", f"/v1/sessions/{sid}%00/reset", None),
        ):
            r = await c.request(method, path, json=body)
            assert r.status_code == 404 and r.json() == NOT_FOUND, (method, path, r.text)
        r = await c.get(f"/v1/sessions/{sid}/messages", params={"before": "1\x00"})
        assert r.status_code == 200
        r = await c.get(f"/v1/artifacts/{sid}.msg_%00.0")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
        r = await c.post(
            "/v1/chat/completions", json={"model": "fake\x00", "messages": [{"role": "user", "content": "x"}]}
        )
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request"
        assert (await c.get(f"/v1/sessions/{sid}")).status_code == 200, "the session itself is untouched"


async def test_nul_in_titles_prompts_and_messages_is_dropped_and_answered(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    s = await serve()
    fake_llm.default = Reply(text="Answered.")
    async with s.client(await token_of(s.core, ANN)) as c:
        made = await c.post("/v1/sessions", json={"title": "Plans\x00 for May"})
        assert made.status_code == 201 and made.json()["title"] == "Plans for May"
        sid = made.json()["id"]
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"content": "buy\x00 milk"})
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        assert r.json()["parts"] == [{"type": "text", "text": "Answered."}]
        assert fake_llm.requests[-1]["messages"][-1] == {"role": "user", "content": "buy milk"}
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"content": [{"type": "text", "text": "a\x00b"}]})
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        one = await c.post("/v1/one-shot", json={"prompt": "what\x00 now?"})
        assert one.status_code == 200 and one.json()["status"] == "done", one.text
        listed = (await c.get("/v1/sessions")).json()["sessions"]
        assert listed[0]["title"] == "what now?"
        said = [{"role": "user", "content": [{"type": "text", "text": "hello\x00 there"}]}]
        r = await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": said})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Answered.", r.text
        assert fake_llm.requests[-1]["messages"][-1] == {"role": "user", "content": "hello there"}
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE role = 'user'") == 4


async def test_a_file_name_with_nul_and_a_text_file_with_a_stray_nul_are_read(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    s = await serve()
    fake_llm.default = Reply(text="Read it.")
    text = "FIRST LINE of the notes\n" + "a line of text\n" * 200 + "one stray \x00 here\n"
    part = {"type": "file", "name": "no\x00tes.txt", "data": base64.b64encode(text.encode()).decode()}
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"content": [{"type": "text", "text": "read"}, part]})
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        assert r.json()["parts"][-1] == {"type": "text", "text": "Read it."}
    sent = json.dumps(fake_llm.requests[-1]["messages"], ensure_ascii=False)
    assert "notes.txt" in sent and "FIRST LINE of the notes" in sent and "\\u0000" not in sent
    kept = await pool.fetchrow("SELECT name, pages FROM attachments")
    assert kept is not None and kept["name"] == "notes.txt" and "one stray  here" in kept["pages"][-1]
