"""A misspelt setting would be ignored in silence (`TELEGRAM_TOKEN=…`, `LLM_PROVIDR=groq`): at start, every name in
`.env` and every environment variable with one of the bot's prefixes that the bot does not read gets one warning line,
with the closest name it knows. A value is never shown (it may be a secret)."""

from __future__ import annotations

import difflib
import re
import sys
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

from dotenv import dotenv_values

from bot.remote import TOKEN_ENV
from core import Settings, mcp_variables

# Named in DESIGN §2 for issues not built yet: known, so not warned about (move a name to Settings when it is built).
NOT_BUILT_YET: frozenset[str] = frozenset()
READ_BY_THE_BOT = frozenset({TOKEN_ENV, "BOT_COMMAND", "BOT_RESTART_DELAY"})  # bot/remote.py, bot/loop.sh
READ_BY_OTHERS = frozenset({"WEB_CONCURRENCY"})  # set by PaaS platforms (Heroku) for web servers
# what Kubernetes (and Docker links) set for every service, e.g. TELEGRAM_BOT_SERVICE_HOST for a service telegram-bot
SERVICE_VARIABLE = re.compile(r".+_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_\w+)?)?)")
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def known_names() -> frozenset[str]:
    """Every name the bot reads or will read: the settings, the names not built yet and the bot's own others."""
    return frozenset(Settings.model_fields) | NOT_BUILT_YET | READ_BY_THE_BOT


def prefixes(names: Iterable[str]) -> tuple[str, ...]:
    """The first words two or more of `names` share (TELEGRAM_, LLM_, USER_, …); a word only one name has (DATABASE_,
    OPENAI_) may as well be another program's."""
    counts = Counter(name.partition("_")[0] + "_" for name in names if "_" in name)
    return tuple(sorted(word for word, n in counts.items() if n >= 2))


def env_file() -> Path:
    """The .env file the settings read (Settings.model_config), in the working directory."""
    path = Settings.model_config.get("env_file")
    assert isinstance(path, str | Path), "the settings read one .env file"
    return Path(path)


def env_file_names(path: Path) -> dict[str, bool]:
    """The names `path` (a .env file) sets → whether as NAME=value (False: a line without `=`); none when missing."""
    if not path.is_file():
        return {}
    return {name: value is not None for name, value in dotenv_values(path, encoding="utf-8").items()}


def unknown_name_lines(environ: Mapping[str, str], env_file: Path, also_read: Collection[str] = ()) -> list[str]:
    """One warning line per name the bot does not read: in `env_file`, any; in `environ`, those with one of the bot's
    prefixes. `also_read`: further names that are read (MCP_CONFIG's `${NAME}`s)."""
    known = known_names()
    ignored = known | READ_BY_OTHERS | {name.upper() for name in also_read}
    bot_prefixes = prefixes(known)
    found: dict[str, list[str]] = {}  # name → where it is set
    lines: list[str] = []
    for name, is_assignment in env_file_names(env_file).items():
        if not (is_assignment and VARIABLE.fullmatch(name)):  # perhaps a pasted secret: the line is not repeated
            lines.append(f"{env_file}: a line that is not NAME=value is ignored")
        elif name.upper() not in ignored:
            found.setdefault(name, []).append(str(env_file))
    for name in environ:
        upper = name.upper()
        if upper.startswith(bot_prefixes) and upper not in ignored and not SERVICE_VARIABLE.fullmatch(upper):
            found.setdefault(name, []).append("the environment")
    for name, where in sorted(found.items()):
        close = difflib.get_close_matches(name.upper(), sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        lines.append(f"{name}: not a setting of the bot, ignored (set in {' and '.join(where)}{hint})")
    return lines


def warn_of_unknown_names(settings: Settings, environ: Mapping[str, str]) -> None:
    """Print this start's lines of `unknown_name_lines` to stderr (the .env it read, MCP_CONFIG's `${NAME}`s)."""
    also_read = mcp_variables(settings.MCP_CONFIG) if settings.MCP_CONFIG is not None else frozenset()
    for line in unknown_name_lines(environ, env_file(), also_read):
        print(line, file=sys.stderr)
