"""Per-account bearer tokens (issue 22, who may call the API; core/accounts/api_tokens.py, sql/025): `/token` in a
private chat lists, makes (shown once, stored hashed) and revokes them, `bot token` makes one for the terminal user,
and authenticate() says which identity and account a secret acts as."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from core import Core, FileAnswer, Incoming
from core.accounts.api_tokens import Bearer, authenticate
from core.commands import HELP
from core.constants import API_TOKEN_MAX_LIVE
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI
from tests.helpers import incoming
from tests.test_console import bot_cli
from tests.test_own_data import traces

SECRET = re.compile(r"abt_[A-Za-z0-9_-]{32}")
CODE = re.compile(r"\b([2-9A-Z]{4}-[2-9A-Z]{4})\b")
ANN_TG, ANN_DC, BOB_TG = "7100", "7200", "7300"


def ann(*, platform: str = "telegram", group: bool = False) -> Incoming:
    """Ann on Telegram (privately or in a group) or in her Discord DM."""
    if platform == "discord":
        return incoming("/token", platform="discord", user=ANN_DC, chat="9200", name="Ann")
    return incoming("/token", user=ANN_TG, chat="-100" if group else None, kind="group" if group else "private")


def bob() -> Incoming:
    """Bob in his private Telegram chat."""
    return incoming("/token", user=BOB_TG, name="Bob")


async def token(core: Core, inc: Incoming, typed: str = "") -> str:
    """What `/token <typed>` answers."""
    said = await core.command(inc, "token", typed, must_answer=True)
    assert isinstance(said, str)
    return said


async def new_secret(core: Core, inc: Incoming, name: str) -> str:
    """`/token new <name>` → the secret it shows."""
    found = SECRET.search(await token(core, inc, f"new {name}"))
    assert found is not None
    return found.group()


async def test_new_shows_the_secret_once_and_stores_only_its_hash(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core()
    assert "/token" in HELP
    assert await token(core, ann()) == "You have no tokens. /token new <name> makes one, e.g. /token new laptop."
    made = await token(core, ann(), "new laptop")
    secret = SECRET.search(made)
    assert secret is not None and "only this once" in made and "/token revoke laptop" in made
    listed = await token(core, ann())
    assert "`laptop` — made " in listed and "last used never" in listed and secret.group() not in listed
    stored = await core.pool.fetchval("SELECT token_hash FROM api_tokens")
    assert stored == hashlib.sha256(secret.group().encode()).digest()
    assert await traces(core.pool, [secret.group()], []) == []  # no table holds the secret
    assert await token(core, ann(), "new laptop") == (
        "You already have a token named `laptop`: pick another name, or /token revoke laptop first."
    )
    assert "letters, digits" in await token(core, ann(), "new my laptop")
    assert "letters, digits" in await token(core, ann(), "new")
    assert (await token(core, ann(), "frobnicate")).startswith("Use /token to list")
    assert await core.pool.fetchval("SELECT count(*) FROM api_tokens") == 1


async def test_authenticate_gives_the_identity_and_account_until_revoked(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core()
    secret = await new_secret(core, ann(), "laptop")
    identity = await core.pool.fetchrow("SELECT id, account_id FROM users WHERE platform_user_id = $1", ANN_TG)
    assert identity is not None
    bearer = await authenticate(core.pool, secret, clock())
    assert bearer is not None
    assert bearer == Bearer(
        bearer.token_id, "laptop", identity["id"], identity["account_id"], "telegram", ANN_TG, "Ann"
    )
    assert bearer.user_key == f"telegram:{ANN_TG}"
    assert await authenticate(core.pool, secret[:-1] + ("A" if secret[-1] != "A" else "B"), clock()) is None
    assert await authenticate(core.pool, "", clock()) is None
    assert await authenticate(core.pool, secret + "x", clock()) is None
    # last used: noted, then at most once a minute
    first = clock()
    assert "last used never" not in await token(core, ann())
    clock.advance(seconds=30)
    await authenticate(core.pool, secret, clock())
    assert await core.pool.fetchval("SELECT last_used_at FROM api_tokens") == first
    clock.advance(seconds=31)
    await authenticate(core.pool, secret, clock())
    assert await core.pool.fetchval("SELECT last_used_at FROM api_tokens") == clock()
    assert await token(core, ann(), "revoke laptop") == "Revoked **laptop**: it no longer works."
    assert await authenticate(core.pool, secret, clock()) is None
    assert await token(core, ann(), "revoke laptop") == "You have no token named `laptop`; /token lists yours."
    assert (await token(core, ann())).startswith("You have no tokens.")
    await new_secret(core, ann(), "laptop")  # the name is free again


async def test_another_account_cannot_revoke_or_see_yours(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core()
    secret = await new_secret(core, ann(), "laptop")
    assert await token(core, bob(), "revoke laptop") == "You have no token named `laptop`; /token lists yours."
    assert (await token(core, bob())).startswith("You have no tokens.")
    assert await authenticate(core.pool, secret, clock()) is not None
    await new_secret(core, bob(), "laptop")  # names are per account


async def test_only_in_a_private_chat(make_core: MakeCore) -> None:
    core = make_core()
    for typed in ("", "new laptop", "revoke laptop"):
        assert await token(core, ann(group=True), typed) == "Send /token to me in a private chat."
    assert await core.pool.fetchval("SELECT count(*) FROM api_tokens") == 0


async def test_at_most_so_many_live_tokens_per_account(make_core: MakeCore) -> None:
    core = make_core()
    for n in range(API_TOKEN_MAX_LIVE):
        await new_secret(core, ann(), f"t{n}")
    assert (await token(core, ann(), "new one-more")).startswith(f"You have {API_TOKEN_MAX_LIVE} tokens, the most")
    await token(core, ann(), "revoke t0")
    await new_secret(core, ann(), "one-more")


async def test_admin_rights_stay_with_the_identity(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core(ADMINS=f"telegram:{ANN_TG}")
    code = CODE.search(str(await core.command(ann(), "link", "", must_answer=True)))
    assert code is not None
    linked = await core.command(ann(platform="discord"), "link", code.group(1), must_answer=True)
    assert isinstance(linked, str) and "one account" in linked
    admin = await authenticate(core.pool, await new_secret(core, ann(), "tg"), clock())
    member = await authenticate(core.pool, await new_secret(core, ann(platform="discord"), "dc"), clock())
    assert admin is not None and member is not None and admin.account_id == member.account_id
    as_seen = [incoming("x", platform=b.platform, user=b.platform_user_id) for b in (admin, member)]
    assert [core.is_admin(inc) for inc in as_seen] == [True, False]
    listed = await token(core, ann(platform="discord"))  # one account: both tokens listed on either platform
    assert "`tg`" in listed and "`dc`" in listed


async def test_tokens_follow_their_identity_through_link_and_unlink(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core()
    dc_secret = await new_secret(core, ann(platform="discord"), "laptop")
    await new_secret(core, ann(), "laptop")
    code = CODE.search(str(await core.command(ann(), "link", "", must_answer=True)))
    assert code is not None
    await core.command(ann(platform="discord"), "link", code.group(1), must_answer=True)
    tg_account = await core.pool.fetchval("SELECT account_id FROM users WHERE platform_user_id = $1", ANN_TG)
    merged = await authenticate(core.pool, dc_secret, clock())  # the merged account is gone, the token is not
    assert merged is not None and merged.account_id == tg_account and merged.platform == "discord"
    names = await core.pool.fetch("SELECT name FROM api_tokens WHERE account_id = $1", tg_account)
    assert {r["name"] for r in names} == {"laptop", f"laptop-{merged.token_id}"}  # a clashing name: its id appended
    await core.command(ann(), "unlink", f"discord:{ANN_DC}", must_answer=True)
    apart = await authenticate(core.pool, dc_secret, clock())
    assert apart is not None and apart.account_id != tg_account and apart.platform == "discord"
    assert "laptop" in await token(core, ann(platform="discord"))


async def test_export_names_tokens_and_forget_me_deletes_them(make_core: MakeCore, clock: FakeClock) -> None:
    core = make_core()
    secret = await new_secret(core, ann(), "laptop")
    await token(core, ann(), "revoke laptop")
    await new_secret(core, ann(), "phone")
    answer = await core.command(ann(), "export", "", must_answer=True)
    assert isinstance(answer, FileAnswer)
    [identity] = json.loads(answer.data)["identities"]
    assert [(t["name"], t["revoked_at"] is None) for t in identity["api_tokens"]] == [
        ("laptop", False),
        ("phone", True),
    ]
    stored = await core.pool.fetch("SELECT token_hash FROM api_tokens")
    assert not any(r["token_hash"].hex() in answer.data.decode() for r in stored) and secret not in answer.data.decode()
    await core.command(ann(), "forget_me", "confirm", must_answer=True)
    assert await core.pool.fetchval("SELECT count(*) FROM api_tokens") == 0


async def test_bot_token_prints_a_token_of_the_terminal_user(
    fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path, pool: Pool, clock: FakeClock
) -> None:
    env = {"DATABASE_URL": db_dsn, "LLM_BASE_URL": fake_llm.base_url}
    code, out, err = await bot_cli("token", "ci", env=env, cwd=tmp_path)
    assert code == 0, err
    [secret] = SECRET.findall(out)
    assert out.startswith("API token ci (shown only this once;") and "**" not in out, "plain text in a terminal"
    bearer = await authenticate(pool, secret, clock())
    assert bearer is not None and (bearer.name, bearer.user_key) == ("ci", "console:local")
    code, out, err = await bot_cli("token", "ci", env=env, cwd=tmp_path)  # the name is taken: nothing printed
    assert (code, out) == (1, "") and "already have a token named `ci`" in err
    code, out, _ = await bot_cli("token", env=env, cwd=tmp_path)  # a default name
    assert code == 0 and re.match(r"API token terminal-\d{8}-\d{6} \(", out) and SECRET.search(out)
    assert fake_llm.requests == []
