"""Photos, stickers and GIFs sent on Telegram and Discord, end to end (issue 23): a sticker or GIF reaches the model as
a short line of words (its emoji, name or file name) and nothing of it is downloaded; a photo (on Telegram also a
JPEG, PNG or WebP sent as a file) is fetched from the fake platform by the real adapter and reaches the model as an
image part of the person's message, with the caption or text sent with it."""

from __future__ import annotations

import base64
import io
from typing import Any

from PIL import Image

from tests.fake_openai import Reply
from tests.test_discord import Bot as DcBot
from tests.test_discord import bot as dcbot  # noqa: F401  (the running Discord adapter fixture)
from tests.test_telegram import Bot as TgBot
from tests.test_telegram import bot as tgbot  # noqa: F401  (the running Telegram adapter fixture)

ME: dict[str, Any] = {"chat_id": 1001, "user_id": 1001}  # the Telegram admin's private chat


def picture(fmt: str = "JPEG", size: tuple[int, int] = (64, 48)) -> bytes:
    """A small real image made with Pillow."""
    out = io.BytesIO()
    Image.new("RGB", size, (40, 140, 60)).save(out, fmt)
    return out.getvalue()


def asked(llm_request: dict[str, Any]) -> Any:
    """What the person's message brought, as the model gets it: the user messages after the last answer (a photo
    comes as a quoted message of its own, with its image part, before the words sent with it); one alone as it is."""
    messages = llm_request["messages"]
    assert messages[-1]["role"] == "user"
    start = max((i for i, m in enumerate(messages) if m["role"] != "user"), default=-1) + 1
    contents = [m["content"] for m in messages[start:]]
    if len(contents) == 1:
        return contents[0]
    return [p for c in contents for p in ([{"type": "text", "text": c}] if isinstance(c, str) else c)]


def image_and_text(content: Any) -> tuple[list[str], str]:
    """The data URLs of a message's image parts and its text parts joined (a plain string has no images)."""
    if isinstance(content, str):
        return [], content
    urls = [p["image_url"]["url"] for p in content if p.get("type") == "image_url"]
    return urls, "\n".join(p["text"] for p in content if p.get("type") == "text")


def a_jpeg(url: str) -> Image.Image:
    """The image a data URL holds (checked to be a JPEG the core prepared)."""
    head, _, data = url.partition(",")
    assert head == "data:image/jpeg;base64", head
    img = Image.open(io.BytesIO(base64.b64decode(data)))
    assert img.format == "JPEG"
    return img


def no_file_fetched(bot: TgBot) -> None:
    """Neither getFile nor a file download reached the fake Telegram."""
    assert [m for m, _ in bot.tg.calls if m.lower() == "getfile"] == [] and bot.tg.downloads == []


async def tg_turn(bot: TgBot, update: dict[str, Any]) -> dict[str, Any]:
    """Push an update and wait for the one answer."""
    before = len(bot.tg.sent)
    bot.tg.push_update(update)
    await bot.tg.wait_sent(before + 1)
    [sent] = bot.tg.sent[before:]
    return sent


# ---- stickers and GIFs: words, no download, no image ---------------------------------------------------------------


async def test_a_telegram_sticker_reaches_the_model_as_its_emoji_without_a_download(tgbot: TgBot) -> None:  # noqa: F811
    tgbot.llm.script(Reply(text="Glad that made you laugh!"))
    sent = await tg_turn(tgbot, tgbot.tg.sticker_update(b"RIFF-webp", emoji="😂", **ME))
    assert sent["text"].startswith("Glad that made you laugh!")
    [request] = tgbot.llm.requests
    assert asked(request) == "[sticker 😂]", "a plain line of words: no image part"
    no_file_fetched(tgbot)


async def test_a_telegram_gif_reaches_the_model_as_its_file_name_and_caption(tgbot: TgBot) -> None:  # noqa: F811
    tgbot.llm.script(Reply(text="What a dance."))
    gif = tgbot.tg.animation_update(b"mp4", file_name="dancing-cat.gif.mp4", caption="look at this", **ME)
    sent = await tg_turn(tgbot, gif)
    assert sent["text"].startswith("What a dance.")
    assert asked(tgbot.llm.requests[-1]) == "[GIF: dancing-cat.gif.mp4]\nlook at this"
    no_file_fetched(tgbot)


