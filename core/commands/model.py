"""/model and /voice: which model answers the person, and whether their voice notes are answered aloud."""

from __future__ import annotations

import hashlib

from core.agent.providers import ModelChoice, chosen_model
from core.buttons import Button, Buttons, Confirm
from core.commands.base import Ask, Command, Option
from core.media import speaking
from core.storage import conversations

NO_MODEL_STATUS = "none, commands only (LLM_PROVIDER=none)"

MODEL_FIXED = "Answers come from **{model}**; this bot offers no other models (its operator lists them in LLM_MODELS)."
MODEL_HOW = {  # how to switch, per platform (the chat adapters put a button per model under the list)
    "telegram": "Press a button below, or send /model <name>, e.g. /model {example}.",
    "discord": "Press a button below, or use /model name:{example}.",
}
MODEL_NOT_OFFERED = "`{name}` is not a model on offer here; choose one of: {names}."
MODEL_SWITCHED = "Done — **{name}** answers you from now on, on every platform you linked."
MODEL_STALE = "That button is out of date (the models on offer changed): send /model to see them."
MODEL_NOT_YOURS = "This button is not for you: /model shows your own choice of models."


def model_token(index: int, choice: ModelChoice) -> str:
    """What a model button carries: the choice's place in the list and a check of its name (`3:1a2b3c4d`), so a
    press after the operator changed LLM_MODELS never picks another model than the one shown."""
    return f"{index}:{hashlib.sha256(choice.name.encode()).hexdigest()[:8]}"


def model_by_token(choices: tuple[ModelChoice, ...], token: str) -> ModelChoice | None:
    """The choice a button names (None: out of range, or the list changed since it was shown)."""
    index, _, _ = token.partition(":")
    if not index.isdecimal() or int(index) >= len(choices):
        return None
    choice = choices[int(index)]
    return choice if model_token(int(index), choice) == token else None


def model_by_name(choices: tuple[ModelChoice, ...], name: str) -> ModelChoice | None:
    """The choice typed after /model: its name in any case, or its model alone when only one choice has it."""
    wanted = name.strip().lower()
    by_name = [c for c in choices if c.name.lower() == wanted]
    by_model = [c for c in choices if c.model.lower() == wanted]
    return by_name[0] if by_name else by_model[0] if len(by_model) == 1 else None


async def model(ask: Ask) -> str | Buttons:
    """/model: the speaker's model and the ones on offer; switch by name (typed) or by choice (a button)."""
    choices, core = ask.core.models, ask.core
    if core.settings.model_off:
        return f"Model: {NO_MODEL_STATUS}."
    if len(choices) < 2:
        return MODEL_FIXED.format(model=choices[0].name)
    user, _ = await ask.speaker()
    if ask.get("choice") or ask.get("name"):
        token, name = ask.get("choice"), ask.get("name")
        pick = model_by_token(choices, token) if token else model_by_name(choices, name)
        if pick is None and token:
            return MODEL_STALE
        if pick is None:
            return MODEL_NOT_OFFERED.format(name=name.strip()[:60], names=", ".join(c.name for c in choices))
        await conversations.set_model(core.pool, user, None if pick == choices[0] else pick.name)
        return MODEL_SWITCHED.format(name=pick.name)
    chosen = chosen_model(choices, user.model)
    current = chosen or choices[0]
    lines = [f"Your model: **{current.name}**" + (" (the default)." if current == choices[0] else ".")]
    if user.model is not None and chosen is None:
        lines.append(f"You picked {user.model[:60]}, which is no longer on offer, so the default answers you.")
    lines.append("On offer:")
    for choice in choices:
        notes = [n for n, on in (("the default", choice == choices[0]), ("yours", choice == current)) if on]
        lines.append(f"- `{choice.name}`" + (f" ({', '.join(notes)})" if notes else ""))
    example = next(c.name for c in choices if c != current)
    how = MODEL_HOW.get(ask.inc.chat_platform, "Switch with /model <name>, e.g. /model {example}.")
    rows = tuple(
        (Button(c.name, Confirm("model", {"choice": model_token(i, c)}, ask.inc.user_id)),)
        for i, c in enumerate(choices)
    )
    return Buttons("\n".join([*lines, how.format(example=example)]), rows)


async def your_model(ask: Ask) -> str:
    """The /status line of the asker's model."""
    user, _ = await ask.speaker()
    models = ask.core.models
    choice = chosen_model(models, user.model)
    if choice is not None and choice != models[0]:
        return f"- your model: {choice.name}"
    gone = f" ({user.model[:60]} is no longer on offer)" if user.model is not None else ""
    return f"- your model: {models[0].name}, the default{gone}"


async def voice(ask: Ask) -> str:
    """/voice: whether the speaker's voice notes are answered aloud too; /voice on|off switches (core/media)."""
    user, _ = await ask.speaker()
    return await speaking.answer(ask.core.pool, ask.core.audio, ask.inc, user.account_id, ask.get("state"))


MODEL = Command(
    "model",
    "show or switch the model that answers you",
    "show the model that answers you and the ones on offer; /model <name> switches to one",
    model,
    (Option("name", "The model to switch to (leave empty to see the ones on offer)"),),
    private=True,
    syntax="[name]",
)
VOICE = Command(
    "voice",
    "answer your voice notes with a voice note too",
    "show or switch voice answers: /voice on answers each voice note you send with a voice note too (and in "
    "writing), /voice off stops it",
    voice,
    (Option("state", "on or off (leave empty to see yours)", choices=("on", "off")),),
    private=True,
    syntax="[on|off]",
)
