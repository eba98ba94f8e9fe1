"""MCP_CONFIG: Claude Desktop files load unchanged, our keys beside them, ${VAR} from the environment, and every wrong
file is one line naming the server and the key (never a traceback, never a secret's value)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.mcp_servers.config import McpConfig, ServerConfig, load_mcp_config, mcp_config_problem
from core.settings import Settings, SettingsError

SECRET = "sk-live-0123456789"


def write(tmp_path: Path, servers: dict[str, Any], **top: Any) -> Path:
    """A config file with these servers (and any other top-level keys)."""
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers, **top}), encoding="utf-8")
    return path


def load(tmp_path: Path, servers: dict[str, Any], environ: dict[str, str] | None = None) -> McpConfig:
    """Write and load."""
    return load_mcp_config(write(tmp_path, servers), environ or {})


def error(tmp_path: Path, servers: dict[str, Any], environ: dict[str, str] | None = None) -> str:
    """The one line a wrong file gives."""
    with pytest.raises(SettingsError) as e:
        load(tmp_path, servers, environ)
    line = str(e.value)
    assert "\n" not in line and line.startswith("MCP_CONFIG: ")
    assert e.value.__suppress_context__  # no chained traceback behind the line
    return line


def only(config: McpConfig) -> ServerConfig:
    """The file's single server."""
    assert len(config.servers) == 1
    return config.servers[0]


def test_a_claude_desktop_file_loads_unchanged(tmp_path: Path) -> None:
    """The format people already have: a stdio server and a url server, nothing of ours; our defaults apply."""
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(
        """{
  "mcpServers": {
    "filesystem": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/shared"],
      "env": {"LOG": "1"}
    },
    "notion": {"url": "https://mcp.notion.com/mcp", "headers": {"X-Client": "bot"}}
  }
}""",
        encoding="utf-8",
    )
    config = load_mcp_config(path, {})
    fs, notion = config.servers
    assert (fs.name, fs.command, fs.args, dict(fs.env), fs.url) == (
        "filesystem",
        "npx",
        ("-y", "@modelcontextprotocol/server-filesystem", "/srv/shared"),
        {"LOG": "1"},
        None,
    )
    assert (notion.name, notion.url, dict(notion.headers), notion.command) == (
        "notion",
        "https://mcp.notion.com/mcp",
        {"X-Client": "bot"},
        None,
    )
    for server in (fs, notion):
        assert (server.enabled, server.access, server.credentials, server.trust, server.confirm) == (
            True,
            "admin",
            "operator",
            "untrusted",
            True,
        )
        assert (server.include, server.exclude, server.timeout, server.connect_timeout) == (("*",), (), 30.0, 10.0)
    assert config.warnings == ()


@pytest.mark.parametrize("kind", ["stdio", "http", "streamable-http", "streamableHttp"])
def test_the_transport_keys_other_clients_write_are_accepted(tmp_path: Path, kind: str) -> None:
    """`type` (or `transport`) as Claude Code, Cursor or VS Code configs carry it."""
    server = {"command": "srv"} if kind == "stdio" else {"url": "http://127.0.0.1:9000/mcp"}
    assert only(load(tmp_path, {"s": {"type": kind, **server}})).name == "s"
    assert only(load(tmp_path, {"s": {"transport": kind, **server}})).name == "s"


def test_our_keys_are_read(tmp_path: Path) -> None:
    """enabled, access, credentials, trust, confirm, tools, timeout, connect_timeout, cwd."""
    config = load(
        tmp_path,
        {
            "mail": {
                "url": "https://mail.example.com/mcp",
                "enabled": False,
                "access": "everyone",
                "credentials": "per_person",
                "trust": "trusted",
                "confirm": False,
                "tools": {"include": ["read_*", "search"], "exclude": ["read_secret*"]},
                "timeout": 5,
                "connect_timeout": 2.5,
            },
            "files": {"command": "fs-server", "cwd": "/srv", "access": "everyone", "credentials": "none"},
        },
    )
    mail, files = config.servers
    assert (mail.enabled, mail.access, mail.credentials, mail.trust, mail.confirm) == (
        False,
        "everyone",
        "per_person",
        "trusted",
        False,
    )
    assert (mail.include, mail.exclude, mail.timeout, mail.connect_timeout) == (
        ("read_*", "search"),
        ("read_secret*",),
        5.0,
        2.5,
    )
    assert (files.cwd, files.credentials, files.include) == ("/srv", "none", ("*",))


