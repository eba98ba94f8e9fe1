"""Files through the HTTP API (issue 23): a message's file parts (base64 in JSON) and the OpenAI-compatible endpoint's
image_url / input_audio parts become the core's uploads, over real HTTP with the fake model server: a voice note is
transcribed and answered, a document's first page is quoted, a photo reaches the model as an image part; oversized
bodies, bad base64, too many files and links get one clear line each, and another person's session stays a 404."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import httpx
import openai
import pytest
from openapi_spec_validator import validate
from PIL import Image

from adapters.http.limits import HTTP_UPLOAD_MAX_BYTES, HTTP_UPLOAD_MAX_FILES, MAX_BODY_BYTES, UPLOAD_BODY_BYTES
from core.storage.db import Pool
from tests import test_http_api
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_http_api import ANN, BOB, Serve, token_of
from tests.test_media_documents import pdf
from tests.test_openai_compat import sdk

serve = test_http_api.serve  # the fixture: a server with the /v1 routes

OGG = b"OggS\x00\x02" + bytes(range(200))
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(64)


def b64(data: bytes) -> str:
    """Base64 as a JSON body carries it."""
    return base64.b64encode(data).decode()


def file_part(name: str, data: bytes, mime: str | None = None) -> dict[str, Any]:
    """A message's file part."""
    part = {"type": "file", "name": name, "data": b64(data)}
    return part | ({"mime": mime} if mime else {})


def image_part(data: bytes) -> dict[str, Any]:
    """An OpenAI image_url part with a data: URL."""
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(data)}"}}


