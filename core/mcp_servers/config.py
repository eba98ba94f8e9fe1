"""The MCP configuration file (MCP_CONFIG): Claude Desktop's `{"mcpServers": {...}}` plus our keys per server, read
into ServerConfig values; anything wrong is one SettingsError line naming the server and the key (docs/mcp.md)."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, NoReturn, cast
from urllib.parse import parse_qsl, urlsplit

from dotenv import dotenv_values

from core.constants import (
    MCP_CALL_TIMEOUT_S,
    MCP_CONFIG_MAX_BYTES,
    MCP_CONNECT_TIMEOUT_S,
    MCP_MAX_TIMEOUT_S,
    MCP_SERVER_NAME_CHARS,
)
from core.settings import Settings, SettingsError, parse_user_list

Access = Literal["admin", "everyone"] | frozenset[str]  # a set of identities "telegram:123", "discord:456"
Credentials = Literal["operator", "per_person", "none"]
Trust = Literal["trusted", "untrusted"]

KEYS = (
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "type",
    "transport",
    "enabled",
    "disabled",  # Claude Desktop's and Cursor's way of writing enabled: false
    "access",
    "credentials",
    "trust",
    "confirm",
    "tools",
    "timeout",
    "connect_timeout",
)
HINTS = {  # keys other clients use, and what to write here instead
    "include": 'write "tools": {"include": [...]}',
    "exclude": 'write "tools": {"exclude": [...]}',
}
TRANSPORTS = {"stdio": "stdio", "http": "http", "streamablehttp": "http", "sse": "sse"}
SERVER_NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{MCP_SERVER_NAME_CHARS}}}")
REFERENCE = re.compile(r"\$\{([^}]*)\}")  # ${NAME} or ${NAME:-default}
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_NAME = re.compile(r"token|key|secret|passw|authorization|credential|cookie", re.IGNORECASE)
AUTH_SCHEME = re.compile(r"^\s*(bearer|basic|token|bot)\b", re.IGNORECASE)  # "Bearer ${TOKEN}" is no literal
PLAIN_LABEL = re.compile(r"[\w.\-\[\]]{1,60}")


def _no_env() -> Mapping[str, str]:
    """An empty read-only mapping (the default env and headers)."""
    return MappingProxyType({})


@dataclass(frozen=True)
class ServerConfig:
    """One server of the file, checked; `${VAR}` references already replaced by their values."""

    name: str
    command: str | None = None  # stdio server: command, args, env, cwd
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=_no_env)  # ONLY these (+ connection.INHERITED_ENV) reach the child
    cwd: str | None = None
    url: str | None = None  # Streamable HTTP server: url, headers
    headers: Mapping[str, str] = field(default_factory=_no_env)
    enabled: bool = True
    access: Access = "admin"
    credentials: Credentials = "operator"
    trust: Trust = "untrusted"
    confirm: bool = True  # untrusted: tools that change things ask the person first
    include: tuple[str, ...] = ("*",)  # fnmatch globs on the server's tool names
    exclude: tuple[str, ...] = ()
    timeout: float = MCP_CALL_TIMEOUT_S  # one call
    connect_timeout: float = MCP_CONNECT_TIMEOUT_S


@dataclass(frozen=True)
class McpConfig:
    """The servers of the file in its order, and one line per thing the operator should fix (logged at start)."""

    servers: tuple[ServerConfig, ...]
    warnings: tuple[str, ...]


def _label(text: str) -> str:
    """A key of the file as an error line shows it: as it is when plain, else quoted (never a line break)."""
    return text if PLAIN_LABEL.fullmatch(text) else repr(text[:60])


def _fail(problem: str) -> NoReturn:
    """Stop with one line about the file as a whole."""
    raise SettingsError(f"MCP_CONFIG: {problem}") from None


def literal_secret(raw: str) -> bool:
    """Whether a value as written in the file holds more than `${VAR}` references (and an auth scheme such as
    Bearer): a default in `${VAR:-default}` counts as written in the file."""
    rest = REFERENCE.sub(lambda m: m.group(1).partition(":-")[2], raw)
    return bool(AUTH_SCHEME.sub("", rest).strip())


@dataclass
class _Server:
    """Reads one server's object; every error names the server and the key."""

    name: str
    raw: Mapping[str, Any]
    environ: Mapping[str, str]
    warnings: list[str]
    lenient: bool = False  # a disabled server: a missing variable reads as empty instead of stopping the bot

    def fail(self, key: str, problem: str) -> NoReturn:
        """Stop with `MCP_CONFIG: server 'name': key: problem`."""
        raise SettingsError(f"MCP_CONFIG: server {self.name!r}: {key}: {problem}") from None

    def warn(self, key: str, problem: str) -> None:
        """Note one line for the log at start."""
        self.warnings.append(f"MCP_CONFIG: server {self.name!r}: {key}: {problem}")

    def expand(self, key: str, value: str) -> str:
        """`value` with each `${NAME}` / `${NAME:-default}` replaced from the environment (an empty variable is
        unset, as in .env); the result is not expanded again."""

        def one(m: re.Match[str]) -> str:
            name, sep, default = m.group(1).partition(":-")
            if not VARIABLE.fullmatch(name):
                self.fail(key, "a ${…} that is not ${NAME} or ${NAME:-default}")
            found = self.environ.get(name, "")
            if found or sep or self.lenient:
                return found or default
            self.fail(key, f"${{{name}}} is not set (set {name} in the environment, or write ${{{name}:-default}})")

        if "${" in REFERENCE.sub("", value):
            self.fail(key, "a ${ without its closing }")
        return REFERENCE.sub(one, value)

    def text(self, key: str, value: object, *, empty: bool = False) -> str:
        """A string value, expanded."""
        if not isinstance(value, str):
            self.fail(key, "must be a string")
        out = self.expand(key, value)
        if not empty and not out.strip():
            self.fail(key, "is empty")
        return out

    def texts(self, key: str, value: object) -> tuple[str, ...]:
        """A list of strings, each expanded."""
        if not isinstance(value, list):
            self.fail(key, "must be a list of strings")
        return tuple(self.text(f"{key}[{i}]", v, empty=True) for i, v in enumerate(value))

    def table(self, key: str, value: object) -> Mapping[str, str]:
        """An object of strings (env, headers), each value expanded; a literal secret gets a warning."""
        if not isinstance(value, dict):
            self.fail(key, "must be an object of names and string values")
        out: dict[str, str] = {}
        for name, raw in value.items():
            where = f"{key}.{_label(name)}"
            if not name.strip() or "=" in name or "\0" in name:
                self.fail(key, "a name is empty or holds = or a NUL character")
            out[name] = self.text(where, raw, empty=True)
            if "\0" in out[name]:
                self.fail(where, "holds a NUL character")
            if SECRET_NAME.search(name) and literal_secret(raw):
                self.warn(where, "a secret written into the file; write ${NAME} there and set NAME in the environment")
        return MappingProxyType(out)

    def flag(self, key: str, default: bool) -> bool:
        """A true/false value."""
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, "must be true or false")
        return value

    def enabled(self) -> bool:
        """`enabled`, or `disabled` (true: off) as other clients write it; both given must agree."""
        enabled = self.flag("enabled", True)
        if "disabled" not in self.raw:
            return enabled
        disabled = self.flag("disabled", False)
        if "enabled" in self.raw and enabled == disabled:
            self.fail("disabled", "says the opposite of enabled: keep one of them")
        return not disabled

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        """One of `options` (any case; - for _)."""
        value = self.raw.get(key, default)
        word = self.text(key, value).strip().lower().replace("-", "_") if isinstance(value, str) else None
        if word not in options:
            self.fail(key, f"must be {' or '.join(options)}")
        return word

    def seconds(self, key: str, default: float) -> float:
        """A number of seconds above 0 and at most MCP_MAX_TIMEOUT_S."""
        value = self.raw.get(key, default)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not 0 < value <= MCP_MAX_TIMEOUT_S:
            self.fail(key, f"must be a number of seconds above 0 and at most {MCP_MAX_TIMEOUT_S:g}, such as 30")
        return float(value)

    def transport(self) -> str | None:
        """`type` / `transport` as some configs carry it: stdio or http (None: not given)."""
        given = {k: self.raw[k] for k in ("type", "transport") if k in self.raw}
        kinds: set[str] = set()
        for key, value in given.items():
            word = re.sub(r"[-_\s]", "", value.lower()) if isinstance(value, str) else ""
            if word not in TRANSPORTS:
                self.fail(key, "must be stdio or http (Streamable HTTP)")
            if TRANSPORTS[word] == "sse":
                self.fail(
                    key,
                    "sse (the old HTTP+SSE transport) is not supported: use the server's Streamable HTTP "
                    "address (often /mcp instead of /sse) with type http",
                )
            kinds.add(TRANSPORTS[word])
        if len(kinds) > 1:
            self.fail("type", "type and transport disagree")
        return kinds.pop() if kinds else None

    def access(self) -> Access:
        """admin, everyone or a list of identities."""
        value = self.raw.get("access", "admin")
        wrong = "must be admin, everyone or a list of identities such as telegram:123"
        if isinstance(value, str):
            word = self.text("access", value).strip().lower()
            if word not in ("admin", "everyone"):
                self.fail("access", wrong)
            return cast(Literal["admin", "everyone"], word)
        if not isinstance(value, list) or not value:
            self.fail("access", wrong)
        people: set[str] = set()
        for i, item in enumerate(value):
            try:
                keys = parse_user_list(self.text(f"access[{i}]", item))
            except ValueError as e:
                self.fail(f"access[{i}]", str(e))
            if len(keys) != 1 or "*" in keys:
                self.fail(
                    f"access[{i}]", "one identity such as telegram:123 per entry (everyone: write access everyone)"
                )
            people |= keys
        return frozenset(people)

    def tools(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """`tools`: {"include": globs, "exclude": globs}."""
        value = self.raw.get("tools", {})
        if not isinstance(value, dict):
            self.fail("tools", 'must be an object such as {"include": ["read_*"], "exclude": ["delete_*"]}')
        unknown = sorted(set(value) - {"include", "exclude"})
        if unknown:
            self.fail(f"tools.{_label(unknown[0])}", "unknown key (tools takes include and exclude)")
        include = self.texts("tools.include", value.get("include", ["*"]))
        exclude = self.texts("tools.exclude", value.get("exclude", []))
        if not include:
            self.fail("tools.include", 'lists no tool (write "enabled": false to turn the server off)')
        for key, globs in (("tools.include", include), ("tools.exclude", exclude)):
            if any(not g.strip() for g in globs):
                self.fail(key, "an empty glob")
        return include, exclude

    def url(self) -> str:
        """An http(s) address; a secret in its query or user part gets a warning."""
        raw = self.raw["url"]
        value = self.text("url", raw).strip()
        try:
            parts = urlsplit(value)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            ok = False
        if not ok:
            self.fail("url", "must be an http(s) address such as https://mcp.example.com/mcp")
        try:
            written = urlsplit(raw)
            password, query = written.password, parse_qsl(written.query)
        except ValueError:  # the address as written (before ${VAR}) is no URL: nothing to judge
            password, query = None, []
        secret_query = any(SECRET_NAME.search(k) and literal_secret(v) for k, v in query)
        if secret_query or (password and literal_secret(password)):
            self.warn("url", "a secret written into the file; write ${NAME} there and set NAME in the environment")
        return value

    def read(self) -> ServerConfig:
        """The whole server, checked."""
        unknown = sorted(set(self.raw) - set(KEYS))
        if unknown:
            shown = ", ".join(_label(k) for k in unknown)
            hint = "; ".join(HINTS[k] for k in unknown if k in HINTS) or "the keys are listed in docs/mcp.md"
            self.fail(shown, f"unknown key ({hint})")
        enabled = self.enabled()
        self.lenient = not enabled
        kind = self.transport()
        has_command, has_url = "command" in self.raw, "url" in self.raw
        if has_command and has_url:
            self.fail("url", "give either command (a stdio server) or url (a Streamable HTTP server), not both")
        if not has_command and not has_url:
            self.fail("command", "missing: give command (a stdio server) or url (a Streamable HTTP server)")
        if kind == "stdio" and not has_command:
            self.fail("type", "stdio needs command, not url")
        if kind == "http" and not has_url:
            self.fail("type", "http needs url, not command")
        wrong_side = ("headers",) if has_command else ("args", "env", "cwd")
        for key in wrong_side:
            if key in self.raw:
                side = "only for a url server" if has_command else "only for a command (stdio) server"
                self.fail(key, side)
        include, exclude = self.tools()
        config = ServerConfig(
            name=self.name,
            command=self.text("command", self.raw["command"]) if has_command else None,
            args=self.texts("args", self.raw.get("args", [])),
            env=self.table("env", self.raw.get("env", {})),
            cwd=self.text("cwd", self.raw["cwd"]) if "cwd" in self.raw else None,
            url=self.url() if has_url else None,
            headers=self.table("headers", self.raw.get("headers", {})),
            enabled=enabled,
            access=self.access(),
            credentials=cast(Credentials, self.choice("credentials", ("operator", "per_person", "none"), "operator")),
            trust=cast(Trust, self.choice("trust", ("trusted", "untrusted"), "untrusted")),
            confirm=self.flag("confirm", True),
            include=include,
            exclude=exclude,
            timeout=self.seconds("timeout", MCP_CALL_TIMEOUT_S),
            connect_timeout=self.seconds("connect_timeout", MCP_CONNECT_TIMEOUT_S),
        )
        for name, value in config.headers.items():
            if "\r" in value or "\n" in value:
                self.fail(f"headers.{_label(name)}", "holds a line break")
        self.check_sharing(config)
        return config

    def check_sharing(self, config: ServerConfig) -> None:
        """The operator's credentials are for admins only: a server open to others holds none of them."""
        if config.access == "admin":
            return
        who = "everyone" if config.access == "everyone" else "a list of people"
        if config.credentials == "operator":
            self.fail(
                "access",
                f"{who} needs credentials per_person (each person connects their own account) or none (a server "
                "that holds no credentials): the operator's credentials are for admins only",
            )
        for key, table in (("env", config.env), ("headers", config.headers)):
            for name in table:
                if SECRET_NAME.search(name):
                    self.fail(
                        f"{key}.{_label(name)}",
                        f"looks like a credential, but access is {who} with credentials {config.credentials}: "
                        "the operator's credentials are for admins only (use access admin)",
                    )


def _read_file(path: Path) -> str:
    """The file's text; a missing, unreadable, huge or non-UTF-8 file is one line."""
    try:
        size = path.stat().st_size
        if path.is_dir():
            _fail(f"{path} is a directory, not a JSON file")
        if size > MCP_CONFIG_MAX_BYTES:
            _fail(f"{path} is {size} bytes (at most {MCP_CONFIG_MAX_BYTES}: it lists servers, not data)")
        return path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        _fail(f"no such file {path}")
    except PermissionError:
        _fail(f"{path} cannot be read (permission denied)")
    except UnicodeDecodeError:
        _fail(f"{path} is not UTF-8 text")
    except OSError as e:
        _fail(f"{path} cannot be read ({e.strerror or type(e).__name__})")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (JSON would silently keep the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            _fail(f"{_label(key)} appears twice in the same object (only one would count: remove the other)")
        out[key] = value
    return out


def _no_constant(word: str) -> NoReturn:
    """NaN and Infinity are not JSON."""
    _fail(f"{word} is not a JSON value")


def _parse(text: str, path: Path) -> object:
    """The JSON document; a syntax error is one line with its line and column."""
    hook: Callable[[list[tuple[str, Any]]], dict[str, Any]] = _no_duplicates
    try:
        return json.loads(text, object_pairs_hook=hook, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        _fail(f"{path} is not valid JSON: line {e.lineno}, column {e.colno}: {e.msg}")
    except RecursionError:
        _fail(f"{path} is nested too deeply")


def load_mcp_config(path: Path, environ: Mapping[str, str]) -> McpConfig:
    """Read and check MCP_CONFIG; `${VAR}` references come from `environ`. SettingsError: one line naming the server
    and the key, e.g. "MCP_CONFIG: server 'mail': access: must be admin, everyone or a list of identities …"."""
    document = _parse(_read_file(path), path)
    shape = '{"mcpServers": {"name": {"command": ...} or {"url": ...}}} (the Claude Desktop format)'
    if not isinstance(document, dict):
        _fail(f"the file must hold one JSON object such as {shape}")
    if "mcpServers" not in document:
        _fail(f'no "mcpServers" object: write {shape}')
    servers = document["mcpServers"]
    if not isinstance(servers, dict):
        _fail(f'"mcpServers" must be an object such as {shape}')
    warnings = [
        f"MCP_CONFIG: the top-level key {_label(key)} is ignored (only mcpServers is read)"
        for key in document
        if key != "mcpServers"
    ]
    seen: dict[str, str] = {}
    out: list[ServerConfig] = []
    for name, raw in servers.items():
        if not SERVER_NAME.fullmatch(name):
            _fail(
                f"server {name[:60]!r}: the name may hold only letters, digits, _ and - "
                f"(1 to {MCP_SERVER_NAME_CHARS} of them; it becomes part of the tool names)"
            )
        if name.lower() in seen:
            _fail(f"servers {seen[name.lower()]!r} and {name!r} differ only in case (their tool names would clash)")
        seen[name.lower()] = name
        if not isinstance(raw, dict):
            _fail(f'server {name!r}: must be an object such as {{"command": "npx", "args": [...]}}')
        out.append(_Server(name, raw, environ, warnings).read())
    return McpConfig(servers=tuple(out), warnings=tuple(warnings))


def mcp_config_problem(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """One line when MCP_CONFIG is set and its file is wrong (for the check at start), else None."""
    if settings.MCP_CONFIG is None:
        return None
    try:
        load_mcp_config(settings.MCP_CONFIG, environ)
    except SettingsError as e:
        return str(e)
    return None


def environment(env_file: Path = Path(".env")) -> dict[str, str]:
    """What `${VAR}` in MCP_CONFIG is read from: the process's environment over the .env file the settings read."""
    from_file = {k: v for k, v in dotenv_values(env_file).items() if v is not None} if env_file.is_file() else {}
    return {**from_file, **os.environ}


def variables(path: Path) -> frozenset[str]:
    """The names the file's `${NAME}` / `${NAME:-default}` read (none when it cannot be read: the check says why)."""
    try:
        text = _read_file(path)
    except SettingsError:
        return frozenset()
    return frozenset(m.group(1).partition(":-")[0] for m in REFERENCE.finditer(text))