def test_access_may_list_identities(tmp_path: Path) -> None:
    """A list of `platform:id` identities becomes a set of them."""
    server = only(
        load(
            tmp_path,
            {
                "cal": {
                    "url": "https://cal.example/mcp",
                    "access": ["telegram:123", " Discord:456 "],
                    "credentials": "none",
                }
            },
        )
    )
    assert server.access == frozenset({"telegram:123", "discord:456"})


@pytest.mark.parametrize(
    ("access", "line"),
    [
        (
            "friends",
            "MCP_CONFIG: server 'mail': access: must be admin, everyone or a list of identities such as telegram:123",
        ),
        (["telegram"], "MCP_CONFIG: server 'mail': access[0]: 'telegram' is not of the form platform:id"),
        (["*"], "MCP_CONFIG: server 'mail': access[0]: one identity such as telegram:123 per entry"),
    ],
)
def test_a_wrong_access_is_one_line(tmp_path: Path, access: object, line: str) -> None:
    """What the plan promises, word for word."""
    got = error(tmp_path, {"mail": {"url": "https://m.example/mcp", "access": access, "credentials": "none"}})
    assert got.startswith(line)


def test_everyone_with_the_operators_credentials_is_refused(tmp_path: Path) -> None:
    """The issue's rule: `everyone` needs per_person credentials or none (credentials default to the operator's)."""
    line = error(tmp_path, {"mail": {"url": "https://m.example/mcp", "access": "everyone"}})
    assert line.startswith("MCP_CONFIG: server 'mail': access: everyone needs credentials per_person")
    assert "admins only" in line
    line = error(tmp_path, {"mail": {"command": "m", "access": ["telegram:1"], "credentials": "operator"}})
    assert line.startswith("MCP_CONFIG: server 'mail': access: a list of people needs credentials per_person")


def test_a_server_open_to_others_carries_no_credential(tmp_path: Path) -> None:
    """`credentials: none` next to the operator's token in the headers is still the operator's token."""
    line = error(
        tmp_path,
        {
            "search": {
                "url": "https://s.example/mcp",
                "access": "everyone",
                "credentials": "none",
                "headers": {"Authorization": "Bearer ${SEARCH_TOKEN}"},
            }
        },
        {"SEARCH_TOKEN": SECRET},
    )
    assert line.startswith("MCP_CONFIG: server 'search': headers.Authorization: looks like a credential")
    assert SECRET not in line


def test_variables_come_from_the_environment_given(tmp_path: Path) -> None:
    """${VAR} in any string value; ${VAR:-default} when unset or empty; the value is not expanded again."""
    server = only(
        load(
            tmp_path,
            {
                "notion": {
                    "url": "https://${HOST}/mcp",
                    "headers": {"Authorization": "Bearer ${NOTION_TOKEN}", "X-Region": "${REGION:-eu}"},
                }
            },
            {"HOST": "notion.example", "NOTION_TOKEN": SECRET},
        )
    )
    assert server.url == "https://notion.example/mcp"
    assert dict(server.headers) == {"Authorization": f"Bearer {SECRET}", "X-Region": "eu"}
    files = only(
        load(
            tmp_path,
            {
                "files": {
                    "command": "${NPX:-npx}",
                    "args": ["-y", "server", "${ROOT}/shared", "${EMPTY:-fallback}"],
                    "env": {"DEPTH": "${DEPTH:-3}", "NESTED": "${NESTED}"},
                }
            },
            {"ROOT": "/srv", "EMPTY": "", "NESTED": "${ROOT}"},
        )
    )
    assert (files.command, files.args) == ("npx", ("-y", "server", "/srv/shared", "fallback"))
    assert dict(files.env) == {"DEPTH": "3", "NESTED": "${ROOT}"}


