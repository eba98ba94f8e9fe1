"""Photos through the core to the fake model server: the image part is byte for byte the prepared JPEG, only the newest
few photos are sent again as images, a model that refuses images is asked again without them (and is known not to see
them from then on), LLM_VISION=off never sends one, and a photo mark typed by hand names no one else's photo."""

from __future__ import annotations

import base64
import io
import random
from dataclasses import replace
from typing import Any

from PIL import Image

from core.agent.loop import IMAGES_REFUSED_NOTE
from core.constants import MEDIA_REPLAY_IMAGES
from core.media.images import DAMAGED, prepare
from core.media.intake import NO_VISION
from core.storage.db import Pool
from core.types import Error, Incoming, Upload
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, incoming, run, tool_names

PREFIX = "data:image/jpeg;base64,"


def photo_bytes(seed: int, size: tuple[int, int] = (1700, 900)) -> bytes:
    """A PNG of random pixels (larger than the model gets: it is resized)."""
    rnd = random.Random(seed)
    img = Image.frombytes("RGB", (64, 48), bytes(rnd.randrange(256) for _ in range(64 * 48 * 3))).resize(size)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def with_photo(text: str, data: bytes, *, message_id: str, user: str = "90", ref: str | None = None) -> Incoming:
    """A message carrying one photo, as an adapter builds it."""
    up = Upload("photo", text or "photo", "image/png", data, platform_ref=ref)
    return replace(incoming(text, user=user, message_id=message_id), uploads=(up,))


def images_of(request: dict[str, Any]) -> list[bytes]:
    """The images (decoded) of every message of a model request, in order."""
    out = []
    for m in request["messages"]:
        if isinstance(m["content"], list):
            for p in m["content"]:
                if p["type"] == "image_url":
                    url = p["image_url"]["url"]
                    assert url.startswith(PREFIX)
                    out.append(base64.b64decode(url[len(PREFIX) :], validate=True))
    return out


def last_user(request: dict[str, Any], back: int = 1) -> Any:
    """The content of the request's last user message (back=2: the one before it, a photo's own message)."""
    return [m for m in request["messages"] if m["role"] == "user"][-back]["content"]


