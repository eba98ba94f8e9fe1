"""Signing in to the web chat page without a password (issue 22; core/accounts/web_signin.py, sql/027): `/web` in a
private chat answers with a one-time link (10 minutes, once) on the bot's public address; redeeming it makes a web
sign-in (a cookie secret stored hashed, a CSRF token) that acts for the identity's account at the time of use, until it
expires or is signed out. /export lists sign-ins without secrets; /forget_me deletes them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re

import pytest

from adapters.telegram.render import markdown_to_html
from core import Core, FileAnswer, Incoming
from core.accounts.api_tokens import Bearer as TokenBearer
from core.accounts.web_signin import NO_BASE_URL, NOT_SERVED, authenticate, csrf_matches, redeem, sign_out
from core.commands import HELP
from core.constants import WEB_LINK_LIVE, WEB_LINK_TTL, WEB_LOGIN_MAX_LIVE, WEB_LOGIN_TTL
from core.settings import SettingsError, load_settings
from core.storage.db import Pool
from core.types import Bearer
from tests.conftest import FakeClock, MakeCore
from tests.helpers import incoming
from tests.test_own_data import traces

BASE = "https://bot.example.com"
LINK = re.compile(r"<(https?://[^>\s]+/signin\?code=([A-Za-z0-9_-]+))>")
LINK_CODE = re.compile(r"\b([2-9A-Z]{4}-[2-9A-Z]{4})\b")  # a /link code
ANN_TG, ANN_DC, BOB_TG = "7400", "7500", "7600"


def ann(*, platform: str = "telegram", group: bool = False) -> Incoming:
    """Ann on Telegram (privately or in a group) or in her Discord DM."""
    if platform == "discord":
        return incoming("/web", platform="discord", user=ANN_DC, chat="9400", name="Ann")
    return incoming("/web", user=ANN_TG, chat="-100" if group else None, kind="group" if group else "private")


async def web(core: Core, inc: Incoming) -> str:
    """What `/web` answers."""
    said = await core.command(inc, "web", "", must_answer=True)
    assert isinstance(said, str)
    return said


async def new_code(core: Core, inc: Incoming) -> str:
    """`/web` → the code of the link it shows."""
    found = LINK.search(await web(core, inc))
    assert found is not None
    return found.group(2)


async def identity(pool: Pool, platform_user_id: str) -> tuple[int, int]:
    """(users.id, account id) of an identity."""
    row = await pool.fetchrow("SELECT id, account_id FROM users WHERE platform_user_id = $1", platform_user_id)
    assert row is not None
    return row["id"], row["account_id"]


def hashed(secret: str) -> bytes:
    """What the tables keep of a code or secret."""
    return hashlib.sha256(secret.encode()).digest()


async def kept(pool: Pool) -> set[bytes]:
    """The sign-ins stored, by their secrets' hashes."""
    return {r["secret_hash"] for r in await pool.fetch("SELECT secret_hash FROM web_signins")}


