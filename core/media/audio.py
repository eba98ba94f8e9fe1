"""Voice notes: transcribed through an OpenAI-compatible `/audio/transcriptions`, answers spoken through
`/audio/speech` (the openai SDK, its retries; every failure one line naming the server's host, never a key)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from core.constants import SPEECH_INPUT_CHARS, SPEECH_VOICE
from core.openai_client import failure_detail, openai_client, server_host
from core.settings import Settings
from core.textsafe import strip_nul

if TYPE_CHECKING:  # the SDK loads with the first client made (a start without a model never loads it)
    import openai

NO_TRANSCRIPTION = (
    "Voice notes need a transcription model, and none is set up here (the operator can set TRANSCRIPTION_MODEL); "
    "please type your message instead."
)
NO_SPEECH = "Voice answers need a speech model, and none is set up here (the operator can set SPEECH_MODEL)."
NOTHING_HEARD = "No words were heard in this voice note; please try again or type your message."


class AudioRefused(Exception):
    """A voice note could not be transcribed, or an answer spoken; the message is one line for the person."""


class AudioProvider(Protocol):
    """What audio needs of a provider (core.agent.providers.ProviderInfo has it): its URL and audio models."""

    @property
    def base_url(self) -> str:
        """The provider's OpenAI-compatible API."""

    @property
    def transcription_model(self) -> str | None:
        """Its speech-to-text model (None: it has none)."""

    @property
    def speech_model(self) -> str | None:
        """Its text-to-speech model (None: it has none)."""


@dataclass(frozen=True)
class Endpoint:
    """One audio model on one server: `where` is the server's host (for messages), the settings name what to check
    when the server refuses the key or does not know the model."""

    client: openai.AsyncOpenAI
    model: str
    where: str
    key_setting: str
    model_setting: str

    def failed(self, what: str, e: openai.OpenAIError) -> AudioRefused:
        """The one line for a failed request (`what`: 'transcription' or 'speech')."""
        detail = failure_detail(e, self.key_setting, self.model_setting)
        return AudioRefused(f"The {what} server at {self.where} could not be used: {detail}.")


def length(seconds: float) -> str:
    """A duration as people say it: `45 s`, `5 min`, `7 min 30 s`."""
    whole = max(0, round(seconds))
    minutes, rest = divmod(whole, 60)
    if not minutes:
        return f"{rest} s"
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


class Audio:
    """Transcribes voice notes and speaks answers, each through its configured model (None: that part is off)."""

    def __init__(self, transcriber: Endpoint | None, speaker: Endpoint | None, *, max_seconds: float) -> None:
        """`max_seconds`: the longest voice note transcribed (each request gets the client's timeout and retries)."""
        self.transcriber = transcriber
        self.speaker = speaker
        self.max_seconds = max_seconds

    @classmethod
    def from_settings(
        cls, settings: Settings, providers: Mapping[str, AudioProvider], *, max_retries: int = 2
    ) -> Audio:
        """Build from the settings: transcription at TRANSCRIPTION_BASE_URL (its key TRANSCRIPTION_API_KEY) or the
        model's server, speech at the model's server; each model set, else the provider's (`providers`, e.g.
        core.agent.providers.PROVIDERS), else off."""
        info = providers[settings.LLM_PROVIDER]
        llm_url = settings.LLM_BASE_URL or info.base_url
        llm_key = settings.LLM_API_KEY.get_secret_value() if settings.LLM_API_KEY else "not-needed"
        timeout = settings.AGENT_STEP_TIMEOUT
        transcriber = speaker = None
        if model := settings.TRANSCRIPTION_MODEL or info.transcription_model:
            url, key, key_setting = llm_url, llm_key, "LLM_API_KEY"
            if settings.TRANSCRIPTION_BASE_URL is not None:  # another server: never sent the model's key
                url, key, key_setting = settings.TRANSCRIPTION_BASE_URL, "not-needed", "TRANSCRIPTION_API_KEY"
            if settings.TRANSCRIPTION_API_KEY is not None:
                key, key_setting = settings.TRANSCRIPTION_API_KEY.get_secret_value(), "TRANSCRIPTION_API_KEY"
            client = openai_client(url, key, max_retries, timeout)
            transcriber = Endpoint(client, model, server_host(url), key_setting, "TRANSCRIPTION_MODEL")
        if model := settings.SPEECH_MODEL or info.speech_model:
            client = openai_client(llm_url, llm_key, max_retries, timeout)
            speaker = Endpoint(client, model, server_host(llm_url), "LLM_API_KEY", "SPEECH_MODEL")
        return cls(transcriber, speaker, max_seconds=settings.VOICE_MAX_SECONDS)

    def describe(self) -> str:
        """One line for the operator: what transcribes voice notes and what speaks answers (or that they are off)."""
        heard = (
            f"transcribed by {self.transcriber.model} at {self.transcriber.where} (up to {length(self.max_seconds)})"
            if self.transcriber
            else "off (set TRANSCRIPTION_MODEL, and TRANSCRIPTION_BASE_URL for a separate server)"
        )
        spoken = f"{self.speaker.model} at {self.speaker.where}" if self.speaker else "off (set SPEECH_MODEL)"
        return f"voice notes: {heard}; voice answers: {spoken}"

    async def aclose(self) -> None:
        """Close the HTTP clients."""
        for endpoint in (self.transcriber, self.speaker):
            if endpoint is not None:
                await endpoint.client.close()

    async def transcribe(self, data: bytes, filename: str, mime: str | None, duration_s: float | None) -> str:
        """The words of a voice note (`duration_s`: as the platform reports it, None: unknown); AudioRefused says
        in one line why there are none (off, too long, the server failed or heard nothing)."""
        import openai

        t = self.transcriber
        if t is None:
            raise AudioRefused(NO_TRANSCRIPTION)
        if duration_s is not None and duration_s > self.max_seconds:
            raise AudioRefused(
                f"This voice note is {length(duration_s)} long; I can listen to at most {length(self.max_seconds)} "
                "(send a shorter one, or type your message)."
            )
        try:
            result = await t.client.audio.transcriptions.create(model=t.model, file=(filename, data, mime))
        except openai.OpenAIError as e:
            raise t.failed("transcription", e) from e
        text = getattr(result, "text", None)
        if not isinstance(text, str) or not text.strip():
            raise AudioRefused(NOTHING_HEARD)
        return strip_nul(text).strip()

    async def speak(self, text: str) -> bytes:
        """`text` spoken as an OGG/Opus voice note (cut to the API's input limit); AudioRefused says in one line why
        there is none (off, nothing to say, the server failed or sent no audio)."""
        import openai

        s = self.speaker
        if s is None:
            raise AudioRefused(NO_SPEECH)
        if not text.strip():
            raise AudioRefused("There is nothing to say aloud.")
        try:
            spoken = await s.client.audio.speech.create(
                model=s.model, voice=SPEECH_VOICE, input=text[:SPEECH_INPUT_CHARS], response_format="opus"
            )
            audio = await spoken.aread()
        except openai.OpenAIError as e:
            raise s.failed("speech", e) from e
        if not audio:
            raise AudioRefused(f"The speech server at {s.where} sent no audio.")
        return audio
