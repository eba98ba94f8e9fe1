"""Files people send on Telegram: what a message carries (media_of) and its download (download) through the real
python-telegram-bot against the fake Bot API server (getFile and GET /file/bot<token>/<file_path>)."""

from __future__ import annotations

import os
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from telegram import Bot, Message

from adapters.telegram import TelegramAdapter
from adapters.telegram.config import bot_file_url
from adapters.telegram.files import FileRefused, Media, download, media_of
from adapters.telegram.limits import TELEGRAM_MAX_DOWNLOAD_BYTES
from tests.conftest import MakeCore
from tests.fake_telegram import MAX_DOWNLOAD_SIZE, TOKEN, FakeTelegram


@pytest.fixture
async def bot(tg: FakeTelegram, make_core: MakeCore) -> AsyncIterator[Bot]:
    """The adapter's own bot (as bot/ builds it), pointed at the fake as an operator writes a local server's URL."""
    core = make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.origin)
    adapter = TelegramAdapter(core, core.settings)
    await adapter.bot.initialize()
    try:
        yield adapter.bot
    finally:
        await adapter.bot.shutdown()


def message(update: dict[str, Any]) -> Message:
    """The Message PTB reads from an update the fake built."""
    return Message.de_json(update["message"], None)


def file_gets(tg: FakeTelegram) -> list[str]:
    """The file_id of every getFile the bot made."""
    return [str(params["file_id"]) for method, params in tg.calls if method == "getFile"]


async def refusal(bot: Bot, file_id: str, **kw: Any) -> str:
    """The line download() refuses with (failing the test when it does not)."""
    with pytest.raises(FileRefused) as caught:
        await download(bot, file_id, **{"max_bytes": TELEGRAM_MAX_DOWNLOAD_BYTES, **kw})
    line = str(caught.value)
    assert "\n" not in line and TOKEN.partition(":")[2] not in line and "http" not in line, line  # no token, no URL
    return line


def test_files_come_from_the_same_bot_api_server_as_every_call() -> None:
    assert bot_file_url(None) == "https://api.telegram.org/file/bot"
    assert bot_file_url("http://localhost:8081") == "http://localhost:8081/file/bot"
    assert bot_file_url("http://localhost:8081/bot/") == "http://localhost:8081/file/bot"  # PTB's form of the URL
    assert bot_file_url("https://proxy.example/telegram") == "https://proxy.example/telegram/file/bot"


async def test_a_voice_note_downloads_whole_from_the_fake(tg: FakeTelegram, bot: Bot) -> None:
    data = os.urandom(30_000)
    media = media_of(message(tg.voice_update(data, duration=4)))
    assert media is not None and media.kind == "voice" and media.file_size == len(data)
    assert bot.base_file_url == f"{tg.origin}/file/bot{tg.token}"  # the same server as the Bot API calls

    assert await download(bot, media.file_id, max_bytes=TELEGRAM_MAX_DOWNLOAD_BYTES, size=media.file_size) == data
    assert file_gets(tg) == [media.file_id]
    assert tg.downloads == [(tg.token, "voice/file_0.oga")]  # with the bot's own token


async def test_a_file_too_big_by_its_size_is_refused_before_any_download(tg: FakeTelegram, bot: Bot) -> None:
    file_id = tg.add_file(bytes(3 << 20), path="documents/file_0.pdf")
    line = await refusal(bot, file_id, max_bytes=(5 << 19) - 1)
    assert line == "the file is too big (3 MB; at most 2.5 MB can be fetched)"
    assert file_gets(tg) == [file_id] and tg.downloads == []  # getFile said 3 MB: nothing downloaded

    line = await refusal(bot, file_id, max_bytes=5 << 20, size=6 << 20)  # the size the message gave
    assert line == "the file is too big (6 MB; at most 5 MB can be fetched)"
    assert file_gets(tg) == [file_id] and tg.downloads == []  # not even a getFile


async def test_a_file_telegram_says_is_too_big_is_refused(tg: FakeTelegram, bot: Bot) -> None:
    file_id = tg.add_file(bytes(MAX_DOWNLOAD_SIZE + 1))
    line = await refusal(bot, file_id, max_bytes=50 << 20)
    assert line == "the file is too big: Telegram lets a bot download files of at most 20 MB"
    assert tg.downloads == []


async def test_an_unknown_file_is_one_line(tg: FakeTelegram, bot: Bot) -> None:
    assert await refusal(bot, "no-such-file") == "Telegram would not give the file (Invalid file_id)"


