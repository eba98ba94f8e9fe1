"""LLM providers: where each OpenAI-compatible API lives (kept free of the heavy SDK import)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from core.settings import Settings


@dataclass(frozen=True)
class ProviderInfo:
    """Where a provider's OpenAI-compatible API lives and its default model."""

    base_url: str
    default_model: str
    local: bool = False


PROVIDERS: dict[str, ProviderInfo] = {
    "openai": ProviderInfo("https://api.openai.com/v1", "gpt-4o-mini"),
    "anthropic": ProviderInfo("https://api.anthropic.com/v1/", "claude-sonnet-4-5"),
    "gemini": ProviderInfo("https://generativelanguage.googleapis.com/v1beta/openai/", "gemini-2.5-flash"),
    "groq": ProviderInfo("https://api.groq.com/openai/v1", "llama-3.3-70b-versatile"),
    "openrouter": ProviderInfo("https://openrouter.ai/api/v1", "openai/gpt-4o-mini"),
    "ollama": ProviderInfo("http://localhost:11434/v1", "llama3.1", local=True),
    "lmstudio": ProviderInfo("http://localhost:1234/v1", "local-model", local=True),
}

HOW_TO_CONFIGURE = (
    "set LLM_API_KEY (and LLM_PROVIDER if not openai), or run Ollama locally and set LLM_PROVIDER=ollama "
    "(LLM_MODEL=llama3.1), or point LLM_BASE_URL at any OpenAI-compatible server"
)


def nothing_configured(settings: Settings) -> bool:
    """Whether no model server is configured: no key, no LLM_BASE_URL and a provider that is not local."""
    local = PROVIDERS[settings.LLM_PROVIDER].local
    return settings.LLM_API_KEY is None and settings.LLM_BASE_URL is None and not local


def config_problem(settings: Settings) -> str | None:
    """One clear line when no usable LLM is configured, else None."""
    if nothing_configured(settings):
        return f"LLM_API_KEY: not set, and LLM_PROVIDER={settings.LLM_PROVIDER} needs one ({HOW_TO_CONFIGURE})"
    base_url = settings.LLM_BASE_URL or ""
    if "@" in urlsplit(base_url).netloc:  # the HTTP client refuses credentials in the URL at the first request
        return "LLM_BASE_URL: cannot carry a user name or password (put the key in LLM_API_KEY)"
    return None


def fix_hint(settings: Settings) -> str:
    """What to do when the model cannot be used: how to configure one when nothing is, else what to check about the
    configured server (its host, never the URL's path or credentials), key and model."""
    if nothing_configured(settings):
        return HOW_TO_CONFIGURE
    from core.agent.llm import server_host  # the openai SDK is loaded by then (a model was called)

    info = PROVIDERS[settings.LLM_PROVIDER]
    where = "LLM_BASE_URL" if settings.LLM_BASE_URL else f"LLM_PROVIDER={settings.LLM_PROVIDER}"
    host = server_host(settings.LLM_BASE_URL or info.base_url)
    key = "LLM_API_KEY is valid there" if settings.LLM_API_KEY else "it needs no key (else set LLM_API_KEY)"
    model = settings.LLM_MODEL or info.default_model
    server = f"the server at {host} ({where})"
    return f"check that {server} is running, that {key} and that it serves the model {model} (LLM_MODEL)"
