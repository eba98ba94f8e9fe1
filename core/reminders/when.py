"""`/remind <when> <what>` without a model: the time in natural language (dateparser, in the person's zone and
language) or a repeating form (`every weekday 7:30`, `every 2 hours`) read into the task tool's own terms."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from pydantic import ValidationError

from core.constants import EXAMPLE_CHARS, MAX_WHEN_WORDS
from core.reminders.recurrence import Recurrence
from core.timeutil import fmt_local

if TYPE_CHECKING:
    from dateparser.date import DateData

# Languages tried after the person's own (dateparser detects which one a text is in among them).
LANGUAGES = ("en", "de", "fr", "es", "it", "pt", "nl")
EXAMPLE = "/remind tomorrow 9:00 Buy milk"  # the example of a refusal, unless the person's own words make a better one
USAGE = (
    "Tell me when and what, e.g.:\n"
    "- /remind in 10 minutes Take the pizza out\n"
    "- /remind friday 18:30 Call mum\n"
    "- /remind every weekday 7:30 Stretch\n\n"
    "Times are in your time zone ({zone}; /timezone changes it)."
)
NOT_UNDERSTOOD = "I could not read a time at the start of “{text}”. Put the time first, e.g. " + EXAMPLE
NO_TIME_OF_DAY = "“{when}” needs a time of day too, e.g. {example}"
IN_THE_PAST = "{when} is in the past (it is now {now}). Give a time to come, e.g. " + EXAMPLE
NOTHING_TO_SAY = "What should I remind you of at {when}? e.g. /remind {text} Buy milk"
# one separator between "when" and "what" (`friday 18:30 — May the 4th party`), for texts a date reader would take in
_SEPARATOR = re.compile(r"\s+[-–—|]\s+|\s*[,;:]\s+")
_JOINER = re.compile(r"^(?:to|that|about|:|-|–|—)\s+", re.IGNORECASE)  # "in 10 minutes to buy milk"
# `9h`, `9h30`, `9 Uhr`, `9 Uhr 30`, `um 9`, `at 9`, `à 9` → 9:00 / 9:30 (dateparser reads HH:MM in every language);
# not in a time from now (`in 2h` is two hours)
_HOUR_MARKS = (
    (re.compile(r"\b(\d{1,2})h(\d{2})?\b", re.IGNORECASE), lambda m: f"{m[1]}:{m[2] or '00'}"),
    (re.compile(r"\b(\d{1,2})\s*uhr\b(?:\s*(\d{2})\b)?", re.IGNORECASE), lambda m: f"{m[1]}:{m[2] or '00'}"),
    (re.compile(r"\b(at|um|à|a las|alle|om|às)\s+(\d{1,2})\b(?![:.\d])", re.IGNORECASE), r"\1 \2:00"),
)
_RELATIVE = re.compile(r"^(?:in|dans|en|tra|fra|over|em|daqui a)\s", re.IGNORECASE)  # "in 3 days": from now


@dataclass(frozen=True)
class Understood:
    """What `/remind` understood: the reminder's text, its first time (UTC) and how it repeats (None: once)."""

    what: str
    when: str  # the words read as the time, as typed
    due: datetime | None  # a one-shot's time; a repeating one's first time comes from the task tool
    repeat: Recurrence | None = None


# ---- repeating forms ---------------------------------------------------------------------------------------------

_DAYS = {
    "monday": "mon", "tuesday": "tue", "wednesday": "wed", "thursday": "thu", "friday": "fri", "saturday": "sat",
    "sunday": "sun", "montag": "mon", "dienstag": "tue", "mittwoch": "wed", "donnerstag": "thu", "freitag": "fri",
    "samstag": "sat", "sonntag": "sun", "lundi": "mon", "mardi": "tue", "mercredi": "wed", "jeudi": "thu",
    "vendredi": "fri", "samedi": "sat", "dimanche": "sun",
}  # fmt: skip
_DAY_WORD = "|".join([*_DAYS, *{v for v in _DAYS.values()}])
_DAY_SETS = {
    "day": None, "tag": None, "jour": None, "weekday": "mon-fri", "werktag": "mon-fri", "weekend": "sat,sun",
}  # fmt: skip
_EVERY = r"(?:every|each|jeden|jede|jedes|alle|chaque|tous\s+les|toutes\s+les)"
_TIME = r"(?:(?:at|um|à|a)\s+)?(?P<time>\d{1,2}(?::\d{2})?\s*(?:am|pm|h|uhr)?(?:\s*\d{2})?)"
_DAILY = re.compile(rf"^(?:{_EVERY}\s+(?P<set>day|tag|jour|jours|weekday|werktag|weekend)s?|daily|täglich|werktags)"
                    rf"\s+{_TIME}\b", re.IGNORECASE)  # fmt: skip