def test_a_missing_variable_is_one_line_naming_server_and_key(tmp_path: Path) -> None:
    """Unset (or empty, as in .env) without a default: the bot does not start, and the line says what to set."""
    servers = {"notion": {"url": "https://n.example/mcp", "headers": {"Authorization": "Bearer ${NOTION_TOKEN}"}}}
    line = error(tmp_path, servers, {"NOTION_TOKEN": ""})
    assert line == (
        "MCP_CONFIG: server 'notion': headers.Authorization: ${NOTION_TOKEN} is not set "
        "(set NOTION_TOKEN in the environment, or write ${NOTION_TOKEN:-default})"
    )
    line = error(tmp_path, {"fs": {"command": "npx", "args": ["${ROOT}"]}})
    assert line.startswith("MCP_CONFIG: server 'fs': args[0]: ${ROOT} is not set")
    line = error(tmp_path, {"fs": {"command": "npx", "args": ["${ROOT"]}})
    assert line == "MCP_CONFIG: server 'fs': args[0]: a ${ without its closing }"
    line = error(tmp_path, {"fs": {"command": "npx", "args": ["${1X}"]}})
    assert line == "MCP_CONFIG: server 'fs': args[0]: a ${…} that is not ${NAME} or ${NAME:-default}"


def test_a_disabled_server_needs_no_variables(tmp_path: Path) -> None:
    """Turning a server off is how an operator parks one whose token they don't have yet."""
    server = only(load(tmp_path, {"fs": {"command": "npx", "env": {"TOKEN": "${TOKEN}"}, "enabled": False}}))
    assert (server.enabled, dict(server.env)) == (False, {"TOKEN": ""})


def test_disabled_as_other_clients_write_it_is_read(tmp_path: Path) -> None:
    """Issue 31, 6: Claude Desktop's `"disabled": false` loads; true parks the server; disagreeing with enabled is one
    line."""
    on = only(load(tmp_path, {"fs": {"command": "npx", "disabled": False}}))
    off = only(load(tmp_path, {"fs": {"command": "npx", "env": {"T": "${T}"}, "disabled": True}}))
    both = only(load(tmp_path, {"fs": {"command": "npx", "disabled": True, "enabled": False}}))
    assert (on.enabled, off.enabled, dict(off.env), both.enabled) == (True, False, {"T": ""}, False)
    line = error(tmp_path, {"fs": {"command": "npx", "disabled": True, "enabled": True}})
    assert line == "MCP_CONFIG: server 'fs': disabled: says the opposite of enabled: keep one of them"
    line = error(tmp_path, {"fs": {"command": "npx", "disabled": "yes"}})
    assert line == "MCP_CONFIG: server 'fs': disabled: must be true or false"


def test_a_literal_secret_gets_a_warning_and_a_variable_none(tmp_path: Path) -> None:
    """Keys that look like secrets, in env, headers and the url: a written value is a warning (its value never in
    the line); ${VAR}, `Bearer ${VAR}` and non-secret keys are not."""
    config = load(
        tmp_path,
        {
            "a": {"command": "x", "env": {"API_KEY": SECRET, "GITHUB_TOKEN": "${GH}", "LOG_LEVEL": "debug"}},
            "b": {"url": "https://b.example/mcp", "headers": {"Authorization": f"Bearer {SECRET}"}},
            "c": {"url": "https://c.example/mcp", "headers": {"Authorization": "Bearer ${C_TOKEN}"}},
            "d": {"url": f"https://d.example/mcp?api_key={SECRET}"},
            "e": {"command": "x", "env": {"DB_PASSWORD": "${DB_PASSWORD:-hunter2}"}},
        },
        {"GH": "g", "C_TOKEN": "c"},
    )
    assert len(config.warnings) == 4
    assert config.warnings[0] == (
        "MCP_CONFIG: server 'a': env.API_KEY: a secret written into the file; write ${NAME} there and set NAME in "
        "the environment"
    )
    assert [w.split(":")[1] for w in config.warnings] == [" server 'a'", " server 'b'", " server 'd'", " server 'e'"]
    assert all(SECRET not in w and "\n" not in w for w in config.warnings)
    quiet = load(
        tmp_path, {"c": {"url": "https://c.example/mcp", "headers": {"Authorization": "Bearer ${T}"}}}, {"T": "t"}
    )
    assert quiet.warnings == ()


