"""`python -m bot` / `bot`: run the assistant, or `bot ask "…"` to answer once and exit."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from core.providers import config_problem
from core.settings import SettingsError, load_settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: no sub-command runs the bot, `ask TEXT` answers once."""
    parser = argparse.ArgumentParser(prog="bot", description="Personal assistant bot.")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run", help="run the bot (default)")
    ask = sub.add_parser("ask", help="answer one message in the terminal and exit")
    ask.add_argument("text", nargs="+", help="the message")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = parse_args(argv)
    try:
        settings = load_settings()
    except SettingsError as e:
        print(e, file=sys.stderr)
        return 2
    problem = config_problem(settings)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO if settings.TELEGRAM_BOT_TOKEN or settings.DISCORD_BOT_TOKEN else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    ask_text = " ".join(args.text) if args.command == "ask" else None
    from bot.app import run_bot  # the heavy imports (openai SDK, adapters) only after the checks

    try:
        return asyncio.run(run_bot(settings, ask_text=ask_text))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
