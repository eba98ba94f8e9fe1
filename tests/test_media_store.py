"""Attachments in PostgreSQL (issue 23, sql/028): per account, within its storage cap (two at once cannot both pass
it), paged text readable only by its account, moved by /link, listed by /export, gone with /forget_me."""

from __future__ import annotations

import asyncio
import json

import pytest

from core import FileAnswer
from core.media import store
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.helpers import incoming
from tests.test_accounts_attacks import link


async def ids_of(core: object, pool: Pool, user: str, platform: str = "telegram") -> tuple[int, int]:
    """(account id, identity id) of a user who has written once."""
    row = await pool.fetchrow(
        "SELECT account_id, id FROM users WHERE platform = $1 AND platform_user_id = $2", platform, user
    )
    assert row is not None
    return row["account_id"], row["id"]


async def test_saved_per_account_paged_and_capped(make_core: MakeCore, pool: Pool, clock: FakeClock) -> None:
    core = make_core()
    await core.command(incoming("/tasks", user="61"), "tasks")
    await core.command(incoming("/tasks", user="62", name="Bob"), "tasks")
    ann, ann_id = await ids_of(core, pool, "61")
    bob, _ = await ids_of(core, pool, "62")
    doc = await store.save(
        pool, account_id=ann, identity_id=ann_id, chat_id=None, turn_id=None, kind="document", name="contract.pdf",
        mime="application/pdf", platform_ref="tg-file-1", data=None, pages=["page one", "page two"], total_pages=2,
        now=clock(), cap_bytes=1000,
    )  # fmt: skip
    found = await store.page(pool, ann, doc, 2)
    assert found is not None and found[1] == "page two" and found[0].name == "contract.pdf"
    assert await store.page(pool, ann, doc, 3) is None
    assert await store.page(pool, bob, doc, 1) is None, "another account's attachment does not exist for Bob"
    assert await store.used_bytes(pool, ann) == len("page one") + len("page two")
    with pytest.raises(store.StorageFull) as refused:
        await store.save(
            pool, account_id=ann, identity_id=ann_id, chat_id=None, turn_id=None, kind="photo", name="",
            mime="image/jpeg", platform_ref=None, data=b"x" * 990, pages=None, total_pages=None, now=clock(),
            cap_bytes=1000,
        )  # fmt: skip
    assert "already take 0.0 MB of the 0.0 MB" in str(refused.value) and "\n" not in str(refused.value)


async def test_two_at_once_cannot_both_pass_the_cap(make_core: MakeCore, pool: Pool, clock: FakeClock) -> None:
    """A file stored while another one's transaction is still open waits for it and then sees it: one passes."""
    core = make_core()
    await core.command(incoming("/tasks", user="63"), "tasks")
    ann, ann_id = await ids_of(core, pool, "63")
    args = (ann, ann_id, None, None, "photo", "", "image/jpeg", None, 600, b"y" * 600, None, None, clock(), 1000)

    async def second() -> int | None:
        try:
            return await store.save(
                pool, account_id=ann, identity_id=ann_id, chat_id=None, turn_id=None, kind="photo", name="",
                mime="image/jpeg", platform_ref=None, data=b"y" * 600, pages=None, total_pages=None, now=clock(),
                cap_bytes=1000,
            )  # fmt: skip
        except store.StorageFull:
            return None

    async with pool.acquire() as first, first.transaction():
        await first.execute(store._LOCK_SQL, ann)
        stored = await first.fetchrow(store._SAVE_SQL, *args)
        assert stored is not None and stored["id"] is not None  # stored, not committed yet
        task = asyncio.create_task(second())
        for _ in range(500):  # until it waits for the lock (or, without one, has stored past the cap)
            waiting = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'"
            )
            if waiting or task.done():
                break
            await asyncio.sleep(0.01)
    assert await task is None, "the second file saw the first and was refused"
    assert await store.used_bytes(pool, ann) == 600


async def test_attachments_move_with_link_show_in_export_and_go_with_forget_me(
    make_core: MakeCore, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    ann_tg = incoming("/link", user="64", name="Ann")
    ann_dc = incoming("/link", platform="discord", user="6400", name="Ann")
    await core.command(ann_dc, "tasks")
    dc_account, dc_identity = await ids_of(core, pool, "6400", "discord")
    att = await store.save(
        pool, account_id=dc_account, identity_id=dc_identity, chat_id=None, turn_id=None, kind="voice", name="voice",
        mime="audio/ogg", platform_ref="dc-1", data=None, pages=["remind me to water the Quokka plant"], total_pages=1,
        now=clock(), cap_bytes=10_000,
    )  # fmt: skip
    await link(core, ann_tg, ann_dc)
    tg_account, _ = await ids_of(core, pool, "64")
    assert await store.page(pool, tg_account, att, 1) is not None, "moved to the linked account"
    exported = await core.command(ann_tg, "export")
    assert isinstance(exported, FileAnswer)
    [kept] = json.loads(exported.data)["attachments"]
    assert kept["kind"] == "voice" and kept["pages"] == ["remind me to water the Quokka plant"]
    said = await core.command(ann_tg, "forget_me", {"confirm": "true"}, must_answer=True)
    assert isinstance(said, str)
    assert await pool.fetchval("SELECT count(*) FROM attachments") == 0
