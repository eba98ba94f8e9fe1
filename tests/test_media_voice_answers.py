"""Voice answers (issue 23): with /voice on, a voice note is answered in writing and also aloud, through the fake model
server's /audio/speech (SPEECH_MODEL), sent as a Telegram voice note or a Discord answer.ogg; off by default, never
for typed messages, and a failing speech server costs only the voice."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from adapters.telegram import TelegramAdapter
from core import FAILED, Core, FileAnswer, Spoken
from core.agent.providers import PROVIDERS
from core.constants import SPEECH_VOICE
from core.media.audio import Audio
from core.media.speaking import VOICE_NOT_ON, VOICE_OFF, VOICE_ON, spoken_text
from core.storage.db import Pool
from core.types import Assistant, Upload
from tests.conftest import MakeCore
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply, speech_audio
from tests.fake_telegram import FakeTelegram
from tests.helpers import incoming, run
from tests.test_discord import Bot as DcBot
from tests.test_telegram import Bot

OGG = b"OggS\x00\x02" + bytes(range(200))
ANSWER = "I'll remind you to water the plants at six."
SPEECH = "tts-test"
StartTg = Callable[..., Awaitable[Bot]]


def quick_audio(core: Core) -> Core:
    """The core's audio without SDK retries, so a failing speech server fails at once (no real backoff sleeps)."""
    core.audio = Audio.from_settings(core.settings, PROVIDERS, max_retries=0)
    core.turns.parts = replace(core.turns.parts, audio=core.audio)  # the turns speak through it too
    return core


@pytest.fixture
async def start_tg(tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool) -> AsyncIterator[StartTg]:
    """Start the real Telegram adapter on a core with these settings (SPEECH_MODEL is SPEECH unless overridden)."""
    adapters: list[TelegramAdapter] = []

    async def start(**overrides: Any) -> Bot:
        core = make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url, **{"SPEECH_MODEL": SPEECH,
                                                                                              **overrides})  # fmt: skip
        await core.audio.aclose()
        adapters.append(TelegramAdapter(quick_audio(core), core.settings, poll_timeout=1))
        await adapters[-1].start()
        return Bot(tg, fake_llm, adapters[-1], pool)

    yield start
    for adapter in adapters:
        await adapter.stop()


async def voice_note(bot: Bot, *, replies: int, **where: Any) -> list[dict[str, Any]]:
    """Push a voice note and wait for `replies` more sent messages; then for the answer to a typed note in the same
    chat (handled after the voice note's turn has ended, so nothing of it can still come). Return the voice note's."""
    update = bot.tg.voice_update(OGG, duration=3, **where)
    before = len(bot.tg.sent)
    bot.tg.push_update(update)
    await bot.tg.wait_sent(before + replies)
    got = bot.tg.sent[before:]
    bot.llm.script(Reply(text="You're welcome."))
    after = await bot.say("thanks", chat_id=where.get("chat_id", 1001), user_id=where.get("user_id", 1001))
    assert [s.get("text") for s in after] == ["You're welcome."], "nothing more came of the voice note"
    return got


async def test_voice_on_answers_a_voice_note_in_writing_and_aloud(start_tg: StartTg) -> None:
    bot = await start_tg()
    [shown] = await bot.say("/voice")
    assert shown["message"]["text"].startswith("Voice answers are off"), "off by default"
    [turned] = await bot.say("/voice on")
    assert turned["message"]["text"] == VOICE_ON.replace("**", "")
    bot.llm.script_transcripts(Reply(text="remind me to water the plants"))
    bot.llm.script(Reply(text=ANSWER))
    update = bot.tg.voice_update(OGG, duration=3)
    note_id = update["message"]["message_id"]
    before = len(bot.tg.sent)
    bot.tg.push_update(update)
    await bot.tg.wait_sent(before + 2)
    text, voice = bot.tg.sent[before:]
    assert text["text"].startswith(ANSWER), "the answer in writing comes first"
    assert voice["voice_data"] == speech_audio(ANSWER), "the voice note is exactly what the speech server returned"
    assert voice["voice_name"] == "answer.ogg" and voice["reply_parameters"]["message_id"] == note_id
    assert bot.llm.speech_requests == [
        {"model": SPEECH, "voice": SPEECH_VOICE, "response_format": "opus", "input": ANSWER}
    ]
    assert await bot.pool.fetchval("SELECT voice_answers FROM accounts") is True
    [off] = await bot.say("/voice off")
    assert off["message"]["text"].startswith("Voice answers are off now")
    bot.llm.script_transcripts(Reply(text="and the roses"))
    bot.llm.script(Reply(text="Roses too."))
    [only] = await voice_note(bot, replies=1)
    assert only["text"].startswith("Roses too.") and len(bot.llm.speech_requests) == 1


async def test_voice_answers_are_off_by_default(start_tg: StartTg) -> None:
    bot = await start_tg()
    bot.llm.script_transcripts(Reply(text="remind me to water the plants"))
    bot.llm.script(Reply(text=ANSWER))
    [text] = await voice_note(bot, replies=1)
    assert text["text"].startswith(ANSWER)
    assert not any(method == "sendVoice" for method, _ in bot.tg.calls) and bot.llm.speech_requests == []
    [shown] = await bot.say("/voice")
    assert shown["message"]["text"] == VOICE_OFF.replace("**", "")


