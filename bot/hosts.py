"""The addresses a server listens on, without loading the web server (bot.web loads uvicorn and FastAPI)."""

from __future__ import annotations

import ipaddress

ALL_INTERFACES = "0.0.0.0"
LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine's loopback address (127.0.0.0/8, ::1, localhost): nobody else reaches it."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
