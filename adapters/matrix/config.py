"""The Matrix settings checked before anything starts (no mautrix import): all three or none, the homeserver an
http(s) URL, the user id `@name:server`."""

from __future__ import annotations

import re

from core import Settings

USER_ID = re.compile(r"@[^:\s]+:[^\s]+")
NAMES = ("MATRIX_HOMESERVER", "MATRIX_USER_ID", "MATRIX_ACCESS_TOKEN")


def config_problem(settings: Settings) -> str | None:
    """One line naming what is wrong with the Matrix settings, or None (also when Matrix is off)."""
    missing = [name for name in NAMES if getattr(settings, name) is None]
    if len(missing) == len(NAMES):
        return None
    if missing:
        return f"Matrix needs {', '.join(NAMES)}: {', '.join(missing)} not set"
    homeserver = str(settings.MATRIX_HOMESERVER).strip()
    if not homeserver.startswith(("https://", "http://")):
        return f"MATRIX_HOMESERVER: not an http(s) URL ({homeserver!r}; e.g. https://matrix.example.org)"
    if not USER_ID.fullmatch(str(settings.MATRIX_USER_ID).strip()):
        return "MATRIX_USER_ID: not a Matrix user id (expected @name:server, e.g. @assistant:example.org)"
    return None