async def test_a_discord_sticker_and_a_gif_attachment_reach_the_model_as_words(dcbot: DcBot) -> None:  # noqa: F811
    dcbot.llm.script(Reply(text="Hello to you too."), Reply(text="Nice moves."))
    [first] = await dcbot.say("", dm=True, stickers=[dcbot.dc.sticker_item("Wave")])
    assert first["content"].startswith("Hello to you too.")
    assert asked(dcbot.llm.requests[-1]) == "[sticker: Wave]"
    gif = {"filename": "dance.gif", "data": b"GIF89a-not-fetched", "content_type": "image/gif"}
    party = dcbot.dc.sticker_item("Party", format_type=2)  # APNG: an animated sticker
    [second] = await dcbot.say("haha", dm=True, attachments=[gif], stickers=[party])
    assert second["content"].startswith("Nice moves.")
    assert asked(dcbot.llm.requests[-1]) == "[GIF: Party]\n[GIF: dance.gif]\nhaha"
    assert dcbot.dc.downloads == [], "nothing of a sticker or GIF is downloaded"


# ---- photos: fetched from the platform, an image part of the person's message ---------------------------------------


async def test_a_telegram_photo_with_a_caption_reaches_the_model_as_an_image(tgbot: TgBot) -> None:  # noqa: F811
    tgbot.llm.script(Reply(text="A fern."))
    sizes = [(32, 24, picture(size=(32, 24))), (640, 480, picture(size=(640, 480)))]
    update = tgbot.tg.photo_update(sizes, caption="what plant is this?", **ME)
    largest = update["message"]["photo"][-1]["file_id"]
    sent = await tg_turn(tgbot, update)
    assert [p["file_id"] for m, p in tgbot.tg.calls if m.lower() == "getfile"] == [largest], "the largest size"
    assert [path for _, path in tgbot.tg.downloads] == ["photos/file_1.jpg"], "downloaded from the Bot API server"
    urls, text = image_and_text(asked(tgbot.llm.requests[-1]))
    assert len(urls) == 1 and a_jpeg(urls[0]).size == (640, 480)
    assert "what plant is this?" in text
    assert sent["text"].startswith("A fern.")
    assert await tgbot.pool.fetchval("SELECT name FROM attachments") == "what plant is this?", "named by its caption"


async def test_a_telegram_photo_without_a_caption_reaches_the_model_too(tgbot: TgBot) -> None:  # noqa: F811
    tgbot.llm.script(Reply(text="A sunset over the sea."))
    sent = await tg_turn(tgbot, tgbot.tg.photo_update([(200, 100, picture(size=(200, 100)))], **ME))
    urls, _ = image_and_text(asked(tgbot.llm.requests[-1]))
    assert len(urls) == 1 and a_jpeg(urls[0]).size == (200, 100)
    assert sent["text"].startswith("A sunset over the sea.")
    assert await tgbot.pool.fetchval("SELECT name FROM attachments") == "photo.jpg"


async def test_a_png_sent_as_a_file_on_telegram_is_taken_as_a_photo(tgbot: TgBot) -> None:  # noqa: F811
    tgbot.llm.script(Reply(text="It says 'error 42'."))
    png = picture("PNG", (300, 200))
    update = tgbot.tg.document_update(png, file_name="screen.png", mime_type="image/png", caption="what does it say?",
                                      **ME)  # fmt: skip
    await tg_turn(tgbot, update)
    assert len(tgbot.tg.downloads) == 1
    urls, text = image_and_text(asked(tgbot.llm.requests[-1]))
    assert len(urls) == 1 and a_jpeg(urls[0]).size == (300, 200) and "what does it say?" in text
    assert await tgbot.pool.fetchval("SELECT kind FROM attachments") == "photo"


async def test_a_discord_image_attachment_reaches_the_model_as_an_image(dcbot: DcBot) -> None:  # noqa: F811
    dcbot.llm.script(Reply(text="A cat on a sofa."))
    image = {"filename": "cat.png", "data": picture("PNG", (120, 90)), "content_type": "image/png"}
    [sent] = await dcbot.say("what is this?", author=dcbot.bob, mention_bot=True, attachments=[image])
    posted = dcbot.dc.messages_in(dcbot.dc.channel_id)[-2]  # Bob's message, before the answer
    assert dcbot.dc.downloads == [posted["attachments"][0]["id"]], "downloaded from Discord's CDN"
    urls, text = image_and_text(asked(dcbot.llm.requests[-1]))
    assert len(urls) == 1 and a_jpeg(urls[0]).size == (120, 90)
    assert "what is this?" in text
    assert sent["content"].startswith("A cat on a sofa.")
    assert await dcbot.pool.fetchval("SELECT name FROM attachments") == "what is this?", "named by the message's text"
