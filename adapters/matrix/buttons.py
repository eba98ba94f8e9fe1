"""Buttons where Matrix has none: each of the core's buttons (a reminder's Done / Snooze, /remind's Undo, a
confirmation, a choice, "Allow" for an MCP call) is a reaction the bot puts under its own message, named in the
message's last line ("React ✅ Done · 😴 10 min · 💤 1 h"); a person's reaction with that key presses it.

A reminder's buttons keep their own keys (✅ done, 😴 10 min, 💤 1 h, ↩️ undo); others take their label's leading emoji
when it is one and the only button, else the keycaps 1️⃣ 2️⃣ … in order. What each key of a message does is kept in the
database under the message's event id (`Core.kept`), so a press works after a restart and in any process; the
message's content also lists them under BUTTONS_FIELD, for clients and tests that read it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from adapters.matrix.limits import MATRIX_BUTTON_LABEL, MATRIX_CHOICES
from core import Button, Confirm, OnTask, Press, pack, unpack

TASK_KEYS = {"done": "✅", "snooze10": "😴", "snooze60": "💤", "undo": "↩️"}
KEYCAPS = ("1️⃣", "2️⃣", "3️⃣", "4️⃣", "5️⃣", "6️⃣", "7️⃣", "8️⃣", "9️⃣", "🔟")
LEGEND = "React"  # the first word of the line naming the reactions
BUTTONS_FIELD = "assistant.buttons"  # the content field listing a message's buttons: [{"key", "label"}]


@dataclass(frozen=True)
class Offered:
    """One button as a reaction: its key, its label and what a press does."""

    key: str
    label: str
    press: Press


def keyed(buttons: Sequence[Button]) -> list[Offered]:
    """The buttons with their reaction keys (at most MATRIX_CHOICES)."""
    buttons = list(buttons)[: min(MATRIX_CHOICES, len(KEYCAPS))]
    if all(isinstance(b.press, OnTask) and b.press.action in TASK_KEYS for b in buttons):
        return [Offered(TASK_KEYS[b.press.action], b.label, b.press) for b in buttons]  # type: ignore[union-attr]
    lead = leading_emoji(buttons[0].label) if len(buttons) == 1 else ""
    if lead:
        return [Offered(lead, buttons[0].label, buttons[0].press)]
    return [Offered(KEYCAPS[i], b.label, b.press) for i, b in enumerate(buttons)]


def leading_emoji(label: str) -> str:
    """The label's first word when it is an emoji (no letter or digit in it), else ""."""
    word = label.split(" ", 1)[0]
    return word if word and word != label and not any(c.isalnum() for c in word) else ""


def shown(offered: Offered) -> str:
    """How the legend names one button: its key, then its label without a leading emoji of its own."""
    label = offered.label[:MATRIX_BUTTON_LABEL]
    lead = leading_emoji(label)
    return f"{offered.key} {label[len(lead) :].strip() if lead else label}"


def legend(offered: Sequence[Offered]) -> str:
    """The line under a message that says what to react with."""
    return f"{LEGEND} " + " · ".join(shown(o) for o in offered)


def with_legend(text: str, offered: Sequence[Offered]) -> str:
    """The message's text with the legend as its last paragraph (none without buttons)."""
    return f"{text.rstrip()}\n\n{legend(offered)}" if offered else text


def encode(press: Press) -> dict[str, object]:
    """A press as JSON (a Confirm's owner is a Matrix id, which the core's short forms do not take)."""
    if isinstance(press, Confirm):
        return {"c": press.command, "a": dict(press.args), "o": press.owner}
    return {"p": pack(press)}


def decode(data: dict[str, object]) -> Press | None:
    """A kept press back (None: not one)."""
    if "p" in data:
        return unpack(str(data["p"]))
    args = data.get("a")
    if not isinstance(args, dict) or "c" not in data or "o" not in data:
        return None
    return Confirm(str(data["c"]), {str(k): str(v) for k, v in args.items()}, str(data["o"]))


@dataclass(frozen=True)
class Kept:
    """What is kept of a message with buttons: its text (without the legend), its buttons, the bot's reactions."""

    text: str
    offered: tuple[Offered, ...]
    reactions: tuple[str, ...] = ()

    def dumps(self) -> str:
        """As kept in the database."""
        buttons = [{"k": o.key, "l": o.label, **encode(o.press)} for o in self.offered]
        return json.dumps({"t": self.text, "b": buttons, "r": list(self.reactions)}, ensure_ascii=False)

    @classmethod
    def loads(cls, value: str) -> Kept | None:
        """Back from the database (None: nothing, or a message whose buttons were used)."""
        try:
            data = json.loads(value)
            offered = []
            for b in data["b"]:
                press = decode(b)
                if press is not None:
                    offered.append(Offered(str(b["k"]), str(b["l"]), press))
            return cls(str(data["t"]), tuple(offered), tuple(str(r) for r in data.get("r", [])))
        except (ValueError, KeyError, TypeError):
            return None

    def pressed(self, key: str) -> Press | None:
        """What the reaction `key` presses (None: not one of the message's)."""
        return next((o.press for o in self.offered if o.key == key), None)

    def named(self, text: str) -> str | None:
        """The key of the button a reply names ("done", "10 min", "✅", "2"; any case), or None."""
        said = " ".join(text.split()).casefold()
        for i, o in enumerate(self.offered, 1):
            lead = leading_emoji(o.label)
            names = {o.key, o.label, o.label[len(lead) :].strip(), str(i) if o.key in KEYCAPS else o.key}
            if isinstance(o.press, OnTask):  # "done", "undo", "snooze" (the first snooze)
                names |= {o.press.action, o.press.action.rstrip("0123456789")}
            if said in {n.casefold() for n in names}:
                return o.key
        return None