def test_unknown_keys_are_named(tmp_path: Path) -> None:
    """A typo is not silently ignored; keys of other clients get a hint."""
    line = error(tmp_path, {"fs": {"command": "npx", "acess": "everyone"}})
    assert line == "MCP_CONFIG: server 'fs': acess: unknown key (the keys are listed in docs/mcp.md)"
    line = error(tmp_path, {"fs": {"command": "npx", "include": ["a*"]}})
    assert line == 'MCP_CONFIG: server \'fs\': include: unknown key (write "tools": {"include": [...]})'
    line = error(tmp_path, {"fs": {"command": "npx", "tools": {"include": ["*"], "allow": ["x"]}}})
    assert line == "MCP_CONFIG: server 'fs': tools.allow: unknown key (tools takes include and exclude)"


def test_bad_json_is_one_line_with_line_and_column(tmp_path: Path) -> None:
    """The parser's position, not a traceback."""
    path = tmp_path / "mcp.json"
    path.write_text('{\n  "mcpServers": {\n    "fs": {"command": "npx",}\n  }\n}\n', encoding="utf-8")
    with pytest.raises(SettingsError) as e:
        load_mcp_config(path, {})
    assert (
        str(e.value)
        == f"MCP_CONFIG: {path} is not valid JSON: line 3, column 29: Expecting property name enclosed in double quotes"
    )


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('{"servers": {}}', 'MCP_CONFIG: no "mcpServers" object: write {"mcpServers"'),
        ("[]", "MCP_CONFIG: the file must hold one JSON object"),
        ('{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}', "MCP_CONFIG: a appears twice"),
        ('{"mcpServers": {"a": {"command": "x", "timeout": NaN}}}', "MCP_CONFIG: NaN is not a JSON value"),
    ],
)
def test_a_wrong_document_is_one_line(tmp_path: Path, text: str, line: str) -> None:
    """The whole file's shape."""
    path = tmp_path / "mcp.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SettingsError) as e:
        load_mcp_config(path, {})
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_a_missing_or_unreadable_file_is_one_line(tmp_path: Path) -> None:
    """The path named, no traceback."""
    with pytest.raises(SettingsError, match=r"^MCP_CONFIG: no such file .*nope\.json$"):
        load_mcp_config(tmp_path / "nope.json", {})
    with pytest.raises(SettingsError, match=r"^MCP_CONFIG: .* is a directory, not a JSON file$"):
        load_mcp_config(tmp_path, {})
    (tmp_path / "latin1.json").write_bytes(b'{"mcpServers": {"\xe9": {}}}')
    with pytest.raises(SettingsError, match=r"^MCP_CONFIG: .*latin1\.json is not UTF-8 text$"):
        load_mcp_config(tmp_path / "latin1.json", {})


def test_sse_is_refused_with_a_clear_line(tmp_path: Path) -> None:
    """The old HTTP+SSE transport: the line says what to use instead."""
    line = error(tmp_path, {"old": {"type": "sse", "url": "https://old.example/sse"}})
    assert line == (
        "MCP_CONFIG: server 'old': type: sse (the old HTTP+SSE transport) is not supported: use the server's "
        "Streamable HTTP address (often /mcp instead of /sse) with type http"
    )