async def test_a_local_servers_file_is_read_from_its_disk_without_the_20_mb_limit(
    tg: FakeTelegram, bot: Bot, tmp_path: Path
) -> None:
    tg.local_mode(tmp_path)  # like telegram-bot-api --local --dir=tmp_path on this machine
    data = os.urandom(1000) * ((MAX_DOWNLOAD_SIZE // 1000) + 1)
    media = media_of(message(tg.document_update(data, file_name="big.pdf")))
    assert media is not None and media.file_size == len(data) > TELEGRAM_MAX_DOWNLOAD_BYTES
    assert await download(bot, media.file_id, max_bytes=50 << 20) == data
    assert tg.downloads == []  # read from the disk: the server serves no file over HTTP


async def test_a_local_servers_file_on_another_machine_is_one_line(tg: FakeTelegram, bot: Bot, tmp_path: Path) -> None:
    tg.local_mode(tmp_path / "elsewhere", shared=False)  # the server's disk is not this machine's
    file_id = tg.add_file(b"spoken words", path="voice/file_0.oga")
    line = await refusal(bot, file_id)
    assert line == (
        "could not download the file from Telegram "
        "(the local Bot API server keeps it on a disk this machine cannot read)"
    )
    [(token, path)] = tg.downloads  # PTB's way: base_file_url/<the absolute path>, for a web server in front
    assert token == tg.token and path == f"{tmp_path}/elsewhere/{tg.token}/voice/file_0.oga"


async def test_a_same_named_file_in_the_working_directory_is_never_sent_instead(
    tg: FakeTelegram, bot: Bot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "voice").mkdir()
    (tmp_path / "voice" / "file_7.oga").write_bytes(b"a file of this machine")
    file_id = tg.add_file(b"the person's voice note", path="voice/file_7.oga")
    assert await download(bot, file_id, max_bytes=TELEGRAM_MAX_DOWNLOAD_BYTES) == b"the person's voice note"
    assert tg.downloads == [(tg.token, "voice/file_7.oga")]


async def test_the_fake_serves_files_only_with_the_bots_token(tg: FakeTelegram) -> None:
    tg.add_file(b"bytes", path="photos/file_0.jpg")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{tg.origin}/file/bot{tg.token}/photos/file_0.jpg") as ok:
            assert ok.status == 200 and await ok.read() == b"bytes"
        async with http.get(f"{tg.origin}/file/bot123:wrong/photos/file_0.jpg") as wrong:
            assert wrong.status == 404 and (await wrong.json())["description"] == "Not Found"
        async with http.get(f"{tg.origin}/file/bot{tg.token}/photos/file_1.jpg") as missing:
            assert missing.status == 404


def test_media_of_a_voice_note_and_an_audio_file(tg: FakeTelegram) -> None:
    voice = tg.voice_update(b"ogg", duration=7, caption="listen")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no PTB deprecation warning about durations
        found = media_of(message(voice))
    file_id = voice["message"]["voice"]["file_id"]
    assert found == Media("voice", file_id, None, "audio/ogg", 3, 7, "listen")

    audio = tg.audio_update(b"mp3!", file_name="talk.mp3", duration=90, title="Talk")
    file_id = audio["message"]["audio"]["file_id"]
    assert media_of(message(audio)) == Media("audio", file_id, "talk.mp3", "audio/mpeg", 4, 90)


def test_media_of_a_photo_takes_the_largest_size_within_the_limit(tg: FakeTelegram) -> None:
    update = tg.photo_update([(90, 60, b"s" * 100), (320, 213, b"m" * 1000), (1280, 853, b"l" * 5000)], caption="hi")
    ids = [size["file_id"] for size in update["message"]["photo"]]
    photo = message(update)
    assert media_of(photo) == Media("photo", ids[2], None, "image/jpeg", 5000, caption="hi")
    assert media_of(photo, max_bytes=4999) == Media("photo", ids[1], None, "image/jpeg", 1000, caption="hi")
    assert media_of(photo, max_bytes=10) == Media("photo", ids[0], None, "image/jpeg", 100, caption="hi")  # none fits


def test_media_of_a_document_a_sticker_an_animation_and_a_video_note(tg: FakeTelegram) -> None:
    doc = tg.document_update(b"%PDF-", file_name="contract.pdf", caption="/read this")
    file_id = doc["message"]["document"]["file_id"]
    assert media_of(message(doc)) == Media(
        "document", file_id, "contract.pdf", "application/pdf", 5, caption="/read this"
    )

    sticker = tg.sticker_update(b"webp", emoji="🐱")
    file_id = sticker["message"]["sticker"]["file_id"]
    assert media_of(message(sticker)) == Media("sticker", file_id, None, "image/webp", 4, emoji="🐱")
    animated = media_of(message(tg.sticker_update(b"tgs", kind="animated")))
    assert animated is not None and animated.mime_type == "application/x-tgsticker"

    gif = tg.animation_update(b"mp4", file_name="cat.gif.mp4", duration=2, caption="lol")
    assert "document" in gif["message"]  # Telegram sends it as a document too
    file_id = gif["message"]["animation"]["file_id"]
    assert media_of(message(gif)) == Media("animation", file_id, "cat.gif.mp4", "video/mp4", 3, 2, "lol")

    note = tg.video_note_update(b"round", duration=12)
    file_id = note["message"]["video_note"]["file_id"]
    assert media_of(message(note)) == Media("video_note", file_id, None, "video/mp4", 5, 12)

    assert media_of(message(tg.message_update("just text"))) is None
