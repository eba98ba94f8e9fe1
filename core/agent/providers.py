"""LLM providers: where each OpenAI-compatible API lives (kept free of the heavy SDK import)."""

from __future__ import annotations

from dataclasses import dataclass

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


def config_problem(settings: Settings) -> str | None:
    """One clear line when no usable LLM is configured, else None."""
    info = PROVIDERS[settings.LLM_PROVIDER]
    if settings.LLM_API_KEY is None and not info.local and settings.LLM_BASE_URL is None:
        return f"No language model configured: {HOW_TO_CONFIGURE}."
    return None