@pytest.mark.parametrize(
    ("server", "line"),
    [
        ({}, "MCP_CONFIG: server 's': command: missing: give command (a stdio server) or url"),
        ({"command": "x", "url": "https://x/mcp"}, "MCP_CONFIG: server 's': url: give either command"),
        ({"type": "stdio", "url": "https://x/mcp"}, "MCP_CONFIG: server 's': type: stdio needs command"),
        ({"command": "x", "headers": {"A": "b"}}, "MCP_CONFIG: server 's': headers: only for a url server"),
        ({"url": "https://x/mcp", "env": {"A": "b"}}, "MCP_CONFIG: server 's': env: only for a command (stdio)"),
        ({"url": "ftp://x/mcp"}, "MCP_CONFIG: server 's': url: must be an http(s) address"),
        ({"command": "x", "args": "-y pkg"}, "MCP_CONFIG: server 's': args: must be a list of strings"),
        ({"command": "x", "args": ["-y", 3]}, "MCP_CONFIG: server 's': args[1]: must be a string"),
        ({"command": "x", "timeout": 30000}, "MCP_CONFIG: server 's': timeout: must be a number of seconds above 0"),
        ({"command": "x", "timeout": True}, "MCP_CONFIG: server 's': timeout: must be a number of seconds"),
        ({"command": "x", "trust": "yes"}, "MCP_CONFIG: server 's': trust: must be trusted or untrusted"),
        ({"command": "x", "credentials": "mine"}, "MCP_CONFIG: server 's': credentials: must be operator or"),
        ({"command": "x", "enabled": "no"}, "MCP_CONFIG: server 's': enabled: must be true or false"),
        ({"command": "x", "tools": {"include": []}}, "MCP_CONFIG: server 's': tools.include: lists no tool"),
        ({"command": "x", "env": {"A=B": "c"}}, "MCP_CONFIG: server 's': env: a name is empty or holds ="),
    ],
)
def test_each_wrong_key_is_one_line_naming_it(tmp_path: Path, server: dict[str, Any], line: str) -> None:
    """Server and key named; what to write instead said."""
    assert error(tmp_path, {"s": server}).startswith(line)


def test_server_names_fit_into_tool_names(tmp_path: Path) -> None:
    """Letters, digits, _ and -, at most 32; two names differing only in case would clash."""
    assert error(tmp_path, {"my server": {"command": "x"}}).startswith(
        "MCP_CONFIG: server 'my server': the name may hold only letters, digits, _ and -"
    )
    assert error(tmp_path, {"x" * 33: {"command": "x"}}).startswith("MCP_CONFIG: server 'xxxx")
    assert error(tmp_path, {"Mail": {"command": "x"}, "mail": {"command": "y"}}) == (
        "MCP_CONFIG: servers 'Mail' and 'mail' differ only in case (their tool names would clash)"
    )
    assert only(load(tmp_path, {"a-b_C9": {"command": "x"}})).name == "a-b_C9"


def test_globs_are_kept_as_written(tmp_path: Path) -> None:
    """include / exclude reach the connection unchanged, in order."""
    server = only(
        load(
            tmp_path,
            {"gh": {"command": "x", "tools": {"include": ["get_*", "list_?", "[ab]*"], "exclude": ["*_delete"]}}},
        )
    )
    assert (server.include, server.exclude) == (("get_*", "list_?", "[ab]*"), ("*_delete",))


def test_a_stdio_server_gets_exactly_the_env_the_file_names(tmp_path: Path) -> None:
    """Nothing of the bot's environment rides along: the config carries only the file's variables (a ${VAR} the file
    names is the one way to pass one on), and the mapping cannot be changed afterwards."""
    environ = {"TELEGRAM_BOT_TOKEN": SECRET, "DATABASE_URL": "postgresql://u:p@h/db", "ROOT": "/srv", "PATH": "/bin"}
    server = only(load(tmp_path, {"fs": {"command": "npx", "env": {"ROOT_DIR": "${ROOT}", "MODE": "ro"}}}, environ))
    assert dict(server.env) == {"ROOT_DIR": "/srv", "MODE": "ro"}
    bare = only(load(tmp_path, {"fs": {"command": "npx"}}, environ))
    assert dict(bare.env) == {} and dict(bare.headers) == {}
    with pytest.raises(TypeError):
        server.env["EXTRA"] = "x"  # type: ignore[index]


def test_the_check_at_start_is_one_line_or_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mcp_config_problem: None without MCP_CONFIG or with a good file, else the line."""
    monkeypatch.chdir(tmp_path)  # no .env of the working directory
    assert mcp_config_problem(Settings(MCP_CONFIG=None), {}) is None
    good = write(tmp_path, {"fs": {"command": "npx"}})
    assert mcp_config_problem(Settings(MCP_CONFIG=good), {}) is None
    problem = mcp_config_problem(Settings(MCP_CONFIG=tmp_path / "missing.json"), {})
    assert problem is not None and problem.startswith("MCP_CONFIG: no such file ")