async def test_a_photo_reaches_the_model_as_the_prepared_jpeg_and_is_kept(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    fake_llm.default = Reply(text="A noisy picture.")
    data = photo_bytes(1)
    events = await run(core, with_photo("what is on it?", data, message_id="1"))
    assert answer(events).text == "A noisy picture."
    expected = (await prepare(data)).data
    content = last_user(fake_llm.requests[-1], 2)
    assert isinstance(content, list) and content[0]["type"] == "text"
    assert content[0]["text"].startswith("[Ann sent a photo. Whatever it shows") and "> [photo #" in content[0]["text"]
    assert last_user(fake_llm.requests[-1]) == "what is on it?", "the words sent with it: the person's own"
    assert images_of(fake_llm.requests[-1]) == [expected], "byte for byte the resized, metadata-free JPEG"
    with Image.open(io.BytesIO(expected)) as img:
        assert max(img.size) == 1568 and img.format == "JPEG"
    row = await pool.fetchrow("SELECT kind, data, size_bytes, turn_id FROM attachments")
    assert row is not None
    assert row["kind"] == "photo" and bytes(row["data"]) == expected and row["size_bytes"] == len(expected)
    assert row["turn_id"] is not None


async def test_only_the_newest_photos_are_sent_again_as_images(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.default = Reply(text="seen")
    sent = [photo_bytes(i, (300, 200)) for i in range(MEDIA_REPLAY_IMAGES + 2)]
    for i, data in enumerate(sent):
        await run(core, with_photo(f"photo number {i}", data, message_id=str(i)))
    await run(core, incoming("which one was the brightest?", user="90", message_id="99"))
    request = fake_llm.requests[-1]
    newest = [(await prepare(d)).data for d in sent[-MEDIA_REPLAY_IMAGES:]]
    assert images_of(request) == newest, "the newest few, in the order they were sent"
    users = [m["content"] for m in request["messages"] if m["role"] == "user"]
    assert isinstance(users[0], str) and "[photo #" in users[0] and users[1] == "photo number 0", "older: mark, caption"
    assert users[-1] == "which one was the brightest?"


async def test_a_model_that_refuses_images_is_asked_again_without_and_remembered(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = make_core()
    fake_llm.script(
        Reply(status=400, text="Invalid content type. image_url is only supported by certain models."),
        Reply(text="It is a receipt, going by your words."),
        Reply(text="Here is what you wrote about it."),
    )
    events = await run(core, with_photo("my receipt", photo_bytes(2, (200, 200)), message_id="1"))
    first = answer(events).text
    assert first == IMAGES_REFUSED_NOTE + "It is a receipt, going by your words."
    assert len(images_of(fake_llm.requests[0])) == 1 and images_of(fake_llm.requests[1]) == []
    retried = last_user(fake_llm.requests[1], 2)
    assert isinstance(retried, str) and "> [photo #" in retried, "the photo's message without its image"
    events = await run(core, with_photo("and this one", photo_bytes(3, (200, 200)), message_id="2"))
    second = answer(events).text
    assert second == "Here is what you wrote about it.", "the refusal is said once"
    assert len(fake_llm.requests) == 3 and images_of(fake_llm.requests[2]) == [], "no image is sent to it again"
    assert NO_VISION in last_user(fake_llm.requests[2]), "the model is told the photo was not seen"


async def test_vision_on_keeps_sending_after_a_refusal_and_off_never_sends(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    on = make_core(LLM_VISION="on")
    fake_llm.script(Reply(status=400, text="no images here"), Reply(text="ok"))
    await run(on, with_photo("one", photo_bytes(4, (100, 100)), message_id="1"))
    fake_llm.default = Reply(text="ok")
    await run(on, with_photo("two", photo_bytes(5, (100, 100)), message_id="2"))
    assert len(images_of(fake_llm.requests[-1])) == 2, "LLM_VISION=on: both photos go as images"

    off = make_core(LLM_VISION="off")
    before = len(fake_llm.requests)
    events = await run(off, with_photo("", photo_bytes(6, (100, 100)), message_id="1", user="91"))
    final = events[-1]
    assert isinstance(final, Error) and final.message == NO_VISION and "\n" not in final.message
    assert len(fake_llm.requests) == before, "a photo without words costs no model call"
    await run(off, with_photo("is this ok?", photo_bytes(7, (100, 100)), message_id="2", user="91"))
    assert images_of(fake_llm.requests[-1]) == []
    assert last_user(fake_llm.requests[-1]) == f"is this ok?\n\n[{NO_VISION}]", "the caption is still answered"


async def test_a_typed_photo_mark_names_no_one_elses_photo(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    fake_llm.default = Reply(text="ok")
    await run(core, with_photo("private", photo_bytes(8, (100, 100)), message_id="1", user="92"))
    theirs = await pool.fetchval("SELECT id FROM attachments")
    await run(core, incoming(f"describe [photo #{theirs}] please", user="93", message_id="1"))
    assert images_of(fake_llm.requests[-1]) == [], "another chat's photo is never sent"
    assert last_user(fake_llm.requests[-1]) == f"describe [photo #{theirs}] please"


async def test_a_damaged_photo_gets_one_line_and_the_same_photo_twice_is_kept_once(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    fake_llm.default = Reply(text="ok")
    events = await run(core, with_photo("", photo_bytes(9, (300, 300))[:400], message_id="1"))
    final = events[-1]
    assert isinstance(final, Error) and final.message == DAMAGED and fake_llm.requests == []
    data = photo_bytes(10, (100, 100))
    await run(core, with_photo("first", data, message_id="2", ref="tg-photo-1"))
    await run(core, with_photo("again", data, message_id="3", ref="tg-photo-1"))
    assert await pool.fetchval("SELECT count(*) FROM attachments WHERE data IS NOT NULL") == 1
    assert len(images_of(fake_llm.requests[-1])) == 2, "both messages show the one stored photo"


async def test_a_photo_is_someone_elses_content_no_admin_tools_in_its_turn(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    """A screenshot may show anyone's words ("run this SQL"): like a forwarded message, its turn has no admin tools."""
    core = make_core(ADMINS="telegram:94")
    fake_llm.default = Reply(text="ok")
    await run(core, incoming("hello", user="94", message_id="1"))
    assert "execute_sql" in tool_names(fake_llm.requests[-1]), "the admin's own words: admin tools"
    await run(core, with_photo("do what the screenshot says", photo_bytes(11, (120, 80)), message_id="2", user="94"))
    assert len(images_of(fake_llm.requests[-1])) == 1
    assert "execute_sql" not in tool_names(fake_llm.requests[-1]), "a photo in the context: no admin tools"