_WEEKLY = re.compile(rf"^{_EVERY}\s+(?P<days>(?:{_DAY_WORD})s?(?:\s*(?:,|and|und|et|-)\s*(?:{_DAY_WORD})s?)*)"
                     rf"\s+{_TIME}\b", re.IGNORECASE)  # fmt: skip
_INTERVAL = re.compile(rf"^(?:{_EVERY}\s+(?:(?P<n>\d+)\s+)?(?P<unit>minutes?|mins?|hours?|h|stunden?|minuten?|heures?)"
                       r"|(?P<hourly>hourly|stündlich))\b", re.IGNORECASE)  # fmt: skip
_STARTS_REPEATING = re.compile(rf"^(?:{_EVERY}|daily|täglich|werktags|hourly|stündlich)\b", re.IGNORECASE)
REPEAT_NOT_UNDERSTOOD = (
    "I could not read how “{when}” repeats. Forms I know: every day 8:00, every weekday 7:30, every monday 10:00, "
    "every 2 hours."
)


def _clock(raw: str) -> str | None:
    """`7`, `7:30`, `7pm`, `19h30`, `9 Uhr` as HH:MM (None: not a time of day)."""
    m = re.fullmatch(r"(\d{1,2})(?::(\d{2}))?\s*(am|pm|h|uhr)?\s*(\d{2})?", raw.strip(), re.IGNORECASE)
    if m is None:
        return None
    hour, minute = int(m[1]), int(m[2] or m[4] or 0)
    mark = (m[3] or "").lower()
    if mark == "pm" and hour < 12:
        hour += 12
    elif mark == "am" and hour == 12:
        hour = 0
    return f"{hour:02d}:{minute:02d}" if hour < 24 and minute < 60 else None


def _days(raw: str) -> str:
    """`monday and wednesday`, `mon-fri`, `lundi, jeudi` as APScheduler's day names (`mon,wed`, `mon-fri`)."""
    names = re.split(r"\s*(,|and|und|et|-)\s*", raw.lower())
    out = ""
    for word in names:
        if word in (",", "and", "und", "et"):
            out += ","
        elif word == "-":
            out += "-"
        elif word:
            out += _DAYS.get(word.rstrip("s"), _DAYS.get(word, word.rstrip("s")[:3]))
    return out


def repeating(text: str) -> tuple[Recurrence, str] | str | None:
    """A repeating form at the start of `text`: (its recurrence, the rest), a line saying it is not understood, or
    None when the text does not start like one."""
    if not _STARTS_REPEATING.match(text):
        return None
    try:
        if m := _DAILY.match(text):
            time = _clock(m["time"])
            days = _DAY_SETS.get((m["set"] or "day").lower().rstrip("s"))
            if m[0].lower().startswith("werktags"):
                days = "mon-fri"
            if time is not None:
                return Recurrence(kind="cron", time=time, days_of_week=days), text[m.end() :]
        if m := _WEEKLY.match(text):
            time = _clock(m["time"])
            if time is not None:
                return Recurrence(kind="cron", time=time, days_of_week=_days(m["days"])), text[m.end() :]
        if m := _INTERVAL.match(text):
            unit = (m["unit"] or "hour").lower()
            per = 1 if unit.startswith("min") else 60
            return Recurrence(kind="interval", every_minutes=int(m["n"] or 1) * per), text[m.end() :]
    except ValidationError:
        pass
    return REPEAT_NOT_UNDERSTOOD.format(when=" ".join(text.split()[:4]))


# ---- one time ----------------------------------------------------------------------------------------------------


def _normalised(when: str) -> str:
    """The "when" words in the forms dateparser reads in every language (`9h30` → `9:30`, `um 9` → `um 9:00`)."""
    if _RELATIVE.match(when):
        return when
    for pattern, replacement in _HOUR_MARKS:
        when = pattern.sub(replacement, when)
    return when


def _read(when: str, tz: ZoneInfo, now: datetime, languages: Sequence[str], prefer: str) -> DateData:
    """dateparser's reading of `when` as local wall time in `tz`, seen from `now`."""
    from dateparser.date import DateDataParser  # ~0.2 s to import: only once someone uses /remind

    settings = {
        "RELATIVE_BASE": now.astimezone(tz).replace(tzinfo=None),
        "PREFER_DATES_FROM": prefer,
        "RETURN_TIME_AS_PERIOD": True,
        "RETURN_AS_TIMEZONE_AWARE": False,
    }
    try:
        return DateDataParser(languages=list(languages), settings=settings).get_date_data(_normalised(when))
    except ValueError:  # a language dateparser does not have
        return DateDataParser(languages=list(LANGUAGES), settings=settings).get_date_data(_normalised(when))


