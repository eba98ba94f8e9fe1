"""Own model (issue 21): LLM_MODELS checked at start, /model lists and switches (typed, Telegram and Discord
buttons), the choice belongs to the account and names the model of its every call, and a model the operator
removed falls back to the default."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters import console
from adapters.discord.adapter import DiscordAdapter
from adapters.telegram import TelegramAdapter
from core import Buttons, Confirm, config_problem
from core.agent.llm import LLM
from core.agent.providers import PROVIDERS, ProviderInfo
from core.front_door import Core
from core.settings import EXIT_CONFIG
from core.storage.db import Pool
from core.types import Incoming
from tests.conftest import FakeClock, MakeSettings
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.helpers import answer, incoming, run
from tests.test_console import bot_cli

MODELS = "fake-big, groq:fast-model"  # a second model of the configured provider, and one of another provider
GROQ_KEY = "gk-test-key-123"


@pytest.fixture
async def groq() -> AsyncIterator[FakeOpenAI]:
    """A second fake server, standing in for the groq provider."""
    async with FakeOpenAI(default=Reply(text="from groq")) as fake:
        yield fake


@pytest.fixture
async def build(pool: Pool, make_settings: MakeSettings, clock: FakeClock, groq: FakeOpenAI) -> AsyncIterator[Any]:
    """Cores on the test database whose `groq` provider is the second fake server (closed and drained after)."""
    made: list[Core] = []

    def make(**overrides: Any) -> Core:
        settings = make_settings(**{"LLM_MODELS": MODELS, "GROQ_API_KEY": GROQ_KEY, **overrides})
        providers = {**PROVIDERS, "groq": ProviderInfo(groq.base_url, "fast-model")}
        made.append(Core(settings, pool, LLM.from_settings(settings, max_retries=0, providers=providers), clock=clock))
        return made[-1]

    yield make
    for core in made:
        await core.drain(0)
        await core.llm.aclose()


def models_named(fake: FakeOpenAI) -> list[str]:
    """The model each chat request named, in order."""
    return [r["model"] for r in fake.requests]


# ---- LLM_MODELS at start ---------------------------------------------------------------------------------------


def test_a_pair_without_its_key_or_of_an_unknown_provider_is_one_line(make_settings: MakeSettings) -> None:
    missing = config_problem(make_settings(LLM_MODELS="gpt-4o, groq:llama-3.3-70b-versatile"))
    assert missing == (
        "LLM_MODELS: 'groq:llama-3.3-70b-versatile' needs the groq key (GROQ_API_KEY is not set; set it, or remove "
        "the entry)"
    )
    unknown = config_problem(make_settings(LLM_MODELS="qwen2.5:7b"))
    assert unknown is not None and unknown.startswith("LLM_MODELS: 'qwen2.5:7b' names an unknown provider 'qwen2.5' (")
    assert "ollama:qwen2.5:7b" in unknown and "\n" not in unknown
    assert config_problem(make_settings(LLM_MODELS="groq:x", GROQ_API_KEY="k")) is None
    assert config_problem(make_settings(LLM_MODELS="ollama:llama3.1, fake-big")) is None  # a local one needs no key
    too_many = config_problem(make_settings(LLM_MODELS=",".join(f"m{i}" for i in range(21))))
    assert too_many == "LLM_MODELS: 21 models listed (at most 20; keep the ones people need)"


def test_other_providers_keys_are_secrets(make_settings: MakeSettings) -> None:
    settings = make_settings(GROQ_API_KEY=GROQ_KEY, OPENROUTER_API_KEY="or-key-456")
    assert {GROQ_KEY, "or-key-456"} <= set(settings.secret_values())
    assert settings.provider_key("groq") is not None and settings.provider_key("ollama") is None
    assert settings.provider_key("llm") is None  # never LLM_API_KEY through a made-up provider name


async def choices_of(core: Core) -> list[str]:
    """What the buttons under /model's list carry (the models' choices), as the chats show them."""
    listed = await core.command(incoming("/model"), "model", "")
    presses = [b.press for row in listed.rows for b in row] if isinstance(listed, Buttons) else []
    return [p.args["choice"] for p in presses if isinstance(p, Confirm)]


async def test_the_command_line_refuses_a_pair_without_its_key(tmp_path: Path) -> None:
    env = {"LLM_API_KEY": "sk-test", "LLM_MODELS": "gpt-4o,anthropic:claude-sonnet-4-5"}
    rc, out, err = await bot_cli("ask", "hi", env=env, cwd=tmp_path)
    assert (rc, out) == (EXIT_CONFIG, "")
    assert err == (
        "LLM_MODELS: 'anthropic:claude-sonnet-4-5' needs the anthropic key (ANTHROPIC_API_KEY is not set; set it, "
        "or remove the entry)\n"
    )


# ---- /model and the model each call names ----------------------------------------------------------------------


async def test_without_llm_models_switching_is_not_offered(build: Any) -> None:
    core = build(LLM_MODELS="")
    text = await core.command(incoming("/model"), "model", "")
    assert text == (
        "Answers come from **fake-model**; this bot offers no other models (its operator lists them in LLM_MODELS)."
    )
    assert await choices_of(core) == []  # no buttons: nothing to choose


async def test_model_lists_switches_and_the_next_answer_names_it(build: Any, fake_llm: FakeOpenAI) -> None:
    core = build()
    ann = incoming("/model", user="100")
    listed = await core.command(ann, "model", "")
    assert isinstance(listed, Buttons)  # the list, and a button per model under it
    shown = listed.text
    assert shown.splitlines() == [
        "Your model: **fake-model** (the default).",
        "On offer:",
        "- `fake-model` (the default, yours)",
        "- `fake-big`",
        "- `groq:fast-model`",
        "Press a button below, or send /model <name>, e.g. /model fake-big.",
    ]
    bad = await core.command(ann, "model", "gpt-5")
    assert bad == "`gpt-5` is not a model on offer here; choose one of: fake-model, fake-big, groq:fast-model."
    assert await core.command(ann, "model", "FAKE-BIG") == (
        "Done — **fake-big** answers you from now on, on every platform you linked."
    )
    fake_llm.script(Reply(text="big answer"))
    assert answer(await run(core, incoming("hello", user="100", message_id="1"))).text == "big answer"
    assert models_named(fake_llm) == ["fake-big"]
    status = await core.command(ann, "status")
    assert "- your model: fake-big\n" in str(status) and "- model: fake-model\n" in str(status)
    # back to the default: stored as NULL (it follows LLM_MODEL)
    await core.command(ann, "model", "fake-model")
    assert await core.pool.fetchval("SELECT model FROM accounts WHERE id = (SELECT account_id FROM users)") is None


async def test_the_terminal_switches_by_name(build: Any, fake_llm: FakeOpenAI) -> None:
    core = build()
    shown = await console.command(core, "model", "")
    assert "- `fake-model` (the default, yours)" in shown
    assert shown.endswith("Switch with /model <name>, e.g. /model fake-big.")
    assert "fake-big** answers you" in await console.command(core, "model", "fake-big")
    fake_llm.script(Reply(text="big"))
    assert (await console.ask(core, console.console_incoming("hello")))[0] == "big"
    assert models_named(fake_llm) == ["fake-big"]


async def test_another_providers_model_uses_its_client_once_made(
    build: Any, fake_llm: FakeOpenAI, groq: FakeOpenAI
) -> None:
    core = build()
    assert await core.command(incoming("/model"), "model", "fast-model") == (  # its model name alone, when unique
        "Done — **groq:fast-model** answers you from now on, on every platform you linked."
    )
    for n in range(2):
        assert answer(await run(core, incoming(f"hi {n}", message_id=str(n)))).text == "from groq"
    assert models_named(groq) == ["fast-model", "fast-model"] and fake_llm.requests == []
    clients = {id(core.llm.using(c).client) for c in core.models}
    assert len(clients) == 2  # the configured provider's (both of its models) and groq's, made once


async def test_the_choice_is_the_accounts_all_its_identities_use_it_others_do_not(
    build: Any, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = build()
    ann_tg = incoming("hi from telegram", user="100", message_id="t1")
    ann_dc = incoming("hi from discord", user="900", platform="discord", message_id="d1")
    for identity in (ann_tg, ann_dc):
        await core.command(identity, "status")  # each identity exists, with an account of its own
    # Ann's Discord identity is linked to her Telegram identity's account; she picks a model there; Bob is someone else
    await pool.execute(
        "UPDATE users SET account_id = (SELECT account_id FROM users WHERE platform_user_id = '100')"
        " WHERE platform = 'discord' AND platform_user_id = '900'"
    )
    await core.command(ann_dc, "model", "fake-big")
    fake_llm.default = Reply(text="ok")
    await run(core, ann_tg)
    await run(core, ann_dc)
    await run(core, incoming("hi, I'm Bob", user="200", name="Bob", message_id="b1"))
    job = Incoming("telegram", "100", "100", "morning summary", "Ann", message_id="job:1:2026-11-21T10:00:00+00:00")
    assert await core.answer_text(job) == "ok"  # an agent job of the account
    assert models_named(fake_llm) == ["fake-big", "fake-big", "fake-model", "fake-big"]
    assert "- your model: fake-big" in str(await core.command(ann_tg, "status"))


async def test_a_model_the_operator_removed_falls_back_to_the_default(build: Any, fake_llm: FakeOpenAI) -> None:
    ann = incoming("/model")
    await build().command(ann, "model", "fake-big")
    core = build(LLM_MODELS="groq:fast-model")  # restarted without fake-big
    fake_llm.script(Reply(text="default answer"))
    assert answer(await run(core, incoming("hello", message_id="1"))).text == "default answer"
    assert models_named(fake_llm) == ["fake-model"]
    listed = await core.command(ann, "model", "")
    assert isinstance(listed, Buttons)
    shown = listed.text
    assert shown.splitlines()[:2] == [
        "Your model: **fake-model** (the default).",
        "You picked fake-big, which is no longer on offer, so the default answers you.",
    ]
    assert "- your model: fake-model, the default (fake-big is no longer on offer)" in str(
        await core.command(ann, "status")
    )


async def test_a_button_of_a_changed_list_is_one_line(build: Any) -> None:
    core = build()
    [_, big, _] = await choices_of(core)
    ann = incoming("/model")
    assert await core.command(ann, "model", {"choice": big}) == (
        "Done — **fake-big** answers you from now on, on every platform you linked."
    )
    stale = "That button is out of date (the models on offer changed): send /model to see them."
    assert await core.command(ann, "model", {"choice": "7:" + big.split(":")[1]}) == stale  # out of range
    reordered = build(LLM_MODELS="groq:fast-model, fake-big")  # index 1 is another model now
    assert await reordered.command(ann, "model", {"choice": big}) == stale
    assert await core.pool.fetchval("SELECT model FROM accounts") == "fake-big"


# ---- Telegram and Discord buttons ------------------------------------------------------------------------------


async def test_telegram_model_buttons_switch_only_for_their_person(
    tg: FakeTelegram, build: Any, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = build(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url, ALLOWED_USERS="*")
    adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
    await adapter.start()
    try:
        tg.push_update(tg.message_update("/model", user_id=1001, chat_id=1001))
        await tg.wait_sent(1)
        shown = tg.sent[0]
        rows = shown["reply_markup"]["inline_keyboard"]
        assert [[b["text"] for b in row] for row in rows] == [["fake-model"], ["fake-big"], ["groq:fast-model"]]
        big = rows[1][0]["callback_data"]
        assert big.startswith("model:1:") and big.endswith(":1001") and len(big.encode()) <= 64
        # Bob presses Ann's button (also in her chat): nothing changes
        tg.push_update(tg.callback_update(big, message=shown, user_id=1002, first_name="Bob"))
        await tg.wait_for(lambda: len(tg.callback_answers) == 1)
        assert "not for you" in tg.callback_answers[0]["text"]
        assert await pool.fetchval("SELECT count(*) FROM accounts WHERE model IS NOT NULL") == 0
        # Ann presses it: her account's model, and the message says so
        tg.push_update(tg.callback_update(big, message=shown))
        await tg.wait_for(lambda: tg.sent[0].get("edit_count", 0) == 1)
        assert "fake-big</b> answers you from now on" in tg.sent[0]["text"]
        assert await pool.fetchval("SELECT model FROM accounts") == "fake-big"
        fake_llm.script(Reply(text="big"))
        tg.push_update(tg.message_update("hello", user_id=1001, chat_id=1001))
        await tg.wait_sent(2)
        assert models_named(fake_llm) == ["fake-big"]
    finally:
        await adapter.stop()


async def test_discord_model_buttons_switch_only_for_their_person(
    dc: FakeDiscord, build: Any, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = build(
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=dc.gateway_url,
        ALLOWED_USERS="*",
    )
    adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
    await adapter.start()
    alice, bob = dc.user(2001, "Alice"), dc.user(2002, "Bob")
    try:
        shown = await (await dc.slash("model", None, alice)).wait_done()
        assert shown.ephemeral and "Your model: **fake-model** (the default)." in shown.texts()[0]
        assert shown.message is not None
        ids = [c["custom_id"] for row in shown.message["components"] for c in row["components"]]
        labels = [c["label"] for row in shown.message["components"] for c in row["components"]]
        assert labels == ["fake-model", "fake-big", "groq:fast-model"]
        assert ids[2].startswith("model:2:") and ids[2].endswith(":2001")
        await adapter.stop()  # a new client (a restart): the buttons still work
        adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
        await adapter.start()
        refused = await (await dc.click(shown.message, ids[2], bob)).wait_done()
        assert refused.ephemeral and "not for you" in refused.texts()[0]
        assert await pool.fetchval("SELECT count(*) FROM accounts WHERE model IS NOT NULL") == 0
        done = await (await dc.click(shown.message, ids[2], alice)).wait_done()
        assert done.responses[0]["type"] == 7 and "**groq:fast-model** answers you" in done.texts()[0]
        assert await pool.fetchval("SELECT model FROM accounts") == "groq:fast-model"
        typed = await (await dc.slash("model", {"name": "fake-big"}, bob)).wait_done()
        assert "**fake-big** answers you" in typed.texts()[0]
        assert sorted(await pool.fetchval("SELECT array_agg(model) FROM accounts")) == ["fake-big", "groq:fast-model"]
    finally:
        await adapter.stop()
