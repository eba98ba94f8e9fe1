"""/memory: what the bot remembers about the person, with line numbers; forget one line; wipe (asks first)."""

from __future__ import annotations

from core.buttons import WIPE_ARGS, Button, Buttons, Confirm
from core.commands.base import Ask, Command, CommandArgs, Option, counted
from core.memory.blocks import normalise_name
from core.memory.show_and_erase import Overview, Wiped, delete_memory_line, memory_overview, wipe_memory
from core.texts import WIPE_LABEL
from core.tools.framework import ToolError

MEMORY_HOW = (
    "To delete a line: /memory forget <block> <line>, e.g. /memory forget human 2. "
    "To erase everything I remember about you: /memory wipe."
)
MEMORY_WIPE_CONFIRM: CommandArgs = WIPE_ARGS  # what a confirmation button sends
MEMORY_USAGE = "Use /memory, /memory forget <block> <line> (e.g. /memory forget human 2) or /memory wipe."
MEMORY_WIPE_ASK = "This erases everything I remember about you: {lines} and {archival}{files}. It cannot be undone. "
MEMORY_WIPE_HOW = {  # how to confirm, per platform (the chat adapters put a button under the question)
    "telegram": "To go ahead, press the button below or send /memory wipe confirm.",
    "discord": "To go ahead, press the button below or use /memory action:wipe confirm:True.",
    "api": "To go ahead, send /memory wipe confirm (or POST /v1/memory/wipe).",
}
MEMORY_WIPED = (
    "Done — I erased {lines} and {archival}{files}. Our conversation history is not memory and stays as it is."
)


def memory_args(text: str) -> dict[str, str]:
    """`/memory`, `/memory forget <block> <line>`, `/memory wipe [confirm]` as options (else action "invalid")."""
    words = text.split()
    action = words[0].lower() if words else "show"
    if action in ("forget", "delete") and len(words) >= 3 and words[-1].isdecimal():
        return {"action": "forget", "block": "_".join(words[1:-1]), "line": words[-1]}
    if action == "wipe" and len(words) <= 2:
        confirm = [w.lower() for w in words[1:]]
        if confirm in ([], ["confirm"]):
            return {"action": "wipe", "confirm": "true" if confirm else "false"}
    return {"action": "show" if not words else "invalid"}


def _files(held: Wiped | Overview) -> str:
    """`, plus the 3 files you sent` (nothing when there are none): a wipe takes the kept files too."""
    return f", plus {counted(held.files, 'file')} you sent" if held.files else ""


async def memory(ask: Ask) -> str | Buttons:
    """/memory: the speaker's memory with line numbers; forget one line; wipe (asks first unless confirmed)."""
    user, _ = await ask.speaker()
    pool, action = ask.core.pool, ask.options.get("action", "show")
    if action == "show":
        overview = await memory_overview(pool, user.account_id)
        text = overview.text(ask.core.settings.MEMORY_BLOCK_WORDS)
        return f"**What I remember about you**\n```\n{text}\n```\n{MEMORY_HOW}"
    if action == "forget" and ask.get("block") and ask.get("line").isdecimal():
        block = ask.get("block").strip().lower().replace(" ", "_")
        try:
            number = int(ask.get("line"))  # ValueError past Python's digit limit
            gone = await delete_memory_line(pool, user.account_id, block, number)
        except ValueError:
            return MEMORY_USAGE
        except ToolError as e:
            return str(e)
        return f"Forgot line {number} of [{normalise_name(block)}]: “{gone}”."
    if action == "wipe" and ask.get("confirm") == "true":
        wiped = await wipe_memory(pool, user.account_id)
        return MEMORY_WIPED.format(
            lines=counted(wiped.lines, "line"), archival=counted(wiped.archival, "archival entry"), files=_files(wiped)
        )
    if action == "wipe":
        overview = await memory_overview(pool, user.account_id)
        lines = sum(len(block.lines) for block in overview.blocks)
        how = MEMORY_WIPE_HOW.get(ask.inc.chat_platform, "To go ahead, send /memory wipe confirm.")
        counts = {
            "lines": counted(lines, "line"),
            "archival": counted(overview.archival, "archival entry"),
            "files": _files(overview),
        }
        wipe = Button(WIPE_LABEL, Confirm("memory", MEMORY_WIPE_CONFIRM, ask.inc.user_id), "danger")
        return Buttons(MEMORY_WIPE_ASK.format(**counts) + how, ((wipe,),))
    return MEMORY_USAGE


MEMORY = Command(
    "memory",
    "what I remember about you (forget a line, wipe)",
    "what I remember about you; /memory forget human 2 deletes line 2 of [human], "
    "/memory wipe erases all of it (after a confirmation)",
    memory,
    (
        Option(
            "action",
            "show (default), forget one line, or wipe everything (asks to confirm)",
            choices=("show", "forget", "wipe"),
        ),
        Option("block", "forget: the block, e.g. human"),
        Option("line", "forget: the line number shown by /memory", kind="integer"),
        Option("confirm", "wipe: True erases at once, without asking", kind="flag"),
    ),
    private=True,
    reader=memory_args,
)
