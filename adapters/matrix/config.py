"""The Matrix settings checked before anything starts (no mautrix import): the homeserver, the user id and a token
or a password, or none of them; the homeserver an http(s) URL, the user id `@name:server`."""

from __future__ import annotations

import re

from core import Settings

USER_ID = re.compile(r"@[^:\s]+:[^\s]+")
NAMES = ("MATRIX_HOMESERVER", "MATRIX_USER_ID")
SECRETS = ("MATRIX_ACCESS_TOKEN", "MATRIX_PASSWORD")


def enabled(settings: Settings) -> bool:
    """Whether any Matrix setting is given (then all it needs must be)."""
    return any(getattr(settings, name) is not None for name in (*NAMES, *SECRETS))


def config_problem(settings: Settings) -> str | None:
    """One line naming what is wrong with the Matrix settings, or None (also when Matrix is off)."""
    if not enabled(settings):
        return None
    missing = [name for name in NAMES if getattr(settings, name) is None]
    if all(getattr(settings, name) is None for name in SECRETS):
        missing.append("MATRIX_ACCESS_TOKEN (or MATRIX_PASSWORD)")
    if missing:
        needs = "MATRIX_HOMESERVER, MATRIX_USER_ID and MATRIX_ACCESS_TOKEN or MATRIX_PASSWORD"
        return f"Matrix needs {needs}: {', '.join(missing)} not set"
    homeserver = str(settings.MATRIX_HOMESERVER).strip()
    if not homeserver.startswith(("https://", "http://")):
        return f"MATRIX_HOMESERVER: not an http(s) URL ({homeserver!r}; e.g. https://matrix.example.org)"
    if not USER_ID.fullmatch(str(settings.MATRIX_USER_ID).strip()):
        return "MATRIX_USER_ID: not a Matrix user id (expected @name:server, e.g. @assistant:example.org)"
    return None
