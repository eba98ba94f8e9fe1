"""What the transports saw of the call the current task is making through a connection (core/mcp_servers/connection.py
sets it, core/mcp_servers/transports.py marks it): whether its request may have reached the server, so a call is sent
again only when it never did. Its own module so that the transports, loaded only once a session opens, and the
connection that loads them do not import each other."""

import contextvars
from dataclasses import dataclass


@dataclass
class Attempt:
    """What the transport saw of one call's request."""

    delivered: bool = False  # it may have reached the server
    refused: bool = False  # the server turned it away unread: its session is gone (HTTP 404, or 400 naming it)


# The call the current task is making: the transports mark it (the SDK writes a request in the caller's task, and the
# HTTP transport posts it under a copy of the caller's context).
ATTEMPT: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar("mcp_attempt", default=None)


def mark(delivered: bool = True, refused: bool = False) -> None:
    """Note on the current call what happened to its request."""
    attempt = ATTEMPT.get()
    if attempt is not None:
        attempt.delivered = attempt.delivered or delivered
        attempt.refused = attempt.refused or refused
