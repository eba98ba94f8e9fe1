"""The person's account: /link and /unlink, /token, /web, /export and /forget_me, /usage, /whoami and /budget."""

from __future__ import annotations

from datetime import timedelta

from core.accounts import api_tokens, web_signin
from core.accounts import linking as accounts
from core.accounts.own_data import FileAnswer, Summary, export_account, forget_account, summary
from core.accounts.usage import BUDGET_ADMINS_ONLY
from core.buttons import FORGET_ARGS, Button, Buttons, Confirm
from core.commands.base import Ask, Command, CommandArgs, Option, counted
from core.constants import ABANDONED_MARGIN, WEB_LINK_TTL
from core.reminders.queries import replan_zones
from core.texts import FORGET_LABEL

FORGET_ME_CONFIRM: CommandArgs = FORGET_ARGS  # what the /forget_me confirmation button sends
FORGET_ME_ASK = (
    "This deletes your account and everything I keep about you: {what}. Every identity goes with it ({identities}), "
    "so I will greet you as someone new. It cannot be undone; /export first if you want a copy. "
)
FORGET_ME_HOW = {  # how to confirm, per platform (the chat adapters put a button under the question)
    "telegram": "To go ahead, press the button below or send /forget_me confirm.",
    "discord": "To go ahead, press the button below or use /forget_me confirm:True.",
}
FORGOTTEN = "Done — I deleted your account and everything in it: {what}. If you write to me again, I start afresh."
NOTHING_TO_FORGET = "I keep nothing about you (any more)."
EXPORT_TEXT = "Everything I keep about you, as JSON: {what}."
WHOAMI = "You are `{key}` ({name}): the id ALLOWED_USERS and ADMINS name."
WHOAMI_ALONE = "No other platform is linked (/link does it)."


def _held(held: Summary) -> str:
    """`1 identity, 12 stored messages, 2 tasks, 3 memory lines and 1 archival note`."""
    parts = [
        counted(len(held.identities), "identity"),
        counted(held.messages, "stored message"),
        counted(held.tasks, "task"),
        counted(held.lines, "memory line"),
    ]
    return ", ".join(parts) + " and " + counted(held.archival, "archival note")


def _busy(ask: Ask) -> timedelta:
    """How recent a turn may have started and still be running (linking waits for none)."""
    return timedelta(seconds=ask.core.settings.AGENT_TOTAL_TIMEOUT) + ABANDONED_MARGIN


async def link(ask: Ask) -> str:
    """/link: a new one-time code and the identities linked now; /link CODE: this account joins the code's (whose
    identity is told in the chat where it asked). Only in a private chat: a code is never shown in a group."""
    core, code = ask.core, ask.get("code")
    if ask.inc.chat_kind != "private":
        retired = code.strip() and await accounts.retire(core.pool, code)
        return accounts.ONLY_IN_PRIVATE.format(command="/link") + (accounts.RETIRED if retired else "")
    words = core.settings.MEMORY_BLOCK_WORDS
    user, chat = await ask.speaker()
    now = core.clock()
    if not code.strip():
        made = await accounts.issue(core.pool, user, chat, now)
        return accounts.code_text(made, await accounts.identities(core.pool, user.account_id), user)
    linked = await accounts.redeem(core.pool, user, code, now, block_words=words, busy_within=_busy(ask))
    if isinstance(linked, str):
        return linked
    if await replan_zones(core.pool, now, core.settings.DEFAULT_TIMEZONE, linked.account_id):
        ask.tasks_changed()  # moved tasks repeat in the kept time zone now
    await accounts.tell(core.outboxes, linked.told_in, linked.issuer, linked.notice(words), now)
    return linked.answer(words)


async def unlink(ask: Ask) -> str:
    """/unlink platform:id: that identity leaves the speaker's account for an empty one of its own."""
    if ask.inc.chat_kind != "private":
        return accounts.ONLY_IN_PRIVATE.format(command="/unlink")
    identity = ask.get("identity")
    if not identity.strip():
        return accounts.UNLINK_USAGE
    user, chat = await ask.speaker()
    return await accounts.unlink(
        ask.core.pool, user, identity, here=chat.id, now=ask.core.clock(), busy_within=_busy(ask)
    )


async def token(ask: Ask) -> str:
    """/token: the speaker's account's API tokens, a new one (its secret shown once) or a revocation; only in a
    private chat, so a secret is never shown in a group."""
    if ask.inc.chat_kind != "private":
        return accounts.ONLY_IN_PRIVATE.format(command="/token")
    user, _ = await ask.speaker()
    return await api_tokens.answer(ask.core.pool, user, dict(ask.options), ask.core.clock())


async def web(ask: Ask) -> str:
    """/web: a one-time link signing the speaker in to the web chat (core/accounts/web_signin.py); only in a private
    chat, so the link is never shown in a group. The terminal's user, at this machine, gets the local page's address
    when no public one is set (or how to serve it)."""
    if ask.inc.chat_kind != "private":
        return accounts.ONLY_IN_PRIVATE.format(command="/web")
    base = ask.core.settings.public_base_url
    if base is None and ask.inc.platform == "console":
        base = ask.core.web_url
        if base is None:
            return web_signin.NOT_SERVED
    user, _ = await ask.speaker()
    return await web_signin.answer(ask.core.pool, user, base, ask.core.clock())


async def export(ask: Ask) -> FileAnswer:
    """/export: everything the bot keeps about the speaker's account, as a JSON file."""
    user, _ = await ask.speaker()
    held = await summary(ask.core.pool, user.account_id)
    filename, data = await export_account(ask.core.pool, user.account_id, ask.core.clock())
    return FileAnswer(EXPORT_TEXT.format(what=_held(held)), filename, data)