async def test_a_link_signs_in_once_and_only_hashes_are_stored(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core(PUBLIC_BASE_URL=BASE + "/")
    assert "/web" in HELP
    said = await web(core, ann())
    found = LINK.search(said)
    assert found is not None and found.group(1).startswith(f"{BASE}/signin?code=")
    url, code = found.groups()
    assert len(code) >= 22 and "expires in 10 minutes and works once" in said  # 22 url-safe characters hold 128 bits
    assert f'<a href="{url}">' in markdown_to_html(said)  # no `_` of the code is read as emphasis
    login = await redeem(core.pool, code, clock())
    assert login is not None and login.expires_at == clock() + WEB_LOGIN_TTL
    assert await redeem(core.pool, code, clock()) is None  # once
    signed = await authenticate(core.pool, login.secret, clock())
    ids = await identity(core.pool, ANN_TG)
    assert signed == (Bearer(0, "web", *ids, "telegram", ANN_TG, "Ann"), login.csrf)
    assert TokenBearer is Bearer  # the API tokens' Bearer, moved to core.types: old imports keep working
    stored = await core.pool.fetchrow("SELECT l.code_hash, s.secret_hash FROM web_links l, web_signins s")
    assert stored is not None
    assert (stored["code_hash"], stored["secret_hash"]) == (hashed(code), hashed(login.secret))
    assert await traces(core.pool, [code, login.secret], []) == []  # no table holds the code or the secret
    assert await authenticate(core.pool, login.csrf, clock()) is None  # the CSRF token is no cookie
    assert await authenticate(core.pool, login.secret[:-1] + ("A" if login.secret[-1] != "A" else "B"), clock()) is None
    assert await authenticate(core.pool, "", clock()) is None
    assert await redeem(core.pool, "not a code", clock()) is None
    assert csrf_matches(login.csrf, login.csrf) and not csrf_matches(login.csrf, None)
    assert not csrf_matches(login.csrf, login.csrf[:-1])


async def test_a_link_expires_after_ten_minutes(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core(PUBLIC_BASE_URL=BASE)
    late, in_time = await new_code(core, ann()), await new_code(core, ann())
    clock.advance(seconds=WEB_LINK_TTL.total_seconds() - 1)
    assert await redeem(core.pool, in_time, clock()) is not None
    clock.advance(seconds=1)
    assert await redeem(core.pool, late, clock()) is None


async def test_concurrent_redeems_make_one_sign_in(
    make_core: MakeCore, clock: FakeClock, pool: Pool, pool_b: Pool
) -> None:
    core = make_core(PUBLIC_BASE_URL=BASE)
    for _ in range(3):
        code = await new_code(core, ann())
        tries = [redeem(p, code, clock()) for _ in range(4) for p in (pool, pool_b)]
        won = [login for login in await asyncio.gather(*tries) if login is not None]
        assert len(won) == 1
    assert await core.pool.fetchval("SELECT count(*) FROM web_signins") == 3


async def test_older_links_stop_working_past_the_most_an_identity_holds(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core(PUBLIC_BASE_URL=BASE)
    codes = [await new_code(core, ann()) for _ in range(WEB_LINK_LIVE + 1)]
    bob = await new_code(core, incoming("/web", user=BOB_TG, name="Bob"))  # another identity's links stay
    assert await redeem(core.pool, codes[0], clock()) is None
    assert all([await redeem(core.pool, c, clock()) is not None for c in (*codes[1:], bob)])


async def test_a_sign_in_acts_for_the_identitys_account_now(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core(PUBLIC_BASE_URL=BASE)
    login = await redeem(core.pool, await new_code(core, ann(platform="discord")), clock())
    assert login is not None
    dc_id, dc_account = await identity(core.pool, ANN_DC)
    code = LINK_CODE.search(str(await core.command(ann(), "link", "", must_answer=True)))
    assert code is not None
    linked = await core.command(ann(platform="discord"), "link", code.group(1), must_answer=True)
    assert isinstance(linked, str) and "one account" in linked
    _, tg_account = await identity(core.pool, ANN_TG)
    assert tg_account != dc_account
    merged = await authenticate(core.pool, login.secret, clock())  # the Discord account merged into Telegram's
    assert merged is not None and merged[0] == Bearer(0, "web", dc_id, tg_account, "discord", ANN_DC, "Ann")
    await core.command(ann(), "unlink", f"discord:{ANN_DC}", must_answer=True)
    apart = await authenticate(core.pool, login.secret, clock())
    assert apart is not None and apart[0].account_id not in (tg_account, dc_account)
    assert apart[0].account_id == (await identity(core.pool, ANN_DC))[1]


async def test_a_sign_in_ends_when_signed_out_or_expired(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core(PUBLIC_BASE_URL=BASE)
    out = await redeem(core.pool, await new_code(core, ann()), clock())
    stays = await redeem(core.pool, await new_code(core, ann()), clock())
    assert out is not None and stays is not None
    await sign_out(core.pool, out.secret, clock())
    await sign_out(core.pool, "not a secret", clock())
    assert await authenticate(core.pool, out.secret, clock()) is None
    assert await authenticate(core.pool, stays.secret, clock()) is not None  # another browser stays signed in
    clock.advance(seconds=WEB_LOGIN_TTL.total_seconds() - 1)
    assert await authenticate(core.pool, stays.secret, clock()) is not None
    clock.advance(seconds=1)
    assert await authenticate(core.pool, stays.secret, clock()) is None
    fresh = await redeem(core.pool, await new_code(core, ann()), clock())  # ended ones are deleted a day later
    assert fresh is not None and await kept(core.pool) == {hashed(stays.secret), hashed(fresh.secret)}
    clock.advance(days=1, seconds=1)
    new = await redeem(core.pool, await new_code(core, ann()), clock())
    assert new is not None and await kept(core.pool) == {hashed(fresh.secret), hashed(new.secret)}


async def test_a_new_sign_in_ends_the_oldest_past_the_most_an_identity_holds(
    make_core: MakeCore, clock: FakeClock
) -> None:
    core = make_core(PUBLIC_BASE_URL=BASE)
    logins = []
    for _ in range(WEB_LOGIN_MAX_LIVE + 1):
        login = await redeem(core.pool, await new_code(core, ann()), clock())
        assert login is not None
        logins.append(login)
        clock.advance(seconds=1)
    assert await authenticate(core.pool, logins[0].secret, clock()) is None
    assert all([await authenticate(core.pool, x.secret, clock()) is not None for x in logins[1:]])


async def test_web_in_a_group_shows_no_link(make_core: MakeCore) -> None:
    core = make_core(PUBLIC_BASE_URL=BASE)
    assert await web(core, ann(group=True)) == "Send /web to me in a private chat."
    assert await core.pool.fetchval("SELECT count(*) FROM web_links") == 0


async def test_web_without_a_public_address_says_what_the_operator_must_set(make_core: MakeCore) -> None:
    core = make_core()
    assert core.settings.public_base_url is None
    assert await web(core, ann()) == NO_BASE_URL
    assert "PUBLIC_BASE_URL" in NO_BASE_URL and "\n" not in NO_BASE_URL
    assert await core.pool.fetchval("SELECT count(*) FROM web_links") == 0


async def test_the_terminals_web_uses_the_local_page_or_says_how_to_serve_one(make_core: MakeCore) -> None:
    from adapters.console import console_incoming

    core = make_core(ALLOWED_USERS=f"telegram:{BOB_TG}")  # the terminal's user is allowed all the same
    terminal = console_incoming("/web")
    assert await web(core, terminal) == NOT_SERVED
    assert "uv run bot serve" in NOT_SERVED and "PORT" in NOT_SERVED and "\n" not in NOT_SERVED
    core.web_url = "http://127.0.0.1:8765"  # as bot/ sets it once it serves the page
    found = LINK.search(await web(core, terminal))
    assert found is not None and found.group(1).startswith("http://127.0.0.1:8765/signin?code=")
    assert await redeem(core.pool, found.group(2), core.now()) is not None
    assert await web(core, incoming("/web", user=BOB_TG)) == NO_BASE_URL, "a local address: the terminal's user's only"
    public = make_core(PUBLIC_BASE_URL=BASE)
    public.web_url = "http://127.0.0.1:8765"
    found = LINK.search(await web(public, terminal))
    assert found is not None and found.group(1).startswith(f"{BASE}/signin?code="), "the public address first"


async def test_the_link_uses_the_webhooks_origin_unless_a_public_address_is_set(make_core: MakeCore) -> None:
    webhook = "https://hooks.example.org:8443/telegram/hook"
    found = LINK.search(await web(make_core(TELEGRAM_WEBHOOK_URL=webhook), ann()))
    assert found is not None and found.group(1).startswith("https://hooks.example.org:8443/signin?code=")
    found = LINK.search(await web(make_core(TELEGRAM_WEBHOOK_URL=webhook, PUBLIC_BASE_URL=f"{BASE}/bot/"), ann()))
    assert found is not None and found.group(1).startswith(f"{BASE}/bot/signin?code=")


@pytest.mark.parametrize(
    "value", ["bot.example.com", "ftp://bot.example.com", "https://bot.example.com/?a=1", "https://u:p@bot.example.com"]
)
def test_a_public_address_is_an_http_url_without_query(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PUBLIC_BASE_URL", raising=False)
    with pytest.raises(SettingsError, match=r"^PUBLIC_BASE_URL: must be an http\(s\) address"):
        load_settings(PUBLIC_BASE_URL=value, _env_file=None)


async def test_export_lists_sign_ins_without_secrets_and_forget_me_deletes_them(
    make_core: MakeCore, clock: FakeClock
) -> None:
    core = make_core(PUBLIC_BASE_URL=BASE)
    login = await redeem(core.pool, await new_code(core, ann()), clock())
    assert login is not None
    await sign_out(core.pool, login.secret, clock())
    kept = await redeem(core.pool, await new_code(core, ann()), clock())
    unused = await new_code(core, ann())
    assert kept is not None
    answer = await core.command(ann(), "export", "", must_answer=True)
    assert isinstance(answer, FileAnswer)
    [who] = json.loads(answer.data)["identities"]
    assert [s["signed_out_at"] is None for s in who["web_sign_ins"]] == [False, True]
    assert [x["used_at"] is None for x in who["web_links"]] == [False, False, True]
    text = answer.data.decode()
    stored = await core.pool.fetch("SELECT secret_hash AS h FROM web_signins UNION SELECT code_hash FROM web_links")
    assert not any(r["h"].hex() in text for r in stored)
    assert not any(s in text for s in (login.secret, login.csrf, kept.secret, kept.csrf, unused))
    await core.command(ann(), "forget_me", "confirm", must_answer=True)
    assert await core.pool.fetchval("SELECT count(*) FROM web_signins") == 0
    assert await core.pool.fetchval("SELECT count(*) FROM web_links") == 0
    assert await authenticate(core.pool, kept.secret, clock()) is None
