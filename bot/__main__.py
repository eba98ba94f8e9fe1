"""`python -m bot` / `bot`: run the assistant, or `bot ask "…"` (`bot ask -`: the message from standard input) to
answer once and exit, or `bot token [name]` to make an API token for the terminal user (printed once), or `bot serve`
to run the HTTP API alone; `bot ask --server URL "…"` asks a running bot over its API instead (bot/remote.py).

Exit codes: 0 done, 1 an answer failed or an unexpected error, 2 a configuration problem (the variable is named),
3 a service (database, Telegram, Discord, the server of `bot ask --server`) could not be reached, 42 a full restart
was asked for (bot/loop.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import traceback
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version

from adapters.matrix import config_problem as matrix_problem
from adapters.slack import config_problem as slack_problem
from adapters.telegram import config_problem as telegram_problem
from bot import remote
from bot.hosts import ALL_INTERFACES, LOOPBACK, is_loopback
from bot.platforms import configured
from bot.remote import TOKEN_ENV
from bot.setting_names import warn_of_unknown_names
from core import (
    Error,
    Settings,
    SettingsError,
    StartupError,
    config_problem,
    load_settings,
    machine_zone,
    mcp_config_problem,
    mcp_environment,
    nothing_configured,
    open_core,
    redact,
)

# the libraries' own INFO lines (connected, started, requests) stay out of a normal start; --debug shows them
LIBRARY_LOGGERS = (
    "telegram",
    "httpx",
    "httpcore",
    "discord",
    "slack_sdk",
    "mautrix",
    "apscheduler",
    "aiohttp",
    "openai",
    "asyncio",
)
WITHOUT_A_MODEL = "Running without a model (LLM_PROVIDER=none): commands, /remind, tasks and reminders only."
NO_MODEL_YET = "No model set: commands and /remind only; to get answers, see “Choosing the model” in the README."
VOICE_WARNING = "voice will NOT be supported"  # discord.py's warning at client start: the bot uses no voice


def build_parser() -> argparse.ArgumentParser:
    """The command line: no command runs the bot (as `bot run`); each command and flag says what it does."""
    parser = argparse.ArgumentParser(
        prog="bot",
        description="A personal assistant on Telegram, Discord and in the terminal. With no command: `bot run`.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {bot_version()}")
    parser.add_argument("--debug", action="store_true", help="debug logging, and full tracebacks of failures")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    sub.add_parser(
        "run",
        help="run the bot (the default)",
        description="Run the bot: each platform whose settings are given (Telegram, Discord, Slack, Matrix), "
        "else a chat in this terminal, until Ctrl-C or SIGTERM.",
    )
    ask = sub.add_parser(
        "ask",
        help="answer one message and exit",
        description="Answer one message in the terminal and exit: a fresh conversation unless --continue, a "
        "/command without the model. With --server, ask a running bot over its HTTP API instead.",
    )
    ask.add_argument("--continue", "-c", dest="cont", action="store_true", help="continue the previous ask")
    ask.add_argument("--server", metavar="URL", help="ask a running bot over its HTTP API (e.g. http://127.0.0.1:8080)")
    ask.add_argument("--token", help=f"the API token for --server (default: the {TOKEN_ENV} environment variable)")
    ask.add_argument("--session", metavar="ID", help="with --server: continue this session (default: a fresh one)")
    ask.add_argument("text", nargs="+", help="the message; - reads it from standard input")
    serve = sub.add_parser(
        "serve",
        help="run the HTTP API and reminders alone (no Telegram or Discord)",
        description="Run the HTTP API (sessions, /v1, the web page) and the reminders, without Telegram or "
        "Discord, until Ctrl-C or SIGTERM. It listens on 127.0.0.1 unless the bot is deployed publicly "
        "(PUBLIC_BASE_URL or TELEGRAM_WEBHOOK_URL: on every interface) or a host is given.",
    )
    serve.add_argument("--host", help="the address to listen on, e.g. 0.0.0.0 for every interface (default: HOST)")
    serve.add_argument("--port", type=int, help="the port to listen on (default: PORT, else a free port)")
    token = sub.add_parser(
        "token",
        help="make an API token for the terminal user",
        description="Make an API token for the terminal user (for bot ask --server and the HTTP API) and print it: "
        "it is shown only this once.",
    )
    token.add_argument("name", nargs="?", help="the token's name (default: terminal-<date>-<time>)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, read."""
    return build_parser().parse_args(argv)


def given_settings(args: argparse.Namespace) -> dict[str, object]:
    """The settings the command line gives, over the environment's: `bot serve --host H --port P`."""
    given = {"HOST": getattr(args, "host", None), "PORT": getattr(args, "port", None)}
    return {name: value for name, value in given.items() if value is not None}


def terminal_chat(args: argparse.Namespace, settings: Settings) -> bool:
    """Whether this start opens the terminal chat: `bot` (or `bot run`) with no platform token."""
    return args.command in (None, "run") and not configured(settings)