def _local(naive: datetime, tz: ZoneInfo) -> datetime:
    """A wall time in `tz` as an aware time (in the hour repeated when summer time ends, the first one)."""
    return naive.replace(tzinfo=tz)


def _at(when: str, tz: ZoneInfo, now: datetime, languages: Sequence[str]) -> tuple[datetime, str] | None:
    """The time `when` names (and its period: time, part_of_day, day, week…), or None when it names none. A weekday
    later today is today (`friday 18:30` said on a Friday at 15:00), not a week away."""
    ahead = _read(when, tz, now, languages, "future")
    if ahead.date_obj is None:
        return None
    if ahead.period == "time" and _RELATIVE.match(when):  # `in 5 hours`: elapsed time, across a change of the clocks
        return now + (ahead.date_obj - now.astimezone(tz).replace(tzinfo=None)), "time"
    due = _local(ahead.date_obj, tz)
    this = _read(when, tz, now, languages, "current_period")
    if this.date_obj is not None and now < _local(this.date_obj, tz) < due:
        due = _local(this.date_obj, tz)
    return due, str(ahead.period)


def _split(text: str) -> list[tuple[str, str]]:
    """Ways to cut `text` into (when, what), the likeliest first: at a separator, then the longest start first."""
    cuts: list[tuple[str, str]] = []
    if m := _SEPARATOR.search(text):
        cuts.append((text[: m.start()], text[m.end() :]))
    words = text.split()
    for k in range(min(len(words), MAX_WHEN_WORDS), 0, -1):
        cuts.append((" ".join(words[:k]), " ".join(words[k:])))
    return cuts


def _what(rest: str) -> str:
    """The reminder's text after the time, without a joining word (`to buy milk` → `buy milk`)."""
    return _JOINER.sub("", rest.strip()).strip()


def languages_of(tag: str) -> tuple[str, ...]:
    """The language to read times in first, from a platform's tag (`pt-BR` → `pt`; none when unknown)."""
    base = tag.strip().replace("_", "-").split("-")[0].lower()
    return (base,) if base.isalpha() and len(base) in (2, 3) else ()


def understand(text: str, tz: ZoneInfo, now: datetime, languages: Sequence[str] = ()) -> Understood | str:
    """Read `/remind`'s text (`<when> <what>`) in the person's zone `tz` and languages (theirs first), seen from
    `now`: what it understood, or one line with an example saying why nothing can be made."""
    text = " ".join(text.split())
    repeat = repeating(text) if text else USAGE.format(zone=tz.key)
    if isinstance(repeat, str):
        return repeat
    if repeat is not None:
        rec, rest = repeat
        return _repeats(text[: len(text) - len(rest)].strip(), _what(rest), rec, text)
    langs = list(dict.fromkeys([*languages, *LANGUAGES]))
    for when, rest in _split(text):
        found = _at(when, tz, now, langs)
        if found is None:
            continue
        due, period = found
        return _checked(when, _what(rest), due, period, tz, now, text)
    return NOT_UNDERSTOOD.format(text=text[:80])


def understand_parts(
    when: str, what: str, tz: ZoneInfo, now: datetime, languages: Sequence[str] = ()
) -> Understood | str:
    """The same for a `when` and a `what` given apart (Discord's slash command options)."""
    when, what = " ".join(when.split()), " ".join(what.split())
    repeat = repeating(when) if when else USAGE.format(zone=tz.key)
    if isinstance(repeat, str):
        return repeat
    if repeat is not None:
        rec, rest = repeat
        return REPEAT_NOT_UNDERSTOOD.format(when=when[:80]) if rest.strip() else _repeats(when, what, rec, when)
    found = _at(when, tz, now, list(dict.fromkeys([*languages, *LANGUAGES])))
    if found is None:
        return NOT_UNDERSTOOD.format(text=when[:80])
    return _checked(when, what, *found, tz, now, when)


def _repeats(when: str, what: str, rec: Recurrence, text: str) -> Understood | str:
    """A repeating reminder understood, or the question what it is about when no text follows the time."""
    return Understood(what, when, None, rec) if what else NOTHING_TO_SAY.format(when=when, text=text)


def _checked(
    when: str, what: str, due: datetime, period: str, tz: ZoneInfo, now: datetime, text: str
) -> Understood | str:
    """A one-shot reading accepted, or why not: no text, no time of day (`tomorrow`), or in the past."""
    if not what:
        return NOTHING_TO_SAY.format(when=when, text=text)
    if period not in ("time", "part_of_day") and not _RELATIVE.match(when):
        example = EXAMPLE if any(c.isdigit() for c in when) else f"/remind {when} 9:00 {what[:EXAMPLE_CHARS]}"
        return NO_TIME_OF_DAY.format(when=when, example=example)
    if due <= now:
        return IN_THE_PAST.format(when=when, now=fmt_local(now, tz, now))
    return Understood(what, when, due)
