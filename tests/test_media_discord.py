"""Voice messages and documents sent on Discord, end to end (issue 23): the real adapter keeps the attachment's
reference in the inbox, downloads it through discord.py's Attachment.read() from the fake's CDN when the turn runs,
and the core transcribes it through the fake model server or reads the document (photos, stickers and GIFs:
test_media_photos_stickers.py); an image of another type (SVG) still gets the text-only note, and a file over the
download cap gets one line without being fetched."""

from __future__ import annotations

import json

from adapters.discord.files import fetch
from adapters.discord.incoming import StoredMessage
from adapters.discord.limits import DISCORD_MAX_DOWNLOAD_BYTES
from core import TEXT_ONLY
from tests.fake_openai import Reply
from tests.test_discord import Bot, bot  # noqa: F401  (the running adapter fixture)
from tests.test_media_documents import pdf

OGG = b"OggS\x00\x02" + bytes(range(200))


async def test_a_voice_message_is_heard_answered_and_shown_in_the_steps(bot: Bot) -> None:  # noqa: F811
    bot.llm.script_transcripts(Reply(text="remind me to water the plants"))
    bot.llm.script(Reply(text="I'll remind you to water the plants."))
    before = len(bot.dc.sent)
    posted = await bot.dc.post_voice_message(bot.alice, OGG, duration_secs=3.2, dm=True)
    await bot.dc.wait_sent(before + 1)
    [sent] = bot.dc.sent[before:]
    [upload] = bot.llm.uploads
    assert upload.data == OGG and upload.model == "whisper-1"
    assert bot.dc.downloads == [posted["attachments"][0]["id"]]
    asked = bot.llm.requests[-1]["messages"][-1]
    assert asked == {"role": "user", "content": "remind me to water the plants"}
    assert sent["content"].startswith("I'll remind you to water the plants.")
    assert "-# 🔧 1 step" in sent["content"], "the heard step is counted in the reply's steps line"
    kept = await bot.pool.fetchrow("SELECT kind, pages, platform_ref FROM attachments")
    assert kept is not None and kept["kind"] == "voice" and kept["pages"] == ["remind me to water the plants"]
    assert kept["platform_ref"] == posted["attachments"][0]["url"].partition("?")[0]
    stored = await bot.pool.fetchval("SELECT payload::text FROM inbox")
    assert stored is not None and "OggS" not in stored and len(stored) < 4000, "the inbox keeps a reference, no bytes"
    [kept_file] = StoredMessage.from_payload(json.loads(stored)).files  # what another process would answer from
    assert (kept_file.kind, kept_file.duration_s) == ("voice", 3.2)
    assert (await fetch(bot.adapter.client, kept_file)).data == OGG


async def test_a_pdf_attachment_reaches_the_model_as_a_quoted_file(bot: Bot) -> None:  # noqa: F811
    data = pdf(["Contract page one: rent 900 EUR", "Page two: the deposit"])
    bot.llm.script(Reply(text="The rent is 900 EUR."))
    attachment = {"filename": "lease.pdf", "data": data, "content_type": "application/pdf"}
    [sent] = await bot.say("what is the rent?", author=bot.bob, mention_bot=True, attachments=[attachment])
    said = json.dumps(bot.llm.requests[-1]["messages"], ensure_ascii=False)
    assert "sent the file lease.pdf" in said and "> Contract page one: rent 900 EUR" in said
    assert bot.llm.requests[-1]["messages"][-1]["content"] == "Bob: what is the rent?"
    assert sent["content"].startswith("The rent is 900 EUR.")


async def test_an_oversized_attachment_gets_one_line_without_a_download(bot: Bot) -> None:  # noqa: F811
    huge = {"filename": "big.pdf", "data": b"%PDF-1.7", "content_type": "application/pdf",
            "size": DISCORD_MAX_DOWNLOAD_BYTES + 1}  # fmt: skip
    [sent] = await bot.say("", mention_bot=True, attachments=[huge])
    assert "\n" not in sent["content"] and "too big" in sent["content"], sent["content"]
    assert bot.dc.downloads == [] and bot.llm.requests == []


async def test_an_image_of_a_type_not_read_still_gets_the_text_only_note(bot: Bot) -> None:  # noqa: F811
    image = {"filename": "cat.svg", "data": b"<svg/>", "content_type": "image/svg+xml"}  # (a PNG is a photo)
    [sent] = await bot.say("", mention_bot=True, attachments=[image])
    assert sent["content"] == TEXT_ONLY
    assert bot.dc.downloads == [] and bot.llm.requests == []
