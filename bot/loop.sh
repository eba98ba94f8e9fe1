#!/usr/bin/env bash
# Run the bot locally and start it again whenever it asks to: restart(mode="full") exits with code 42.
# Any other exit code (0 after /quit or Ctrl-C, 2 for a configuration problem, 1 for a crash) ends the
# loop with that code. Arguments are passed to the bot. Run it from the directory that holds your .env.
#   BOT_COMMAND        the command to run instead of `uv run bot` (arguments are then ignored)
#   BOT_RESTART_DELAY  seconds to wait before starting again (default 1)
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
delay="${BOT_RESTART_DELAY:-1}"
while true; do
  if [ -n "${BOT_COMMAND:-}" ]; then
    bash -c "$BOT_COMMAND"
  else
    uv run --project "$root" bot "$@"
  fi
  code=$?
  if [ "$code" -ne 42 ]; then
    exit "$code"
  fi
  echo "loop.sh: the bot asked to be restarted (exit code 42); starting it again" >&2
  sleep "$delay"
done
