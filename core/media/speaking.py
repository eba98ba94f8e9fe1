"""Voice answers (/voice on, sql/030): the answer to a voice note is also read aloud (Audio.speak) for the accounts
that asked for it; off by default. A failed speech call costs only the voice: the text answer stands."""

from __future__ import annotations

import logging
import re

from core.media.audio import Audio, AudioRefused
from core.storage.db import Pool
from core.types import Assistant, Incoming, Spoken

log = logging.getLogger(__name__)

VOICE_ON = "Voice answers are **on**: I answer each voice note you send with a voice note too. /voice off stops it."
VOICE_OFF = "Voice answers are **off**: I answer voice notes in writing. /voice on makes me answer them aloud too."
VOICE_ON_MUTE = (
    "Voice answers are **on** for you, but no speech model is set up here now (the operator can set SPEECH_MODEL), "
    "so I answer in writing only. /voice off turns them off."
)
VOICE_UNAVAILABLE = "Voice answers are **off**, and no speech model is set up here (the operator can set SPEECH_MODEL)."
VOICE_NOW_OFF = "Voice answers are **off** now: I answer voice notes in writing."
VOICE_USAGE = "Use /voice on or /voice off (or /voice to see the setting)."
VOICE_NOT_ON = (
    "Voice answers need a speech model, and none is set up here: the operator must set SPEECH_MODEL first. They stay "
    "off."
)

_ACCOUNT_SQL = (
    "SELECT a.voice_answers FROM users u JOIN accounts a ON a.id = u.account_id"
    " WHERE u.platform = $1 AND u.platform_user_id = $2"
)
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")  # [text](url) → text
_MARKS = re.compile(
    r"(\*\*|__|~~|`+|^\s{0,3}#{1,6}\s+|^\s{0,3}>\s?|^\s*[*+-]\s+|(?<!\w)\*(?=\S)|(?<=\S)\*(?!\w))", re.MULTILINE
)


async def wanted(pool: Pool, inc: Incoming) -> bool:
    """Whether the speaker's account has voice answers on (False for someone never seen)."""
    return bool(await pool.fetchval(_ACCOUNT_SQL, inc.platform, inc.user_id))


async def set_wanted(pool: Pool, account_id: int, on: bool) -> None:
    """Turn voice answers on or off for an account (every linked identity shares it)."""
    await pool.execute("UPDATE accounts SET voice_answers = $2 WHERE id = $1", account_id, on)


def spoken_text(markdown: str) -> str:
    """An answer's Markdown as words to say: link targets, emphasis, code ticks, heading and quote marks dropped."""
    return _MARKS.sub("", _LINK.sub(r"\1", markdown)).strip()


async def read_aloud(pool: Pool, audio: Audio, inc: Incoming, answer: Assistant) -> Spoken | None:
    """The answer to a voice note read aloud, when the speaker's account has voice answers on (in groups too: they
    asked for it). None over the HTTP API, for an answer sent before (a redelivery), without a speech model, and when
    the speech server fails (one log line: the text answer stands)."""
    if inc.via == "api" or audio.speaker is None or answer.sent_parts or not await wanted(pool, inc):
        return None
    try:
        data = await audio.speak(spoken_text(answer.text))
    except AudioRefused as e:
        log.warning("turn %s: the answer was not read aloud: %s", answer.turn_id, e)
        return None
    return Spoken(answer.turn_id, data)


async def answer(pool: Pool, audio: Audio, inc: Incoming, account_id: int, state: str) -> str:
    """/voice: the speaker's setting, or `state` ("on", "off") stored for their account; on only with a speech
    model."""
    wish = state.strip().lower()
    if not wish:
        if await wanted(pool, inc):
            return VOICE_ON if audio.speaker is not None else VOICE_ON_MUTE
        return VOICE_OFF if audio.speaker is not None else VOICE_UNAVAILABLE
    if wish not in ("on", "off"):
        return VOICE_USAGE
    if wish == "on" and audio.speaker is None:
        return VOICE_NOT_ON
    await set_wanted(pool, account_id, wish == "on")
    return VOICE_ON if wish == "on" else VOICE_NOW_OFF