async def test_a_typed_message_gets_no_voice_even_with_voice_on(start_tg: StartTg) -> None:
    bot = await start_tg()
    [turned] = await bot.say("/voice on")
    assert turned["message"]["text"] == VOICE_ON.replace("**", "")
    bot.llm.script(Reply(text=ANSWER))
    [text] = await bot.say("remind me to water the plants at six")
    assert text["text"].startswith(ANSWER)
    bot.llm.script(Reply(text="Sure."))
    await bot.say("and thanks")  # the first turn has ended: its voice would have come before this answer
    assert not any(method == "sendVoice" for method, _ in bot.tg.calls) and bot.llm.speech_requests == []


async def test_a_failing_speech_server_leaves_the_text_answer(
    start_tg: StartTg, caplog: pytest.LogCaptureFixture
) -> None:
    bot = await start_tg()
    [turned] = await bot.say("/voice on")
    assert turned["message"]["text"] == VOICE_ON.replace("**", "")
    bot.llm.speech_status = 500
    bot.llm.script_transcripts(Reply(text="remind me to water the plants"))
    bot.llm.script(Reply(text=ANSWER))
    [text] = await voice_note(bot, replies=1)
    assert text["text"].startswith(ANSWER) and FAILED not in text["text"]
    assert len(bot.llm.speech_requests) == 1 and not any(m == "sendVoice" for m, _ in bot.tg.calls)
    said = [r for r in caplog.records if "not read aloud" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING] and "500" in said[0].getMessage()
    assert said[0].exc_info is None, "one line, no traceback"


async def test_voice_on_without_a_speech_model_says_so_and_stays_off(start_tg: StartTg) -> None:
    bot = await start_tg(LLM_PROVIDER="groq", SPEECH_MODEL=None)  # Groq has transcription but no speech model
    [refused] = await bot.say("/voice on")
    line = refused["message"]["text"]
    assert line == VOICE_NOT_ON and "SPEECH_MODEL" in line and "\n" not in line
    assert await bot.pool.fetchval("SELECT voice_answers FROM accounts") is False
    bot.llm.script_transcripts(Reply(text="remind me to water the plants"))
    bot.llm.script(Reply(text=ANSWER))
    [text] = await voice_note(bot, replies=1)
    assert text["text"].startswith(ANSWER) and bot.llm.speech_requests == []


async def test_discord_a_voice_message_is_answered_with_answer_ogg(
    dc: FakeDiscord, fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool
) -> None:
    core = make_core(
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=dc.gateway_url,
        ALLOWED_USERS="discord:2001",
        SPEECH_MODEL=SPEECH,
    )
    await core.audio.aclose()
    bot = DcBot(dc, fake_llm, quick_audio(core), pool)
    await bot.adapter.start()
    try:
        turned = await (await dc.slash("voice", {"state": "on"}, bot.alice)).wait_done()
        assert turned.texts() == [VOICE_ON]
        fake_llm.script_transcripts(Reply(text="remind me to water the plants"))
        fake_llm.script(Reply(text=ANSWER))
        before = len(dc.sent)
        await dc.post_voice_message(bot.alice, OGG, duration_secs=3.2, dm=True)
        await dc.wait_sent(before + 2)
        text, voice = dc.sent[before:]
        assert text["content"].startswith(ANSWER)
        [attachment] = voice["attachments"]
        assert attachment["filename"] == "answer.ogg" and not voice["content"]
        assert dc.attachment_data(attachment)[1] == speech_audio(ANSWER)
        assert [r["model"] for r in fake_llm.speech_requests] == [SPEECH]
    finally:
        await bot.adapter.stop()


def voice(text: str = "", **kw: Any) -> Any:
    """A voice note from user 77 as an adapter passes it on."""
    inc = incoming(text, user="77", **kw)
    return replace(inc, uploads=(Upload("voice", "v.ogg", "audio/ogg", OGG),))


async def test_in_groups_too_never_over_the_api_and_exported(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(SPEECH_MODEL=SPEECH)
    assert await core.command(incoming("/voice", user="77"), "voice", "") == VOICE_OFF
    assert await core.command(incoming("/voice on", user="77"), "voice", "maybe") != VOICE_ON
    assert await core.command(incoming("/voice on", user="77"), "voice", "on") == VOICE_ON
    fake_llm.default = Reply(text="**Done** — see [the list](https://example.org/list).")
    fake_llm.script_transcripts(*(Reply(text=f"note {i}") for i in range(3)))
    group = await run(core, voice(chat="-500", kind="group", message_id="1"))
    assert isinstance(group[-2], Assistant) and isinstance(group[-1], Spoken), "the sender asked for it, in groups too"
    assert group[-1].turn_id == group[-2].turn_id and group[-1].data == speech_audio("Done — see the list.")
    api = await run(core, replace(voice(message_id="2"), via="api", chat_id="session-1"))
    assert not any(isinstance(e, Spoken) for e in api), "the HTTP API gets no audio"
    typed = await run(core, incoming("no voice here", user="77", message_id="3"))
    assert not any(isinstance(e, Spoken) for e in typed)
    exported = await core.command(incoming("/export", user="77"), "export", "")
    assert isinstance(exported, FileAnswer) and json.loads(exported.data)["account"]["voice_answers"] is True


def test_the_spoken_text_drops_markdown() -> None:
    said = spoken_text("# Plan\n**Water** the *plants* at `6`, see [the list](https://x.org).\n- roses\n> note")
    assert said == "Plan\nWater the plants at 6, see the list.\nroses\nnote"