async def forget_me(ask: Ask) -> str | Buttons:
    """/forget_me: what deleting the speaker's account would delete (a confirmation asks for it), or, confirmed,
    delete it: the confirmed path looks the identity up without storing anything, so nothing of it comes back."""
    inc = ask.inc
    if ask.get("confirm") == "true":
        chat = inc.chat_id if inc.chat_kind == "private" else None
        gone = await forget_account(ask.core.pool, inc.platform, inc.user_id, chat)
        if gone is None:
            return NOTHING_TO_FORGET
        ask.tasks_changed()  # the scheduler drops the deleted tasks' reminders
        return FORGOTTEN.format(what=_held(gone))
    user, _ = await ask.speaker()
    held = await summary(ask.core.pool, user.account_id)
    how = FORGET_ME_HOW.get(inc.chat_platform, "To go ahead, send /forget_me confirm.")
    text = FORGET_ME_ASK.format(what=_held(held), identities=", ".join(held.identities)) + how
    return Buttons(text, ((Button(FORGET_LABEL, Confirm("forget_me", FORGET_ME_CONFIRM, inc.user_id), "danger"),),))


async def usage(ask: Ask) -> str:
    """/usage: the speaker's tokens today and this month, and the budget left (core/accounts/usage.py)."""
    user, _ = await ask.speaker()
    return await ask.core.spending.report(user)


async def whoami(ask: Ask) -> str:
    """/whoami: the speaker's id as ALLOWED_USERS and ADMINS name it, the identities linked to it, and their zone."""
    user, _ = await ask.speaker()
    me = f"{user.platform}:{user.platform_user_id}"
    others = [i.key for i in await accounts.identities(ask.core.pool, user.account_id) if i.key != me]
    lines = [
        WHOAMI.format(key=me, name=user.display_name or "no name"),
        f"Linked: {', '.join(f'`{k}`' for k in others)}." if others else WHOAMI_ALONE,
        f"Time zone: {user.timezone}." + (" You are an admin here." if ask.core.is_admin(ask.inc) else ""),
    ]
    return "\n".join(lines)


async def budget(ask: Ask) -> str:
    """/budget platform:id tokens|off: admins set one person's daily token budget."""
    if not ask.core.is_admin(ask.inc):
        return BUDGET_ADMINS_ONLY
    return await ask.core.spending.set_budget(ask.get("identity"), ask.get("tokens"))


def budget_args(text: str) -> dict[str, str]:
    """`/budget <platform:id> <tokens|off>` as options (nothing unless both are there)."""
    words = text.split()
    return {"identity": words[0], "tokens": words[1]} if len(words) == 2 else {}


def forget_me_args(text: str) -> dict[str, str]:
    """`/forget_me confirm` deletes at once, like `/memory wipe confirm`."""
    return {"confirm": "true"} if text.strip().lower() == "confirm" else {}


EXPORT = Command(
    "export",
    "a file of everything I keep about you",
    "a JSON file of everything I keep about you",
    export,
    private=True,
)
FORGET_ME = Command(
    "forget_me",
    "delete everything I keep about you",
    "delete your account and everything I keep about you, on every platform you linked (after a confirmation)",
    forget_me,
    (Option("confirm", "True deletes at once, without asking", kind="flag"),),
    private=True,
    reader=forget_me_args,
)
LINK = Command(
    "link",
    "link your accounts on other platforms into one",
    "in a private chat: a one-time code (and the identities linked now); /link CODE, sent from your account on "
    "another platform, makes the two one account",
    link,
    (Option("code", "The code /link gave your other account (leave empty to get a code here)"),),
    syntax="[CODE]",
)
UNLINK = Command(
    "unlink",
    "separate a linked identity again",
    "separate one identity (platform:id, as /link lists it) from your account again",
    unlink,
    (Option("identity", "platform:id as /link lists it, e.g. discord:123456"),),
    syntax="platform:id",
)
TOKEN = Command(
    "token",
    "your API tokens: list, make or revoke one",
    "in a private chat: your API tokens; /token new <name> makes one (shown once), /token revoke <name> revokes one",
    token,
    (
        Option("action", "list (default), new (shows the token once) or revoke", choices=("list", "new", "revoke")),
        Option("name", "new, revoke: the token's name, e.g. laptop"),
    ),
    syntax="[new|revoke name]",
    reader=api_tokens.parse,
)
WEB = Command(
    "web",
    "a sign-in link for the web chat",
    "in a private chat: a one-time link that signs you in to the web chat (expires in "
    f"{WEB_LINK_TTL.seconds // 60} minutes, works once)",
    web,
)
USAGE = Command(
    "usage",
    "your model tokens today and this month",
    "the model tokens you used today and this month (per model), and the budget you have left",
    usage,
    private=True,
)
WHOAMI_COMMAND = Command(
    "whoami",
    "your id here, linked accounts, time zone",
    "your id as ALLOWED_USERS and ADMINS name it, the accounts linked to it and your time zone",
    whoami,
    private=True,
)
BUDGET = Command(
    "budget",
    "admins: set a person's daily token budget",
    "admins only: a person's daily token budget (off: the default again)",
    budget,
    (
        Option("identity", "platform:id of the person, e.g. telegram:123456"),
        Option("tokens", "tokens per day, or off for the default"),
    ),
    private=True,
    syntax="platform:id tokens|off",
    reader=budget_args,
)
