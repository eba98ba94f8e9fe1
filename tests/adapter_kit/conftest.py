"""The kit's one fixture: `driver`, a started adapter of each platform on a Core (every kit test runs once per
platform). A new platform adds its branch here: its fake's fixture, the settings that point the core at it, its
Driver."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial

import pytest
from aiohttp import web

from core.front_door import Core
from core.storage.db import Pool
from tests.adapter_kit import discord_driver, matrix_driver, slack_driver, telegram_driver
from tests.adapter_kit.driver import Driver, Who
from tests.conftest import MakeCore
from tests.fake_discord import FakeDiscord
from tests.fake_matrix import FakeMatrix
from tests.fake_openai import FakeOpenAI
from tests.fake_slack import FakeSlack
from tests.fake_telegram import FakeTelegram
from tests.test_web_fetch import Site, article, html

PLATFORMS = ["telegram", "discord", "slack", "matrix"]
OTHER_MODEL = "fake-big"  # LLM_MODELS: a second model on offer (the first is LLM_MODEL), so /model offers a choice


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    """A web page on 127.0.0.1 the kit's cores may read (WEB_ALLOW_PRIVATE)."""
    async with Site({"/tides": html(article()), "/search": searx}) as served:
        yield served


async def searx(request: web.Request) -> web.StreamResponse:
    """A SearXNG JSON answer: the page on this server, then one elsewhere."""
    found = [
        {"title": "How tides work", "url": f"http://{request.host}/tides", "content": "The rise and fall…"},
        {"title": "Tide tables", "url": "https://tides.example.org/tables", "content": "High and low water."},
    ]
    return web.json_response({"results": found})


@pytest.fixture(params=PLATFORMS)
async def driver(
    request: pytest.FixtureRequest, fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, site: Site
) -> AsyncIterator[Driver]:
    """The platform's adapter, started against its fake on a Core where the owner is an admin, the friend may use
    the bot and the stranger may not; in Berlin's time zone, with two models on offer, and `site` readable."""
    platform: str = request.param
    fakes = {"telegram": FakeTelegram, "discord": FakeDiscord, "slack": FakeSlack, "matrix": FakeMatrix}
    async with fakes[platform]() as fake:
        users: Mapping[Who, int | str]
        build: Callable[[FakeOpenAI, Core, Pool], Driver]
        if isinstance(fake, FakeTelegram):
            settings, users = telegram_driver.TelegramDriver.settings(fake), telegram_driver.USERS
            build = partial(telegram_driver.TelegramDriver, fake)
        elif isinstance(fake, FakeDiscord):
            settings, users = discord_driver.DiscordDriver.settings(fake), discord_driver.USERS
            build = partial(discord_driver.DiscordDriver, fake)
        elif isinstance(fake, FakeSlack):
            settings, users = slack_driver.SlackDriver.settings(fake), slack_driver.USERS_IN_TEAM
            build = partial(slack_driver.SlackDriver, fake)
        else:
            settings, users = matrix_driver.MatrixDriver.settings(fake), matrix_driver.USERS
            build = partial(matrix_driver.MatrixDriver, fake)
        core = make_core(
            **settings,
            ADMINS=f"{platform}:{users['owner']}",
            ALLOWED_USERS=f"{platform}:{users['friend']}",
            DEFAULT_TIMEZONE="Europe/Berlin",
            LLM_MODELS=OTHER_MODEL,
            WEB_ALLOW_PRIVATE=f"127.0.0.1:{site.port}",
            SEARXNG_URL=f"http://127.0.0.1:{site.port}",
        )
        made = build(fake_llm, core, pool)
        await made.adapter.start()
        try:
            yield made
        finally:
            await made.adapter.stop()
