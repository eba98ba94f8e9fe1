"""Commands of the core's one catalogue (COMMANDS) on Matrix: `!tasks`, `!remind tomorrow 9:00 Buy milk`.

`!` is the primary form (documented, and what Matrix bots conventionally take): Element runs a `/word` it knows
itself (/me, /help, /op, /ban, /nick, /join, /devtools …) and asks before sending one it does not, so `/tasks` reaches
the bot only when the person sends it as a message — then it is taken too. A command needs no mention in a group room;
a word that is no command of the catalogue is an ordinary message. Answers name commands as typed here (`!tasks`).

A personal command asked in a group room (its answer is the person's own: /tasks, /memory, /export …) is answered in
the person's direct room with the bot (made when there is none) and the group is told so in one line: Matrix has no
messages only one person in a room sees."""

from __future__ import annotations

from adapters.base import renamed
from adapters.matrix.incoming import StoredMessage
from adapters.matrix.limits import MATRIX_UPLOAD_BYTES
from adapters.matrix.send import Sender
from core import COMMANDS, SENT_PRIVATELY, Button, Command, Core, Error, FileAnswer, file_too_large

PREFIXES = ("!", "/")
PRIMARY = "!"
BY_NAME = {name: c for c in COMMANDS for name in (c.name, *c.aliases)}


def command_of(text: str) -> tuple[Command, str] | None:
    """The catalogue's command a message starts with (`!name` or `/name`, any case) and the text after it."""
    word, *rest = text.strip().split(None, 1) or [""]
    if len(word) < 2 or word[0] not in PREFIXES:
        return None
    command = BY_NAME.get(word[1:].lower())
    return (command, rest[0].strip() if rest else "") if command is not None else None


def on_matrix(text: str) -> str:
    """A command answer's `/tasks`, `/remind …` as typed on Matrix: `!tasks`, `!remind …`."""
    return renamed(text, lambda name: f"{PRIMARY}{name}")


def flat(rows: tuple[tuple[Button, ...], ...]) -> list[Button]:
    """An answer's buttons in order."""
    return [b for row in rows for b in row]


async def run(core: Core, sender: Sender, stored: StoredMessage) -> None:
    """Answer one stored command without the model, where its person may see it."""
    inc, room, txn = stored.incoming, stored.room_id, stored.event_id
    group = inc.chat_kind == "group"
    reply_to = stored.event_id if group else None
    command = BY_NAME[stored.command]
    answer = await core.command(inc, command.name, stored.args)
    if answer is None:  # a refusal given in this room within the hour
        return
    if isinstance(answer, Error):
        await sender.post(room, on_matrix(answer.message), txn, reply_to=reply_to)
        return
    if isinstance(answer, FileAnswer):
        if len(answer.data) > MATRIX_UPLOAD_BYTES:
            await sender.post(room, file_too_large(len(answer.data), MATRIX_UPLOAD_BYTES), txn, reply_to=reply_to)
            return
        target = await sender.direct_room(inc.user_id) if group else room
        await sender.send_file(target, FileAnswer(on_matrix(answer.text), answer.filename, answer.data), f"{txn}.file")
        if group:
            await sender.post(room, SENT_PRIVATELY, f"{txn}.note", reply_to=reply_to)
        return
    text, buttons = (answer, []) if isinstance(answer, str) else (answer.text, flat(answer.rows))
    if command.private and group:
        direct = await sender.direct_room(inc.user_id)
        await sender.post(direct, on_matrix(text), f"{txn}.private", buttons=buttons)
        await sender.post(room, SENT_PRIVATELY, f"{txn}.note", reply_to=reply_to)
        return
    await sender.post(room, on_matrix(text), txn, reply_to=reply_to, buttons=buttons)