def on_this_machine(args: argparse.Namespace, settings: Settings) -> bool:
    """Whether only the person at this machine uses this start: the terminal chat, `bot token`, or `bot serve` on
    loopback (a server others reach must not look healthy without its model)."""
    if args.command == "serve":
        return is_loopback(settings.HOST or (ALL_INTERFACES if settings.public_base_url else LOOPBACK))
    return args.command == "token" or terminal_chat(args, settings)


def bot_version() -> str:
    """The installed version (as /status shows it)."""
    try:
        return version("assistant-bot")
    except PackageNotFoundError:
        return "dev"


def ask_text(args: argparse.Namespace) -> str | None:
    """The message `bot ask` answers: its words, or standard input for `-` (None when not asking)."""
    if args.command != "ask":
        return None
    return sys.stdin.read().strip() if args.text == ["-"] else " ".join(args.text)


async def make_token(settings: Settings, name: str | None) -> int:
    """`bot token [name]`: a new API token of the terminal user (the console identity), printed with its note once;
    1 when it was not made (the reason is printed)."""
    from adapters import console  # like the adapters, only after the checks

    name = name or f"terminal-{datetime.now():%Y%m%d-%H%M%S}"
    async with open_core(settings) as core:
        made = await core.new_api_token(console.console_incoming(f"/token new {name}"), name)
    if isinstance(made, Error):
        print(made.message, file=sys.stderr)
        return 1
    print(f"API token {name} (shown only this once; keep it secret, revoke it with /token revoke {name}):\n{made}")
    return 0


def log_level(settings: Settings, debug: bool) -> int:
    """DEBUG with --debug, else LOG_LEVEL, else INFO when a platform runs and WARNING in the terminal."""
    if debug:
        return logging.DEBUG
    if settings.LOG_LEVEL is not None:
        return logging.getLevelNamesMapping()[settings.LOG_LEVEL]
    return logging.INFO if configured(settings) else logging.WARNING


def configure_logging(level: int) -> None:
    """One line per record; libraries log warnings and errors only (everything with DEBUG)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else max(level, logging.WARNING))
    logging.getLogger("discord.client").addFilter(lambda record: VOICE_WARNING not in record.getMessage())


def failure_line(e: BaseException, settings: Settings) -> str:
    """An unexpected failure as one line without secrets; its traceback goes to DATA_DIR/last-error.txt."""
    secrets = settings.secret_values()
    first = (str(e).strip().splitlines() or [""])[0]
    message = redact(f"{type(e).__name__}: {first}" if first else type(e).__name__, secrets)
    where = "run with --debug or LOG_LEVEL=DEBUG"
    path = settings.DATA_DIR / "last-error.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(redact("".join(traceback.format_exception(e)), secrets), encoding="utf-8")
        where = f"traceback in {path}; or run with --debug"
    except OSError:
        pass
    return f"The bot stopped: {message} ({where})"


def main(argv: list[str] | None = None) -> int:
    """The `bot` command: read the command line and the settings, check them, run; returns the exit code."""
    args = parse_args(argv)
    try:
        text = ask_text(args)
    except KeyboardInterrupt:  # Ctrl-C while `bot ask -` waits for standard input
        return 0
    if text == "":
        print("bot ask: nothing to ask (the message is empty)", file=sys.stderr)
        return 2
    if text is not None and (args.server is not None or args.token or args.session):
        return remote.main(args.server, args.token, args.session, text, cont=args.cont, debug=args.debug)
    try:
        settings = load_settings(**given_settings(args))
    except SettingsError as e:
        print(e, file=sys.stderr)
        return 2
    warn_of_unknown_names(settings, os.environ)
    no_model_yet = on_this_machine(args, settings) and nothing_configured(settings)
    if no_model_yet:  # the chat, the local page and `bot token` work; messages are answered with what to set
        settings = settings.model_copy(update={"LLM_PROVIDER": "none"})
    if (terminal_chat(args, settings) or text is not None) and "DEFAULT_TIMEZONE" not in settings.model_fields_set:
        settings = settings.model_copy(update={"DEFAULT_TIMEZONE": machine_zone()})  # the person is at this machine
    problem = (
        config_problem(settings) or telegram_problem(settings) or slack_problem(settings) or matrix_problem(settings)
    )
    problem = problem or mcp_config_problem(settings, mcp_environment())
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if settings.model_off and args.command in ("run", "serve", None) and not terminal_chat(args, settings):
        print(NO_MODEL_YET if no_model_yet else WITHOUT_A_MODEL, file=sys.stderr)  # the terminal chat has a banner
    debug = args.debug or settings.LOG_LEVEL == "DEBUG"
    configure_logging(log_level(settings, args.debug))
    try:
        if args.command == "token":
            return asyncio.run(make_token(settings, args.name))
        from bot.app import run_bot  # the adapters (PTB, discord.py) only after the checks

        serve = args.command == "serve"
        return asyncio.run(run_bot(settings, ask_text=text, ask_continue=text is not None and args.cont, serve=serve))
    except KeyboardInterrupt:
        return 0
    except StartupError as e:
        print(redact(" ".join(str(e).split()), settings.secret_values()), file=sys.stderr)
        return e.exit_code
    except Exception as e:
        if debug:
            raise
        print(failure_line(e, settings), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
