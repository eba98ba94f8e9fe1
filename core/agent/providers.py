"""LLM providers: where each OpenAI-compatible API lives (kept free of the heavy SDK import)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from core.constants import MAX_MODELS
from core.settings import Settings


@dataclass(frozen=True)
class ProviderInfo:
    """Where a provider's OpenAI-compatible API lives, its default model and its audio models (None: it has no
    such endpoint, so voice notes need TRANSCRIPTION_MODEL, voice answers SPEECH_MODEL)."""

    base_url: str
    default_model: str
    local: bool = False
    transcription_model: str | None = None
    speech_model: str | None = None


PROVIDERS: dict[str, ProviderInfo] = {
    "openai": ProviderInfo(
        "https://api.openai.com/v1", "gpt-4o-mini", transcription_model="whisper-1", speech_model="tts-1"
    ),
    "anthropic": ProviderInfo("https://api.anthropic.com/v1/", "claude-sonnet-4-5"),
    "gemini": ProviderInfo("https://generativelanguage.googleapis.com/v1beta/openai/", "gemini-2.5-flash"),
    "groq": ProviderInfo(
        "https://api.groq.com/openai/v1", "llama-3.3-70b-versatile", transcription_model="whisper-large-v3-turbo"
    ),
    "openrouter": ProviderInfo("https://openrouter.ai/api/v1", "openai/gpt-4o-mini"),
    "ollama": ProviderInfo("http://localhost:11434/v1", "llama3.1", local=True),
    "lmstudio": ProviderInfo("http://localhost:1234/v1", "local-model", local=True),
    "none": ProviderInfo("http://127.0.0.1:9/v1", "none", local=True),  # no model: never called (Settings.model_off)
}

HOW_TO_CONFIGURE = (
    "set LLM_API_KEY (and LLM_PROVIDER if not openai), or run Ollama locally and set LLM_PROVIDER=ollama "
    "(LLM_MODEL=llama3.1), or point LLM_BASE_URL at any OpenAI-compatible server"
)


def nothing_configured(settings: Settings) -> bool:
    """Whether no model server is configured: no key, no LLM_BASE_URL and a provider that is not local."""
    local = PROVIDERS[settings.LLM_PROVIDER].local
    return settings.LLM_API_KEY is None and settings.LLM_BASE_URL is None and not local


@dataclass(frozen=True)
class ModelChoice:
    """A model a person may pick with /model: `name` as /model shows it and an account stores it; `provider` None is
    the configured provider (LLM_PROVIDER, LLM_BASE_URL, LLM_API_KEY), else another one of PROVIDERS."""

    name: str
    model: str
    provider: str | None = None


def _entry(settings: Settings, entry: str) -> ModelChoice:
    """One entry of LLM_MODELS; ValueError says what is wrong with it (after `LLM_MODELS: `)."""
    provider, colon, model = entry.partition(":")
    provider, model = provider.strip().lower(), model.strip()
    if not colon:
        return ModelChoice(entry, entry)
    if provider not in PROVIDERS:
        raise ValueError(
            f"{entry!r} names an unknown provider {provider!r} (providers: {', '.join(PROVIDERS)}; a model whose "
            "name has a colon is written provider:model, e.g. ollama:qwen2.5:7b)"
        )
    if not model:
        raise ValueError(
            f"{entry!r} names no model (write provider:model, e.g. groq:{PROVIDERS['groq'].default_model})"
        )
    if provider == settings.LLM_PROVIDER:  # the configured provider: its client, key and URL
        return ModelChoice(model, model)
    if not PROVIDERS[provider].local and settings.provider_key(provider) is None:
        key = f"{provider.upper()}_API_KEY"
        raise ValueError(f"{entry!r} needs the {provider} key ({key} is not set; set it, or remove the entry)")
    return ModelChoice(f"{provider}:{model}", model, provider)


def chosen_model(choices: tuple[ModelChoice, ...], stored: str | None) -> ModelChoice | None:
    """An account's stored choice among those on offer (None: the default, or a name no longer offered)."""
    return next((c for c in choices if c.name == stored), None)


def model_choices(settings: Settings) -> tuple[ModelChoice, ...]:
    """The models people may pick: the default (LLM_MODEL or the provider's) first, then LLM_MODELS' entries (each
    once); ValueError says what is wrong with LLM_MODELS (config_problem reports it at start)."""
    if settings.model_off:
        return (ModelChoice("none", "none"),)
    default = settings.LLM_MODEL or PROVIDERS[settings.LLM_PROVIDER].default_model
    entries = [e.strip() for e in settings.LLM_MODELS.replace(";", ",").split(",") if e.strip()]
    if len(entries) > MAX_MODELS:
        raise ValueError(f"{len(entries)} models listed (at most {MAX_MODELS}; keep the ones people need)")
    choices = {default: ModelChoice(default, default)}
    for entry in entries:
        choice = _entry(settings, entry)
        choices.setdefault(choice.name, choice)
    return tuple(choices.values())


def config_problem(settings: Settings) -> str | None:
    """One clear line when no usable LLM is configured (or LLM_MODELS lists one that cannot be used), else None."""
    if settings.model_off:
        return None
    if nothing_configured(settings):
        return f"LLM_API_KEY: not set, and LLM_PROVIDER={settings.LLM_PROVIDER} needs one ({HOW_TO_CONFIGURE})"
    base_url = settings.LLM_BASE_URL or ""
    if "@" in urlsplit(base_url).netloc:  # the HTTP client refuses credentials in the URL at the first request
        return "LLM_BASE_URL: cannot carry a user name or password (put the key in LLM_API_KEY)"
    try:
        model_choices(settings)
    except ValueError as e:
        return f"LLM_MODELS: {e}"
    return None


def fix_hint(settings: Settings) -> str:
    """What to do when the model cannot be used: how to configure one when nothing is, else what to check about the
    configured server (its host, never the URL's path or credentials), key and model."""
    if nothing_configured(settings):
        return HOW_TO_CONFIGURE
    from core.openai_client import server_host  # the openai SDK is loaded by then (a model was called)

    info = PROVIDERS[settings.LLM_PROVIDER]
    where = "LLM_BASE_URL" if settings.LLM_BASE_URL else f"LLM_PROVIDER={settings.LLM_PROVIDER}"
    host = server_host(settings.LLM_BASE_URL or info.base_url)
    key = "LLM_API_KEY is valid there" if settings.LLM_API_KEY else "it needs no key (else set LLM_API_KEY)"
    model = settings.LLM_MODEL or info.default_model
    server = f"the server at {host} ({where})"
    return f"check that {server} is running, that {key} and that it serves the model {model} (LLM_MODEL)"
