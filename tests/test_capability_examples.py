"""The shipped example capabilities go through write_capability's real checks, store and loader, and work."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from core.front_door import Core
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, incoming, run, tool_messages

EXAMPLES = Path(__file__).resolve().parent.parent / "capabilities" / "examples"
ADMIN = "1"
MEMBER = "2"


def example(name: str) -> tuple[str, str, dict[str, Any]]:
    """An example's code (the file's text, unchanged), description (its docstring) and PARAMETERS."""
    module = importlib.import_module(f"capabilities.examples.{name}")
    assert module.__doc__ is not None
    return (EXAMPLES / f"{name}.py").read_text(encoding="utf-8"), module.__doc__.strip(), module.PARAMETERS


async def call(core: Core, fake: FakeOpenAI, name: str, args: dict[str, Any], user: str = ADMIN) -> dict[str, Any]:
    """Have the (scripted) model call one tool; returns the envelope it got back."""
    fake.script(Reply(tool_calls=[(name, args)]), Reply(text="ok"))
    answer(await run(core, incoming(f"call {name}", user=user)))
    return tool_messages(fake.requests[-1])[-1]


async def written(core: Core, fake: FakeOpenAI, pool: Pool, capabilities_dir: Path, name: str) -> None:
    """Write the example through write_capability as an admin; it is stored and materialised as it stands."""
    code, description, schema = example(name)
    args = {"name": name, "description": description, "code": code, "parameters_schema": schema}
    env = await call(core, fake, "write_capability", args)
    assert env == {"ok": True, "result": {"name": name, "version": 1, "summary": f"{name} v1 saved and loaded"}}
    assert await pool.fetchval("SELECT code FROM capability_versions WHERE name = $1", name) == code
    assert (capabilities_dir / f"{name}_v1.py").read_text(encoding="utf-8") == code


def test_every_example_is_tested_here() -> None:
    assert sorted(p.stem for p in EXAMPLES.glob("[!_]*.py")) == ["days_until", "my_open_tasks", "split_bill"]


@pytest.mark.parametrize(
    ("zone", "days"), [("UTC", 34), ("Pacific/Kiritimati", 33)]
)  # the fake clock: Sat 2026-11-21 10:00 UTC, already Sunday at UTC+14
async def test_days_until_counts_from_the_speakers_today(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, capabilities_dir: Path, zone: str, days: int
) -> None:
    core = make_core(ADMINS=f"telegram:{ADMIN}", DEFAULT_TIMEZONE=zone)
    await written(core, fake_llm, pool, capabilities_dir, "days_until")
    env = await call(core, fake_llm, "days_until", {"date": "2026-12-25"}, user=MEMBER)
    assert env == {"ok": True, "result": {"date": "2026-12-25", "weekday": "Friday", "days": days}}
    bad = await call(core, fake_llm, "days_until", {"date": "Christmas"})
    assert bad["error"]["code"] == "tool_error" and bad["error"]["message"].startswith("ValueError: Invalid isoformat")


async def test_my_open_tasks_shows_only_the_speakers_open_tasks(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, capabilities_dir: Path, clock: FakeClock
) -> None:
    core = make_core(ADMINS=f"telegram:{ADMIN}", DEFAULT_TIMEZONE="Europe/Berlin")
    await written(core, fake_llm, pool, capabilities_dir, "my_open_tasks")
    for user, title, due in (
        (MEMBER, "pay rent", "2026-11-21T12:00"),
        (MEMBER, "call mum", "2026-11-23T18:30"),
        (MEMBER, "someday", None),
        (MEMBER, "finished", None),
        (ADMIN, "admin's task", None),
    ):
        created = await call(core, fake_llm, "manage_tasks", {"action": "create", "title": title, "due_at": due}, user)
        assert created["ok"], created
    done = await pool.fetchval("SELECT id FROM tasks WHERE title = 'finished'")
    assert (await call(core, fake_llm, "manage_tasks", {"action": "complete", "id": done}, MEMBER))["ok"]
    started = await pool.fetchval("SELECT id FROM tasks WHERE title = 'someday'")
    args = {"action": "update", "id": started, "status": "in_progress"}
    assert (await call(core, fake_llm, "manage_tasks", args, MEMBER))["ok"]
    clock.advance(hours=2)  # 13:00 in Berlin: the rent is overdue now
    env = await call(core, fake_llm, "my_open_tasks", {}, user=MEMBER)
    ids = {r["title"]: r["id"] for r in await pool.fetch("SELECT title, id FROM tasks")}
    assert env == {
        "ok": True,
        "result": {
            "as_of": "2026-11-21 13:00",
            "timezone": "Europe/Berlin",
            "tasks": [
                {
                    "id": ids["pay rent"],
                    "title": "pay rent",
                    "status": "pending",
                    "due": "2026-11-21 12:00",
                    "overdue": True,
                },
                {
                    "id": ids["call mum"],
                    "title": "call mum",
                    "status": "pending",
                    "due": "2026-11-23 18:30",
                    "overdue": False,
                },
                {"id": ids["someday"], "title": "someday", "status": "in_progress", "due": None, "overdue": False},
            ],
        },
    }
    one = await call(core, fake_llm, "my_open_tasks", {"limit": 1}, user=MEMBER)
    assert [t["title"] for t in one["result"]["tasks"]] == ["pay rent"]
    admin = await call(core, fake_llm, "my_open_tasks", {}, user=ADMIN)  # an admin may read all rows: still only theirs
    assert [t["title"] for t in admin["result"]["tasks"]] == ["admin's task"]


async def test_split_bill_takes_params_alone_and_its_shares_add_up(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, capabilities_dir: Path
) -> None:
    core = make_core(ADMINS=f"telegram:{ADMIN}")
    await written(core, fake_llm, pool, capabilities_dir, "split_bill")
    env = await call(core, fake_llm, "split_bill", {"total": 100, "people": 3, "tip_percent": 10}, user=MEMBER)
    assert env == {"ok": True, "result": {"with_tip": 110.0, "shares": [36.67, 36.67, 36.66]}}
    refused = await call(core, fake_llm, "split_bill", {"total": 10, "people": 0})
    assert refused["error"]["code"] == "invalid_args"
