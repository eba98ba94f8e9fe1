"""Voice notes through the real openai SDK against the fake server: what is uploaded, which model and server,
what is refused (and how, in one line without a key), and spoken answers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from core.agent.providers import PROVIDERS
from core.constants import SPEECH_INPUT_CHARS, SPEECH_VOICE
from core.media.audio import NO_SPEECH, NO_TRANSCRIPTION, NOTHING_HEARD, Audio, AudioRefused, length
from core.settings import SettingsError, load_settings
from tests.conftest import MakeSettings
from tests.fake_openai import FakeOpenAI, Reply, Upload, speech_audio

KEY = "sk-the-model-key-1234"
VOICE = b"OggS\x00\x02" + bytes(range(256)) + b"\r\n--boundary--\r\n"  # every byte value, and what splits a form

MakeAudio = Callable[..., Audio]


@pytest.fixture
async def make_audio(make_settings: MakeSettings) -> AsyncIterator[MakeAudio]:
    """Audio from settings pointed at the fake model server (LLM_API_KEY is KEY; no SDK retries), closed after."""
    made: list[Audio] = []

    def make(**overrides: Any) -> Audio:
        settings = make_settings(**{"LLM_API_KEY": KEY, **overrides})
        made.append(Audio.from_settings(settings, PROVIDERS, max_retries=0))
        return made[-1]

    yield make
    for audio in made:
        await audio.aclose()


async def test_the_upload_is_exactly_the_bytes_name_type_and_model_sent(
    make_audio: MakeAudio, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script_transcripts(Reply(text="  remind me to call Anna at five \n"))
    audio = make_audio(TRANSCRIPTION_MODEL="my-whisper")
    assert await audio.transcribe(VOICE, "voice.oga", "audio/ogg", 4.0) == "remind me to call Anna at five"
    assert fake_llm.uploads == [Upload("voice.oga", "audio/ogg", VOICE, "my-whisper", {}, KEY)]
    assert fake_llm.requests == []  # no chat completion was asked


@pytest.mark.parametrize(
    ("provider", "transcription", "speech"),
    [("openai", "whisper-1", "tts-1"), ("groq", "whisper-large-v3-turbo", None)],
)
async def test_the_default_models_are_the_providers(
    make_audio: MakeAudio, fake_llm: FakeOpenAI, provider: str, transcription: str, speech: str | None
) -> None:
    audio = make_audio(LLM_PROVIDER=provider)
    assert await audio.transcribe(VOICE, "v.ogg", None, None) == "fake transcript"
    assert [u.model for u in fake_llm.uploads] == [transcription]
    if speech is None:
        with pytest.raises(AudioRefused) as refused:
            await audio.speak("hello")
        assert str(refused.value) == NO_SPEECH and fake_llm.speech_requests == []
    else:
        await audio.speak("hello")
        assert [r["model"] for r in fake_llm.speech_requests] == [speech]


@pytest.mark.parametrize("provider", ["ollama", "anthropic", "gemini", "openrouter", "lmstudio"])
async def test_without_a_transcription_model_a_voice_note_gets_the_clear_line(
    make_audio: MakeAudio, fake_llm: FakeOpenAI, provider: str
) -> None:
    audio = make_audio(LLM_PROVIDER=provider)
    with pytest.raises(AudioRefused) as refused:
        await audio.transcribe(VOICE, "v.ogg", "audio/ogg", 3.0)
    assert str(refused.value) == NO_TRANSCRIPTION
    assert "TRANSCRIPTION_MODEL" in NO_TRANSCRIPTION and "\n" not in NO_TRANSCRIPTION
    with pytest.raises(AudioRefused, match="SPEECH_MODEL"):
        await audio.speak("hello")
    assert fake_llm.uploads == [] and fake_llm.speech_requests == []
    assert "voice notes: off (set TRANSCRIPTION_MODEL" in audio.describe()


async def test_a_transcription_server_of_its_own_gets_the_uploads_and_never_the_models_key(
    make_audio: MakeAudio, fake_llm: FakeOpenAI
) -> None:
    async with FakeOpenAI() as whisper:
        url = whisper.base_url
        audio = make_audio(LLM_PROVIDER="ollama", TRANSCRIPTION_BASE_URL=url, TRANSCRIPTION_MODEL="Systran/x")
        assert await audio.transcribe(VOICE, "v.ogg", "audio/ogg", 1.0) == "fake transcript"
        keyed = make_audio(TRANSCRIPTION_BASE_URL=url, TRANSCRIPTION_API_KEY="whisper-key")
        await keyed.transcribe(b"2", "v.ogg", "audio/ogg", 1.0)
        await keyed.speak("spoken by the model's server")
        assert whisper.uploads == [
            Upload("v.ogg", "audio/ogg", VOICE, "Systran/x", {}, "not-needed"),
            Upload("v.ogg", "audio/ogg", b"2", "whisper-1", {}, "whisper-key"),
        ]
        assert whisper.speech_requests == []
    assert fake_llm.uploads == [] and len(fake_llm.speech_requests) == 1
    assert f"transcribed by Systran/x at {url.split('/')[2]}" in audio.describe()


async def test_a_voice_note_over_the_cap_is_refused_before_any_upload(
    make_audio: MakeAudio, fake_llm: FakeOpenAI
) -> None:
    audio = make_audio(VOICE_MAX_SECONDS=60)
    with pytest.raises(AudioRefused) as refused:
        await audio.transcribe(VOICE, "v.ogg", "audio/ogg", 61.0)
    assert str(refused.value) == (
        "This voice note is 1 min 1 s long; I can listen to at most 1 min (send a shorter one, or type your message)."
    )
    assert fake_llm.uploads == []
    assert await audio.transcribe(VOICE, "v.ogg", "audio/ogg", 60.0) == "fake transcript"  # the cap itself is fine
    assert [length(s) for s in (0.4, 45, 60, 450, 3600)] == ["0 s", "45 s", "1 min", "7 min 30 s", "60 min"]


@pytest.mark.parametrize(
    ("reply", "detail"),
    [
        (Reply(status=500, text=f"crashed with key {KEY}"), "it answered 500"),
        (Reply(status=401, text=f"Incorrect API key provided: {KEY}"), "it answered 401 (check LLM_API_KEY)"),
        (Reply(status=404, text="model 'whisper-1' not found"), "it answered 404: model 'whisper-1' not found"),
    ],
)
async def test_a_failing_server_is_one_line_naming_its_host_only(
    make_audio: MakeAudio, fake_llm: FakeOpenAI, reply: Reply, detail: str
) -> None:
    fake_llm.script_transcripts(reply)
    audio = make_audio()
    with pytest.raises(AudioRefused) as refused:
        await audio.transcribe(VOICE, "v.ogg", "audio/ogg", 2.0)
    line = str(refused.value)
    host = fake_llm.origin.removeprefix("http://")
    assert line.startswith(f"The transcription server at {host} could not be used: {detail}")
    assert KEY not in line and "/v1" not in line and "http" not in line and "\n" not in line


async def test_an_unreachable_or_slow_server_is_one_line(make_audio: MakeAudio, fake_llm: FakeOpenAI) -> None:
    audio = make_audio(AGENT_STEP_TIMEOUT=0.05)
    fake_llm.script_transcripts(Reply(text="too late", delay=30))
    with pytest.raises(AudioRefused, match=r"could not be used: it timed out\.$"):
        await audio.transcribe(VOICE, "v.ogg", "audio/ogg", 2.0)
    fake_llm.down()
    audio = make_audio()  # a refused connection within the step's time: 50 ms could run out first on a busy machine
    with pytest.raises(AudioRefused, match=r"could not be used: it is unreachable\.$"):
        await audio.transcribe(VOICE, "v.ogg", "audio/ogg", 2.0)
    with pytest.raises(AudioRefused, match=r"^The speech server at .* could not be used: it is unreachable\.$"):
        await audio.speak("hello")


@pytest.mark.parametrize("heard", ["", "   \n", None])
async def test_an_empty_transcript_is_refused(make_audio: MakeAudio, fake_llm: FakeOpenAI, heard: str | None) -> None:
    fake_llm.script_transcripts(Reply(raw={"text": heard}) if heard is None else Reply(text=heard))
    with pytest.raises(AudioRefused) as refused:
        await make_audio().transcribe(VOICE, "v.ogg", "audio/ogg", 2.0)
    assert str(refused.value) == NOTHING_HEARD


async def test_speak_returns_the_servers_ogg_opus_and_asks_for_the_right_model_voice_and_format(
    make_audio: MakeAudio, fake_llm: FakeOpenAI
) -> None:
    audio = make_audio(SPEECH_MODEL="tts-1-hd")
    assert await audio.speak("Your reminder is set for five.") == speech_audio("Your reminder is set for five.")
    long = "word " * 2000
    assert await audio.speak(long) == speech_audio(long[:SPEECH_INPUT_CHARS])
    expected = {"model": "tts-1-hd", "voice": SPEECH_VOICE, "response_format": "opus"}
    assert fake_llm.speech_requests == [
        {**expected, "input": "Your reminder is set for five."},
        {**expected, "input": long[:SPEECH_INPUT_CHARS]},
    ]
    with pytest.raises(AudioRefused, match="nothing to say"):
        await audio.speak("  ")
    fake_llm.speech_status = 500
    with pytest.raises(AudioRefused) as refused:
        await audio.speak("again")
    host = fake_llm.origin.removeprefix("http://")
    assert str(refused.value) == f"The speech server at {host} could not be used: it answered 500."


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/v1", "127.0.0.1:8000/v1", "http://user:pw@127.0.0.1:8000/v1", "http://[::1/v1"]
)
def test_the_transcription_url_must_be_http_without_credentials(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/")
    with pytest.raises(SettingsError) as error:
        load_settings(TRANSCRIPTION_BASE_URL=url, _env_file=None)
    assert str(error.value).startswith("TRANSCRIPTION_BASE_URL: must be the http(s) address") and "pw" not in str(
        error.value
    )


def test_the_transcription_key_is_a_secret() -> None:
    settings = load_settings(TRANSCRIPTION_API_KEY="whisper-secret-key", _env_file=None)
    assert "whisper-secret-key" in settings.secret_values()
    assert "whisper-secret-key" not in repr(settings)
