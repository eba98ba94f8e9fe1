"""Configuration from the environment and `.env` (the names are a fixed contract, DESIGN §2)."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from pathlib import Path
from typing import Literal, get_args
from urllib.parse import SplitResult, unquote, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict

Provider = Literal["openai", "anthropic", "gemini", "groq", "openrouter", "ollama", "lmstudio", "none"]
PROVIDER_NAMES: tuple[Provider, ...] = get_args(Provider)
SearchProvider = Literal["searxng", "brave", "tavily", "duckduckgo", "none"]
PLATFORMS = ("telegram", "discord", "slack", "matrix", "console")
SECRET_TYPES = (SecretStr, SecretStr | None)  # fields whose value an error line never repeats


class SettingsError(Exception):
    """A configuration value is invalid; the message is one line naming the variable."""


EXIT_CONFIG = 2  # a setting is invalid or was rejected (fix the variable named in the line)
EXIT_UNREACHABLE = 3  # a service (database, Telegram, Discord) could not be reached (may pass on its own)


class StartupError(Exception):
    """The bot cannot start; the message is one line for the operator naming the variable or service (no secret)."""

    def __init__(self, message: str, *, exit_code: int = EXIT_CONFIG) -> None:
        """`exit_code`: EXIT_CONFIG for a wrong setting, EXIT_UNREACHABLE for a service that did not answer."""
        super().__init__(message)
        self.exit_code = exit_code


def parse_user_list(raw: str) -> frozenset[str]:
    """Parse `telegram:123,discord:456` (or `*`) into a set of `platform:id` keys."""
    keys: set[str] = set()
    for part in raw.replace(";", ",").split(","):
        item = part.strip()
        if not item:
            continue
        if item == "*":
            keys.add("*")
            continue
        platform, sep, uid = item.partition(":")
        if not sep or platform.strip().lower() not in PLATFORMS or not uid.strip():
            raise ValueError(f"'{item}' is not of the form platform:id (platforms: {', '.join(PLATFORMS)})")
        keys.add(f"{platform.strip().lower()}:{uid.strip()}")
    return frozenset(keys)


def parse_id_list(raw: str) -> frozenset[int]:
    """Parse `123,456` into a set of numeric ids."""
    ids: set[int] = set()
    for part in raw.replace(";", ",").split(","):
        item = part.strip()
        if not item:
            continue
        if not item.isdigit():
            raise ValueError(f"'{item}' is not a numeric channel id (enable Developer Mode, then Copy Channel ID)")
        ids.add(int(item))
    return frozenset(ids)


def parse_shard_ids(raw: str, count: int | None) -> tuple[int, ...]:
    """Parse `0,1` or `0-3` (or a mix) into sorted, distinct shard ids, each below `count` (the shard count)."""
    ids: set[int] = set()
    for part in raw.replace(";", ",").split(","):
        item = part.strip()
        if not item:
            continue
        first, dash, last = item.partition("-")
        if not first.strip().isdigit() or (dash and not last.strip().isdigit()):
            raise ValueError(f"'{item}' is not a shard id or a range such as 0-3")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"'{item}' is an empty range (write the lower id first)")
        if count is None:
            raise ValueError("needs DISCORD_SHARD_COUNT (the number of shards of the whole bot)")
        if high >= count:  # checked before the range is expanded (0-999999999 would fill the memory)
            raise ValueError(f"shard id {high} is not below DISCORD_SHARD_COUNT={count} (ids run 0 to {count - 1})")
        ids.update(range(low, high + 1))
    return tuple(sorted(ids))


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
AllowedTarget = tuple[Network, int | None]  # an address range, and the one port it may be reached on (None: any)


def parse_allow_private(raw: str) -> tuple[AllowedTarget, ...]:
    """Parse WEB_ALLOW_PRIVATE: `ip:port`, `[ipv6]:port`, `ip` or a CIDR such as `10.0.0.0/8`, comma-separated; an
    IPv4-mapped IPv6 address (::ffff:10.0.0.5) counts as the IPv4 address it holds."""
    targets: list[AllowedTarget] = []
    for part in raw.replace(";", ",").split(","):
        item = part.strip()
        if item:
            targets.append(_allowed_target(item))
    return tuple(targets)


def _allowed_target(item: str) -> AllowedTarget:
    """One entry of WEB_ALLOW_PRIVATE; ValueError (saying what is accepted) if it is none of the forms."""
    address, port = item, None
    if item.startswith("["):  # [ipv6]:port
        address, _, rest = item[1:].partition("]")
        port = _port(item, rest.removeprefix(":")) if rest.startswith(":") else _port(item, "")
    elif item.count(":") == 1:  # ipv4:port (an IPv6 address has two colons or more)
        address, _, given = item.partition(":")
        port = _port(item, given)
    try:
        network = ipaddress.ip_network(address, strict=False)
    except ValueError:
        raise ValueError(
            f"'{item}' is not an address, address:port or CIDR such as 127.0.0.1:8080, 10.0.0.5 or 192.168.0.0/16 "
            "(names are not accepted: the address a name resolves to is what is checked)"
        ) from None
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        mapped = network.network_address.ipv4_mapped
        if mapped is not None:
            network = ipaddress.ip_network(f"{mapped}/{network.prefixlen - 96}")
    return network, port


def _port(item: str, given: str) -> int:
    """The port of an `address:port` entry (1-65535)."""
    if not (given.isascii() and given.isdigit() and 1 <= int(given) <= 65535):
        raise ValueError(f"'{item}' has no port 1-65535 after its ':'")
    return int(given)


def http_parts(v: str) -> SplitResult | None:
    """The parts of an http(s) address with a host and no user@ (None: it is not one)."""
    try:
        parts = urlsplit(v.strip())
    except ValueError:  # e.g. an unclosed [IPv6 address
        return None
    return parts if parts.scheme in ("http", "https") and parts.hostname and "@" not in parts.netloc else None


class Settings(BaseSettings):
    """All settings of the bot; field names are the environment variable names."""

    model_config = SettingsConfigDict(env_file=".env", env_file_encoding="utf-8", extra="ignore")

    DATABASE_URL: SecretStr | None = None
    DATA_DIR: Path = Path(".data")
    LLM_PROVIDER: Provider = "openai"
    LLM_MODEL: str | None = None
    LLM_API_KEY: SecretStr | None = None
    LLM_BASE_URL: str | None = None
    LLM_MODELS: str = ""  # models a person may pick with /model: `model` or `provider:model`, comma-separated
    # keys of other providers, for the `provider:model` entries of LLM_MODELS (the configured one uses LLM_API_KEY)
    OPENAI_API_KEY: SecretStr | None = None
    ANTHROPIC_API_KEY: SecretStr | None = None
    GEMINI_API_KEY: SecretStr | None = None
    GROQ_API_KEY: SecretStr | None = None
    OPENROUTER_API_KEY: SecretStr | None = None
    TELEGRAM_BOT_TOKEN: SecretStr | None = None
    TELEGRAM_API_BASE_URL: str | None = None
    TELEGRAM_WEBHOOK_URL: str | None = None  # public https URL: webhook mode (served on PORT) instead of polling
    TELEGRAM_WEBHOOK_SECRET: SecretStr | None = None  # the webhook's secret_token; unset: derived from the bot token
    TELEGRAM_WEBHOOK_MAX_CONNECTIONS: int = Field(default=40, ge=1, le=100)  # Telegram's parallel webhook requests
    DISCORD_BOT_TOKEN: SecretStr | None = None
    DISCORD_API_BASE_URL: str | None = None
    DISCORD_GATEWAY_URL: str | None = None
    DISCORD_CHANNELS: str = ""  # channel ids where every message is a turn (no mention needed)
    DISCORD_SHARD_COUNT: int | None = Field(default=None, ge=1)  # gateway shards of the whole bot; unset: unsharded
    DISCORD_SHARD_IDS: str = ""  # the shards this process runs, e.g. 0,1 or 0-3; empty: all of them
    SLACK_BOT_TOKEN: SecretStr | None = None  # xoxb-…: the bot's Web API token
    SLACK_APP_TOKEN: SecretStr | None = None  # xapp-…: Socket Mode (no public URL); unset: the HTTP Events API
    SLACK_SIGNING_SECRET: SecretStr | None = None  # the HTTP Events API's signing secret (requests on PORT)
    SLACK_API_BASE_URL: str | None = None  # the Web API's base URL (tests point it at a fake)
    MATRIX_HOMESERVER: str | None = None  # the homeserver's client-server API URL, e.g. https://matrix.example.org
    MATRIX_USER_ID: str | None = None  # the bot's account, @assistant:example.org
    MATRIX_ACCESS_TOKEN: SecretStr | None = None  # the bot account's access token
    MATRIX_PASSWORD: SecretStr | None = None  # instead of the token: logged in once, the token kept in the database
    ADMINS: str = ""
    ALLOWED_USERS: str = ""
    DEFAULT_TIMEZONE: str = "UTC"
    AGENT_MAX_STEPS: int = Field(default=10, ge=1, le=100)
    AGENT_STEP_TIMEOUT: float = Field(default=60.0, gt=0)
    AGENT_TOTAL_TIMEOUT: float = Field(default=180.0, gt=0)
    HISTORY_MESSAGES: int = Field(default=40, ge=2, le=1000)
    REMINDER_GRACE_HOURS: float = Field(default=24.0, gt=0)
    CAPABILITY_TIMEOUT: float = Field(default=30.0, gt=0)
    MCP_CONFIG: Path | None = None  # JSON file of MCP tool servers (Claude Desktop format, docs/mcp.md); unset: none
    MCP_SCHEMA_TOKENS: int = Field(default=6000, ge=0)  # MCP tool schemas sent whole up to this; past it: mcp_search
    MEMORY_BLOCK_WORDS: int = Field(default=500, ge=10)  # word limit of one core memory block
    EMBEDDING_MODEL: str | None = None  # embeddings for archival search (same provider); unset: text search only
    # Voice notes (core/media/audio.py); an unset model is the provider's (PROVIDERS), none there: that part is off
    TRANSCRIPTION_MODEL: str | None = None  # speech to text (whisper-1 on openai, whisper-large-v3-turbo on groq)
    TRANSCRIPTION_BASE_URL: str | None = None  # another OpenAI-compatible server for it (e.g. a local whisper)
    TRANSCRIPTION_API_KEY: SecretStr | None = None  # that server's key (unset: LLM_API_KEY on the model's own server)
    SPEECH_MODEL: str | None = None  # text to speech for voice answers (tts-1 on openai), on the model's server
    VOICE_MAX_SECONDS: float = Field(default=300.0, gt=0)  # a longer voice note is refused before any upload
    LLM_VISION: Literal["auto", "on", "off"] = "auto"  # photos to the model as images (auto: until it refuses one)
    SHUTDOWN_GRACE_SECONDS: float = Field(default=25.0, ge=0)  # drain time for running answers on stop/restart
    HOST: str | None = None  # the HTTP server's address (bot serve --host); unset: loopback unless deployed publicly
    PORT: int = Field(default=8080, ge=0, le=65535)  # HTTP port (health, metrics); polling serves it only if set
    METRICS_TOKEN: SecretStr | None = None  # bearer token /metrics requires (webhook mode: required to serve it)
    PUBLIC_BASE_URL: str | None = None  # the bot's public http(s) address (/web links); unset: the webhook's origin
    # Limits of a bot open to everyone (ALLOWED_USERS=*): per account unless said otherwise.
    MAX_MESSAGE_CHARS: int = Field(default=16000, ge=100)  # a longer incoming message is refused, not stored
    MEDIA_MAX_MB: int = Field(default=200, ge=1)  # what the files one person sent may take here (transcripts, pages)
    API_REQUESTS_PER_MINUTE: int = Field(default=120, ge=1)  # HTTP API requests per token (or web sign-in) a minute
    API_STRANGER_REQUESTS_PER_MINUTE: int = Field(default=30, ge=1)  # API requests without a valid token, per address
    USER_MESSAGES_PER_MINUTE: int = Field(default=20, ge=1)  # past this, one polite note; the model is not called
    CHAT_MESSAGES_PER_MINUTE: int = Field(default=40, ge=1)  # the same for one chat (a group) as a whole
    MAX_OPEN_TASKS: int = Field(default=200, ge=1)  # open tasks and reminders per account
    JOB_MIN_INTERVAL_MINUTES: int = Field(default=15, ge=1)  # a repeating agent job runs at most this often
    ARCHIVAL_MAX_ENTRIES: int = Field(default=5000, ge=1)  # archival memory entries per account
    RETENTION_DAYS: int = Field(
        default=90, ge=1
    )  # reminder occurrences (delivered, failed, skipped) are kept this long
    # Model token budgets (core/accounts/usage.py): unset, no cap. An account's day ends at midnight in its time zone.
    USER_DAILY_TOKENS: int | None = Field(default=None, ge=1, lt=10**15)  # per account; /budget overrides
    USER_DAILY_WEB_CALLS: int = Field(default=200, ge=0, lt=10**9)  # web searches and fetches per person a day
    USER_MONTHLY_TOKENS: int | None = Field(default=None, ge=1, lt=10**15)  # per account, calendar month
    BOT_DAILY_TOKENS: int | None = Field(default=None, ge=1, lt=10**15)  # the whole bot, DEFAULT_TIMEZONE
    LLM_PRICE_INPUT: float | None = Field(default=None, ge=0)  # per million prompt tokens: usage shown in money
    LLM_PRICE_OUTPUT: float | None = Field(default=None, ge=0)  # per million completion tokens
    LLM_PRICE_CURRENCY: str = "USD"  # what the prices are in (shown after the amounts)
    # Fetching web pages (core/web/fetch.py, docs/web.md#safety)
    WEB_ALLOW_PRIVATE: str = ""  # private addresses a fetch may reach anyway: ip:port, ip or CIDR, comma-separated
    WEB_FETCH_MAX_MB: int = Field(default=5, ge=1)  # a larger page is refused (its decompressed size counts)
    # Web search (core/web/search.py, docs/web.md): the keys and SEARXNG_URL come before the provider, which checks them
    SEARXNG_URL: str | None = None  # the operator's SearXNG (its JSON API must be on: search.formats has json)
    BRAVE_API_KEY: SecretStr | None = None  # Brave Search API subscription token
    TAVILY_API_KEY: SecretStr | None = None  # Tavily API key (tvly-…)
    WEB_SEARCH_PROVIDER: SearchProvider | None = None  # unset: the first configured above, else duckduckgo
    LOG_LEVEL: Literal["DEBUG", "INFO", "WARNING", "ERROR"] | None = None  # DEBUG also shows start-up tracebacks

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, data: object) -> object:
        """An empty variable (`NAME=` in `.env` or the environment) is not set: its default applies (and an empty
        PORT leaves `serve_http` False)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (isinstance(v, str) and not v.strip())}
        return data

    @field_validator("LLM_PROVIDER", mode="before")
    @classmethod
    def _lower_provider(cls, v: object) -> object:
        """Accept the provider name in any case."""
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("WEB_SEARCH_PROVIDER", mode="before")
    @classmethod
    def _lower_search_provider(cls, v: object) -> object:
        """Accept the search provider's name in any case."""
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("WEB_SEARCH_PROVIDER")
    @classmethod
    def _check_search_provider(cls, v: SearchProvider | None, info: ValidationInfo) -> SearchProvider | None:
        """A provider chosen by name needs what it searches with: its URL or its key."""
        needs = {"searxng": "SEARXNG_URL", "brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY"}
        if v in needs and info.data.get(needs[v]) is None:
            example = {
                "searxng": "the address of your SearXNG, e.g. http://127.0.0.1:8888",
                "brave": "the key from api-dashboard.search.brave.com",
                "tavily": "the key from app.tavily.com, tvly-…",
            }[v]
            raise ValueError(f"{v} needs {needs[v]} ({example}); or choose duckduckgo, which needs none, or none")
        return v

    @field_validator("SEARXNG_URL")
    @classmethod
    def _check_searxng_url(cls, v: str | None) -> str | None:
        """An http(s) address without user@, query or fragment (a path is kept, for a proxy's prefix); no trailing
        slash."""
        if v is None:
            return v
        parts = http_parts(v)
        if parts is not None and not parts.query and not parts.fragment:
            return v.strip().rstrip("/")
        raise ValueError("must be the http(s) address of your SearXNG such as http://127.0.0.1:8888 (no user@, ?query)")

    @field_validator("LOG_LEVEL", mode="before")
    @classmethod
    def _upper_level(cls, v: object) -> object:
        """Accept the level in any case."""
        return v.strip().upper() if isinstance(v, str) else v

    @field_validator("ADMINS", "ALLOWED_USERS")
    @classmethod
    def _check_users(cls, v: str) -> str:
        """Reject malformed user lists at start-up."""
        parse_user_list(v)
        return v

    @field_validator("DISCORD_CHANNELS")
    @classmethod
    def _check_channels(cls, v: str) -> str:
        """Only comma-separated numeric channel ids."""
        parse_id_list(v)
        return v

    @field_validator("WEB_ALLOW_PRIVATE")
    @classmethod
    def _check_allow_private(cls, v: str) -> str:
        """Only addresses, address:port pairs and CIDRs."""
        parse_allow_private(v)
        return v

    @field_validator("DISCORD_SHARD_IDS")
    @classmethod
    def _check_shard_ids(cls, v: str, info: ValidationInfo) -> str:
        """Shard ids need DISCORD_SHARD_COUNT and must each be below it."""
        parse_shard_ids(v, info.data.get("DISCORD_SHARD_COUNT"))
        return v

    @field_validator("DEFAULT_TIMEZONE")
    @classmethod
    def _check_tz(cls, v: str) -> str:
        """Only IANA zone names are valid."""
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"'{v}' is not an IANA time zone such as Europe/Berlin") from None
        return v

    @field_validator("TELEGRAM_WEBHOOK_URL")
    @classmethod
    def _check_webhook_url(cls, v: str | None) -> str | None:
        """Telegram posts only to https (plain http is accepted for a local test server on loopback)."""
        if v is None:
            return v
        parts = urlsplit(v.strip())
        if parts.scheme == "https" and parts.hostname:
            return v.strip()
        if parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1"):
            return v.strip()
        raise ValueError(
            "must be the public https:// URL Telegram posts updates to (e.g. https://bot.example.com/telegram)"
        )

    @field_validator("PUBLIC_BASE_URL")
    @classmethod
    def _check_public_base_url(cls, v: str | None) -> str | None:
        """An http(s) address without query or fragment (a path is kept, for a proxy's prefix); no trailing slash."""
        if v is None:
            return v
        parts = urlsplit(v.strip())
        ok = parts.scheme in ("http", "https") and parts.hostname and parts.username is None
        if ok and not parts.query and not parts.fragment:
            return v.strip().rstrip("/")
        raise ValueError("must be an http(s) address such as https://bot.example.com (no ?query, #fragment or user@)")

    @field_validator("TRANSCRIPTION_BASE_URL")
    @classmethod
    def _check_transcription_url(cls, v: str | None) -> str | None:
        """An http(s) address without user@ (the key goes in TRANSCRIPTION_API_KEY)."""
        if v is None:
            return v
        if http_parts(v) is not None:
            return v.strip()
        raise ValueError(
            "must be the http(s) address of an OpenAI-compatible server such as http://127.0.0.1:8000/v1 "
            "(no user@: put a key in TRANSCRIPTION_API_KEY)"
        )

    @field_validator("USER_DAILY_TOKENS", "USER_MONTHLY_TOKENS", "BOT_DAILY_TOKENS", mode="before")
    @classmethod
    def _check_tokens(cls, v: object) -> object:
        """A token budget is a whole number (digits may be grouped: 20_000 or 20,000)."""
        if not isinstance(v, str):
            return v
        digits = v.strip().replace("_", "").replace(",", "")
        if not (digits.isascii() and digits.isdigit() and len(digits) < 16 and int(digits) >= 1):  # below 10**15
            raise ValueError(f"must be a whole number of tokens such as 200000 (got {v.strip()!r}; empty: no cap)")
        return int(digits)

    @field_validator("TELEGRAM_WEBHOOK_SECRET")
    @classmethod
    def _check_webhook_secret(cls, v: SecretStr | None) -> SecretStr | None:
        """Telegram's secret_token: 1-256 characters, only A-Z, a-z, 0-9, _ and -."""
        if v is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", v.get_secret_value()):
            raise ValueError("must be 1-256 characters of A-Z, a-z, 0-9, _ and - (Telegram's secret_token)")
        return v

    @property
    def model_off(self) -> bool:
        """No model on purpose (LLM_PROVIDER=none): commands, /remind, tasks and reminders only."""
        return self.LLM_PROVIDER == "none"

    @property
    def serve_http(self) -> bool:
        """Whether PORT was given (environment, `.env` or an override): polling mode serves HTTP only then."""
        return "PORT" in self.model_fields_set

    @property
    def webhook_secret(self) -> str:
        """The webhook's secret_token: TELEGRAM_WEBHOOK_SECRET, or one derived from the bot token (the same in every
        process, never logged)."""
        if self.TELEGRAM_WEBHOOK_SECRET is not None:
            return self.TELEGRAM_WEBHOOK_SECRET.get_secret_value()
        assert self.TELEGRAM_BOT_TOKEN is not None
        token = self.TELEGRAM_BOT_TOKEN.get_secret_value().encode()
        return hmac.new(token, b"telegram webhook secret_token", hashlib.sha256).hexdigest()

    @property
    def public_base_url(self) -> str | None:
        """Where people reach the bot over HTTP (the web page, /web links): PUBLIC_BASE_URL, else the origin of
        TELEGRAM_WEBHOOK_URL; None when neither is set."""
        if self.PUBLIC_BASE_URL is not None:
            return self.PUBLIC_BASE_URL
        if self.TELEGRAM_WEBHOOK_URL is None:
            return None
        parts = urlsplit(self.TELEGRAM_WEBHOOK_URL)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"

    @property
    def admins(self) -> frozenset[str]:
        """Admin keys (`platform:id`)."""
        return parse_user_list(self.ADMINS)

    @property
    def discord_channels(self) -> frozenset[int]:
        """Discord channels where every message is answered."""
        return parse_id_list(self.DISCORD_CHANNELS)

    @property
    def discord_shards(self) -> tuple[int, tuple[int, ...]] | None:
        """(shard count, the ids this process runs) when sharding is configured; None: one unsharded client."""
        if self.DISCORD_SHARD_COUNT is None:
            return None
        ids = parse_shard_ids(self.DISCORD_SHARD_IDS, self.DISCORD_SHARD_COUNT)
        return self.DISCORD_SHARD_COUNT, ids or tuple(range(self.DISCORD_SHARD_COUNT))

    @property
    def web_allow_private(self) -> tuple[AllowedTarget, ...]:
        """The private addresses (and ports) a page fetch may reach (WEB_ALLOW_PRIVATE)."""
        return parse_allow_private(self.WEB_ALLOW_PRIVATE)

    @property
    def allowed_users(self) -> frozenset[str]:
        """Allowed keys; admins are always allowed."""
        return parse_user_list(self.ALLOWED_USERS) | self.admins

    def provider_key(self, provider: str) -> SecretStr | None:
        """The key the operator set for another provider's models in LLM_MODELS (`<PROVIDER>_API_KEY`; None: unset,
        or a provider that has no such setting)."""
        key = getattr(self, f"{provider.upper()}_API_KEY", None) if provider in PROVIDER_NAMES else None
        return key if isinstance(key, SecretStr) else None

    def secret_values(self) -> list[str]:
        """Every secret value (tokens, keys, the database URL and its password), longest first."""
        given = (
            *(self.DATABASE_URL, self.LLM_API_KEY, self.TELEGRAM_BOT_TOKEN),
            *(self.DISCORD_BOT_TOKEN, self.SLACK_BOT_TOKEN, self.SLACK_APP_TOKEN, self.SLACK_SIGNING_SECRET),
            *(self.MATRIX_ACCESS_TOKEN, self.MATRIX_PASSWORD, self.METRICS_TOKEN, self.TRANSCRIPTION_API_KEY),
            *(self.BRAVE_API_KEY, self.TAVILY_API_KEY),
            *(self.provider_key(p) for p in PROVIDER_NAMES),
        )
        values = [s.get_secret_value() for s in given if s is not None]
        if self.TELEGRAM_BOT_TOKEN is not None:
            values.append(self.webhook_secret)  # given or derived
        if self.DATABASE_URL is not None:
            try:
                password = urlsplit(self.DATABASE_URL.get_secret_value()).password or ""
            except ValueError:  # not a URL at all: the whole value is redacted above
                password = ""
            values += [password, unquote(password)]
        return sorted({v for v in values if len(v) >= 3}, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    """`text` with every secret value replaced by `***`."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def error_line(err: ErrorDetails) -> str:
    """One validation error as `NAME: what is wrong (got 'value')`; a secret's value is never shown."""
    name = ".".join(str(p) for p in err["loc"]) or "settings"
    if err["type"] == "value_error":  # our own checks: the message already says what was given
        return f"{name}: {err['msg'].removeprefix('Value error, ')}"
    msg = err["msg"].replace("Input should be ", "must be ", 1)
    field = Settings.model_fields.get(name)
    if field is None or field.annotation in SECRET_TYPES or not isinstance(err["input"], str):
        return f"{name}: {msg}"
    return f"{name}: {msg} (got {err['input']!r})"


def load_settings(**overrides: object) -> Settings:
    """Load settings, turning validation errors into one clear line without secret values."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        raise SettingsError(error_line(e.errors()[0])) from None
