"""Time zones, the injectable clock, and parsing/formatting of local wall times."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """The real current time, aware, in UTC."""
    return datetime.now(UTC)


def zone(name: str | None, default: str = "UTC") -> ZoneInfo:
    """The ZoneInfo for an IANA name, falling back to `default` when unknown or unset."""
    try:
        return ZoneInfo(name or default)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo(default)


def valid_zone(name: str) -> str | None:
    """The canonical spelling of a valid IANA zone name, or None."""
    cleaned = name.strip().replace(" ", "_")
    if not cleaned or cleaned.startswith("/") or ".." in cleaned:
        return None
    try:
        ZoneInfo(cleaned)
    except (ZoneInfoNotFoundError, ValueError):
        return None
    return cleaned


def machine_zone() -> str:
    """This machine's IANA time zone (TZ, else the system's), UTC when it has none that is valid."""
    import tzlocal  # only where the person is at this machine: the terminal

    try:
        return valid_zone(tzlocal.get_localzone_name() or "") or "UTC"
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return "UTC"


def parse_local(text: str, tz: ZoneInfo) -> datetime:
    """Parse ISO 8601; a time without an offset is wall time in `tz`, a bare date means 09:00."""
    raw = text.strip().replace(" ", "T", 1) if "T" not in text else text.strip()
    if raw.endswith(("z", "Z")):
        raw = raw[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(raw)
    except ValueError:
        try:
            dt = datetime.combine(date.fromisoformat(raw), time(9, 0))
        except ValueError:
            raise ValueError(f"'{text}' is not an ISO 8601 date/time such as 2026-11-22T09:00") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz)
    return dt.astimezone(UTC)


def fmt_local(dt: datetime, tz: ZoneInfo, now: datetime | None = None) -> str:
    """A compact local time like `Sat 22 Nov 09:00 CET` (year added when not the current one)."""
    local = dt.astimezone(tz)
    this_year = (now or system_clock()).astimezone(tz).year
    pattern = "%a %d %b %H:%M %Z" if local.year == this_year else "%a %d %b %Y %H:%M %Z"
    return local.strftime(pattern)


def describe_now(now: datetime, tz: ZoneInfo) -> str:
    """The current moment for the prompt: date, weekday, time, zone and offset."""
    local = now.astimezone(tz)
    offset = local.strftime("%z")
    return f"{local:%A %Y-%m-%d %H:%M} ({tz.key}, UTC{offset[:3]}:{offset[3:]})"