def png(color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A small PNG made here."""
    out = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(out, "PNG")
    return out.getvalue()


async def test_a_voice_upload_is_transcribed_and_the_transcript_answered(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    s = await serve()
    fake_llm.script_transcripts(Reply(text="remind me to water the plants"))
    fake_llm.script(Reply(text="I'll remind you to water the plants."))
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        body = {"content": [file_part("note.ogg", OGG, "audio/ogg; codecs=opus")]}
        r = await c.post(f"/v1/sessions/{sid}/messages", json=body)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["role"] == "assistant" and answer["status"] == "done"
        assert answer["parts"][-1] == {"type": "text", "text": "I'll remind you to water the plants."}
        [upload] = fake_llm.uploads
        assert upload.data == OGG and upload.filename == "note.ogg" and upload.model == "whisper-1"
        asked = fake_llm.requests[-1]["messages"][-1]
        assert asked == {"role": "user", "content": "remind me to water the plants"}
        stored = (await c.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
        assert stored[0]["role"] == "user"
        assert stored[0]["parts"] == [{"type": "text", "text": "remind me to water the plants"}]
    kept = await pool.fetchrow("SELECT kind, name, pages FROM attachments")
    assert kept is not None and (kept["kind"], kept["name"]) == ("voice", "note.ogg")
    assert kept["pages"] == ["remind me to water the plants"]


async def test_a_documents_first_page_reaches_the_model_as_a_quoted_file(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.script(Reply(text="The rent is 900 EUR."))
    data = pdf(["Contract page one: rent 900 EUR", "Page two: the deposit is SECOND-PAGE-ONLY"])
    async with s.client(await token_of(s.core, ANN)) as c:
        r = await c.post(  # one-shot takes files the same way; the name tells the type
            "/v1/one-shot",
            json={"prompt": [{"type": "text", "text": "what is the rent?"}, file_part("lease.pdf", data)]},
        )
        assert r.status_code == 200, r.text
        assert r.json()["parts"][-1]["text"] == "The rent is 900 EUR."
    asked = fake_llm.requests[-1]["messages"]
    said = json.dumps(asked, ensure_ascii=False)
    assert "sent the file lease.pdf" in said and "> Contract page one: rent 900 EUR" in said
    assert "SECOND-PAGE-ONLY" not in said, "only the first page goes into the turn"
    assert asked[-1]["content"] == "what is the rent?"
    assert not fake_llm.uploads, "a document is not transcribed"


async def test_a_file_over_the_1_mib_of_other_routes_is_taken(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.script(Reply(text="A long log."))
    text = "FIRST-LINE\n" + "a line of the log\n" * 70_000 + "LAST-LINE\n"
    assert len(text) > MAX_BODY_BYTES
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"content": [file_part("app.log", text.encode())]})
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
    said = json.dumps(fake_llm.requests[-1]["messages"], ensure_ascii=False)
    assert "sent the file app.log" in said and "FIRST-LINE" in said and "LAST-LINE" not in said


async def test_oversized_bodies_and_files_get_413_in_the_error_shape(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        r = await c.post(f"/v1/sessions/{sid}/messages", content=b"{" + b" " * UPLOAD_BODY_BYTES + b"}")
        assert r.status_code == 413 and r.headers["content-type"] == "application/json"
        error = r.json()["error"]
        assert error["type"] == "too_large" and "\n" not in error["message"]
        assert f"{UPLOAD_BODY_BYTES:,} bytes" in error["message"] and f"{HTTP_UPLOAD_MAX_BYTES:,}" in error["message"]
        big = bytes(HTTP_UPLOAD_MAX_BYTES // 2 + 1)  # two of them: under the body's limit, over the files' one
        r = await c.post(
            f"/v1/sessions/{sid}/messages",
            json={"content": [file_part("a.pdf", big), file_part("b.pdf", big)]},
        )
        assert r.status_code == 413 and r.json()["error"]["type"] == "too_large"
        assert r.json()["error"]["message"].startswith(f"The files hold {2 * len(big):,} bytes")
        r = await c.post("/v1/sessions", content=b"{" + b" " * MAX_BODY_BYTES + b"}")  # other routes: as before
        assert r.status_code == 413 and r.json()["error"]["message"] == (
            f"The request body is larger than {MAX_BODY_BYTES:,} bytes."
        )
    assert not fake_llm.requests and not fake_llm.uploads


async def test_bad_base64_too_many_files_and_nothing_said_get_400(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        bad = {"type": "file", "name": "note.ogg", "data": "bm90!!base64"}
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"content": [{"type": "text", "text": "hi"}, bad]})
        assert r.status_code == 400
        assert r.json()["error"] == {"type": "invalid_request", "message": "content[1].data: not valid base64."}
        many = [file_part(f"{i}.txt", b"hello") for i in range(HTTP_UPLOAD_MAX_FILES + 1)]
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"content": many})
        assert (
            r.status_code == 400
            and r.json()["error"]["message"] == f"At most {HTTP_UPLOAD_MAX_FILES} files in one message."
        )
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"content": [{"type": "text", "text": " "}]})
        assert r.status_code == 400 and "neither text nor a file" in r.json()["error"]["message"]
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"content": [{"type": "video", "url": "x"}]})
        assert r.status_code == 400 and "\n" not in r.json()["error"]["message"]
    assert not fake_llm.requests and not fake_llm.uploads


async def test_files_for_another_persons_session_are_a_404(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    async with s.client(await token_of(s.core, ANN)) as ann, s.client(await token_of(s.core, BOB)) as bob:
        sid = (await ann.post("/v1/sessions", json={})).json()["id"]
        r = await bob.post(f"/v1/sessions/{sid}/messages", json={"content": [file_part("v.ogg", OGG, "audio/ogg")]})
        assert r.status_code == 404 and r.json()["error"] == {"type": "not_found", "message": "No such session."}
    assert not fake_llm.uploads and not fake_llm.requests, "nothing of it was transcribed or answered"


async def test_openai_compatible_image_url_data_urls_reach_the_model_as_images(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    s = await serve()
    fake_llm.default = Reply(text="A red rectangle.")
    old, new = png((0, 0, 255)), png()
    async with sdk(s, await token_of(s.core, ANN)) as client:
        history: list[Any] = [
            {"role": "user", "content": [image_part(old)]},
            {"role": "assistant", "content": "A blue one."},
            {"role": "user", "content": [{"type": "text", "text": "and this one?"}, image_part(new)]},
        ]
        done = await client.chat.completions.create(model="fake-model", messages=history)
        assert done.choices[0].message.content == "A red rectangle."
        with pytest.raises(openai.BadRequestError, match="Links are not fetched"):
            await client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                ]}],
            )  # fmt: skip
    assert len(fake_llm.requests) == 1, "a link is refused before any model call"
    content = fake_llm.requests[-1]["messages"][-2]["content"]  # the photo, quoted before the words sent with it
    assert isinstance(content, list), content
    images = [p for p in content if p.get("type") == "image_url"]
    assert len(images) == 1, "only the last user message's files are taken (earlier ones are history)"
    url = images[0]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,"), "the image as the core prepared it"
    seen = Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2])))
    red, _, blue = seen.convert("RGB").getpixel((10, 10))  # type: ignore[misc]
    assert red > 150 and blue < 100, "the last message's (red) image, not the earlier (blue) one"
    assert fake_llm.requests[-1]["messages"][-1]["content"] == "and this one?"
    kept = await pool.fetch("SELECT kind FROM attachments")
    assert [k["kind"] for k in kept] == ["photo"]


async def test_openai_compatible_input_audio_is_transcribed(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.script_transcripts(Reply(text="what's on my list today"))
    fake_llm.default = Reply(text="Nothing yet.")
    async with sdk(s, await token_of(s.core, ANN)) as client:
        done = await client.chat.completions.create(
            model="fake-model",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}}],
                }
            ],
        )
    assert done.choices[0].message.content is not None and done.choices[0].message.content.startswith("Nothing yet.")
    [upload] = fake_llm.uploads
    assert upload.data == WAV and upload.filename == "audio.wav"
    assert fake_llm.requests[-1]["messages"][-1] == {"role": "user", "content": "what's on my list today"}


async def test_openapi_shows_the_file_part(serve: Serve) -> None:
    s = await serve()
    async with httpx.AsyncClient(base_url=s.url) as c:
        doc = (await c.get("/openapi.json")).json()
    validate(doc)
    schemas = doc["components"]["schemas"]
    content = schemas["NewMessage"]["properties"]["content"]["anyOf"]
    parts = next(c["items"] for c in content if c.get("type") == "array")
    assert parts["discriminator"]["propertyName"] == "type"
    assert {m["$ref"].rsplit("/", 1)[1] for m in parts["oneOf"]} == {"TextPartIn", "FilePartIn"}
    assert schemas["FilePartIn"]["properties"]["data"]["contentEncoding"] == "base64"
    assert schemas["FilePartIn"]["required"] == ["type", "name", "data"]
    one_shot = schemas["OneShot"]["properties"]["prompt"]["anyOf"]
    assert any(c.get("type") == "array" for c in one_shot)
    openai_part = schemas["ContentPart"]["properties"]
    assert {"image_url", "input_audio", "file"} <= set(openai_part)
    post = doc["paths"]["/v1/sessions/{session_id}/messages"]["post"]["responses"]
    assert post["413"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
