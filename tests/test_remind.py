"""`/remind <when> <what>`: what is read from the person's words (dateparser, repeating forms), and the reminder the
core makes of it without a model call, with its Undo, its limits and its place among the person's tasks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.console import ConsoleOutbox
from core import Error, Reminded
from core.reminders.engine import ReminderEngine
from core.reminders.recurrence import Recurrence
from core.reminders.when import Understood, languages_of, understand, understand_parts
from core.timeutil import fmt_local
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import incoming, run

BERLIN = ZoneInfo("Europe/Berlin")
NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)  # Saturday 11:00 in Berlin (the clock fixture's time)


def read(text: str, tz: ZoneInfo = BERLIN, languages: tuple[str, ...] = ()) -> Understood:
    """What `text` is understood as (the test fails with the refusal when it is not)."""
    got = understand(text, tz, NOW, languages)
    assert isinstance(got, Understood), got
    return got


def when(text: str, tz: ZoneInfo = BERLIN) -> str:
    """The local time `text` is read as, as the answer shows it."""
    got = read(text, tz)
    assert got.due is not None and got.repeat is None
    return fmt_local(got.due, tz, NOW)


@pytest.mark.parametrize(
    ("text", "due", "what"),
    [
        ("in 10 minutes Buy milk", "Sat 21 Nov 11:10 CET", "Buy milk"),
        ("tomorrow 9:00 Buy milk", "Sun 22 Nov 09:00 CET", "Buy milk"),
        ("friday 18:30 Call mum", "Fri 27 Nov 18:30 CET", "Call mum"),
        ("2026-12-24 08:00 Presents", "Thu 24 Dec 08:00 CET", "Presents"),
        ("morgen um 9 Zahnarzt", "Sun 22 Nov 09:00 CET", "Zahnarzt"),
        ("demain 9h Boulangerie", "Sun 22 Nov 09:00 CET", "Boulangerie"),
        ("saturday 18:00 Party", "Sat 21 Nov 18:00 CET", "Party"),  # today's weekday, later today: today
        ("9:00 Gym", "Sun 22 Nov 09:00 CET", "Gym"),  # a time already past today: tomorrow
        ("in 3 days Call the bank", "Tue 24 Nov 11:00 CET", "Call the bank"),  # from now: no time of day needed
        ("in 2h Tea", "Sat 21 Nov 13:00 CET", "Tea"),  # two hours from now, not 2:00
        ("morgen um 9 Uhr 30 Bäcker", "Sun 22 Nov 09:30 CET", "Bäcker"),
        ("tomorrow at 9pm Bins out", "Sun 22 Nov 21:00 CET", "Bins out"),
        ("in 10 minutes to take the pizza out", "Sat 21 Nov 11:10 CET", "take the pizza out"),
        ("tomorrow 9:00 May the 4th party", "Sun 22 Nov 09:00 CET", "May the 4th party"),
        ("friday 18:30 — March on", "Fri 27 Nov 18:30 CET", "March on"),  # a separator keeps date words out
    ],
)
def test_one_time_in_the_persons_zone_and_language(text: str, due: str, what: str) -> None:
    assert when(text) == due
    assert read(text).what == what


def test_times_are_the_persons_own_zone() -> None:
    new_york = ZoneInfo("America/New_York")
    got = read("tomorrow 9:00 Standup", new_york)
    assert got.due == datetime(2026, 11, 22, 14, 0, tzinfo=UTC)  # 09:00 EST


def test_the_persons_language_comes_first() -> None:
    assert languages_of("pt-BR") == ("pt",) and languages_of("de") == ("de",) and languages_of("") == ()
    got = understand("amanhã 9:00 Pão", BERLIN, NOW, languages_of("pt-BR"))
    assert isinstance(got, Understood) and got.what == "Pão"
    assert got.due == datetime(2026, 11, 22, 8, 0, tzinfo=UTC)
    unknown = understand("tomorrow 9:00 Tea", BERLIN, NOW, ("xx",))  # a language dateparser does not have
    assert isinstance(unknown, Understood) and unknown.what == "Tea"


@pytest.mark.parametrize(
    ("text", "repeat", "what"),
    [
        ("every day 8:00 Pills", Recurrence(kind="cron", time="08:00"), "Pills"),
        ("every weekday 7:30 Stretch", Recurrence(kind="cron", time="07:30", days_of_week="mon-fri"), "Stretch"),
        ("every monday 10:00 Standup", Recurrence(kind="cron", time="10:00", days_of_week="mon"), "Standup"),
        ("every 2 hours Drink water", Recurrence(kind="interval", every_minutes=120), "Drink water"),
        ("every mon and wed 6pm Gym", Recurrence(kind="cron", time="18:00", days_of_week="mon,wed"), "Gym"),
        ("jeden Montag um 10 Uhr Meeting", Recurrence(kind="cron", time="10:00", days_of_week="mon"), "Meeting"),
        ("tous les jours 8h Café", Recurrence(kind="cron", time="08:00"), "Café"),
    ],
)
def test_repeating_forms_are_the_task_tools_recurrences(text: str, repeat: Recurrence, what: str) -> None:
    got = read(text)
    assert got.repeat == repeat and got.what == what and got.due is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tomorrow Buy milk", "“tomorrow” needs a time of day too, e.g. /remind tomorrow 9:00 Buy milk"),
        ("yesterday 9:00 Buy milk", "yesterday 9:00 is in the past (it is now Sat 21 Nov 11:00 CET)"),
        ("2026-01-01 10:00 Old", "is in the past"),
        ("buy milk", "I could not read a time at the start of “buy milk”. Put the time first, e.g. /remind tomorrow"),
        ("tomorrow 9:00", "What should I remind you of at tomorrow 9:00?"),
        ("every blue moon Dance", "I could not read how “every blue moon Dance” repeats. Forms I know: every day"),
    ],
)
def test_what_is_not_understood_ambiguous_or_past_gets_one_line_with_an_example(text: str, says: str) -> None:
    got = understand(text, BERLIN, NOW)
    assert isinstance(got, str) and says in got and "\n" not in got
    assert "e.g." in got or "Forms I know" in got


def test_a_refusal_stays_one_short_line_whatever_was_sent() -> None:
    got = understand("tomorrow " + "x" * 30_000, BERLIN, NOW)
    assert isinstance(got, str) and "\n" not in got and len(got) < 200
    assert isinstance(understand("tomorrow 9:00 \x00", BERLIN, NOW), str)  # nothing but a NUL: nothing to remind of


def test_remind_alone_explains_itself_with_three_examples() -> None:
    got = understand("", BERLIN, NOW)
    assert isinstance(got, str) and got.count("/remind ") == 3 and "Europe/Berlin" in got


def test_options_given_apart() -> None:
    got = understand_parts("tomorrow 9:00", "Buy milk", BERLIN, NOW)
    assert isinstance(got, Understood) and got.what == "Buy milk"
    assert got.due == datetime(2026, 11, 22, 8, 0, tzinfo=UTC)
    weekly = understand_parts("every weekday 7:30", "Stretch", BERLIN, NOW)
    assert isinstance(weekly, Understood) and weekly.repeat == Recurrence(
        kind="cron", time="07:30", days_of_week="mon-fri"
    )
    assert isinstance(understand_parts("soonish", "x", BERLIN, NOW), str)
    assert isinstance(understand_parts("tomorrow 9:00", "", BERLIN, NOW), str)


@settings(max_examples=40, deadline=None)
@given(minutes=st.integers(min_value=1, max_value=5000), hours=st.booleans())
def test_relative_times_are_exact(minutes: int, hours: bool) -> None:
    unit = "hours" if hours else "minutes"
    got = read(f"in {minutes} {unit} Tea")
    step = timedelta(hours=minutes) if hours else timedelta(minutes=minutes)
    assert got.due == NOW + step and got.what == "Tea"


# ---- the command, through the core -------------------------------------------------------------------------------


async def test_remind_makes_a_normal_task_with_no_model_call(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(DEFAULT_TIMEZONE="Europe/Berlin")
    made = await core.command(incoming("/remind tomorrow 9:00 Buy milk"), "remind", "tomorrow 9:00 Buy milk")
    assert isinstance(made, Reminded)
    assert made.text == f"⏰ #{made.task_id} Buy milk — Sun 22 Nov 09:00 CET"
    row = await core.pool.fetchrow("SELECT title, due_at, status, own_words, timezone FROM tasks")
    assert row is not None and row["title"] == "Buy milk" and row["status"] == "pending"
    assert row["due_at"] == datetime(2026, 11, 22, 8, 0, tzinfo=UTC) and row["own_words"] is True
    listed = await core.command(incoming("/tasks"), "tasks")
    assert isinstance(listed, str) and f"#{made.task_id} Buy milk — Sun 22 Nov 09:00 CET" in listed
    repeating = await core.command(incoming("/remind"), "remind", {"when": "every weekday 7:30", "what": "Stretch"})
    assert isinstance(repeating, Reminded)
    assert repeating.text.endswith("— Mon 23 Nov 07:30 CET 🔁 every mon-fri at 07:30")
    assert fake_llm.requests == []  # not one model call


async def test_undo_deletes_it_only_for_its_owner(make_core: MakeCore) -> None:
    core = make_core()
    made = await core.command(incoming("/remind"), "remind", "in 10 minutes Tea")
    assert isinstance(made, Reminded)
    assert await core.press_reminder(incoming("", user="200"), made.task_id, "undo") == (
        False,
        "Only the person this reminder is for can use these buttons.",
    )
    ok, said = await core.press_reminder(incoming(""), made.task_id, "undo")
    assert ok and said == f"↩️ Undone: #{made.task_id} Tea is deleted."
    assert await core.pool.fetchval("SELECT count(*) FROM tasks") == 0
    again = await core.press_reminder(incoming(""), made.task_id, "undo")
    assert again[0] is False


async def test_nothing_is_made_when_not_understood_or_in_the_past(make_core: MakeCore) -> None:
    core = make_core()
    for text in ("soon Buy milk", "yesterday 9:00 Buy milk", "tomorrow Buy milk", ""):
        said = await core.command(incoming("/remind"), "remind", text)
        assert isinstance(said, str) and "e.g." in said
    assert await core.pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_it_obeys_max_open_tasks_and_the_rate(make_core: MakeCore) -> None:
    core = make_core(MAX_OPEN_TASKS=2, USER_MESSAGES_PER_MINUTE=3)
    for minutes in (10, 20):
        assert isinstance(await core.command(incoming("/remind"), "remind", f"in {minutes} minutes Tea"), Reminded)
    full = await core.command(incoming("/remind"), "remind", "in 30 minutes Tea")
    assert full == "you have 2 open tasks, the most this bot keeps per person; complete or delete some first"
    other = make_core(USER_MESSAGES_PER_MINUTE=3)
    for minutes in (1, 2, 3):
        assert isinstance(await other.command(incoming("/r", user="300"), "remind", f"in {minutes} hours X"), Reminded)
    fast = await other.command(incoming("/r", user="300"), "remind", "in 4 hours X")
    assert fast == "You made 3 reminders in the last minute, the most I take; send the next one in a minute."
    await other.pool.execute("UPDATE tasks SET created_at = created_at - interval '61 seconds'")  # a minute later
    assert isinstance(await other.command(incoming("/r", user="300"), "remind", "in 4 hours X"), Reminded)


async def test_a_stranger_is_refused_and_nothing_is_made(make_core: MakeCore) -> None:
    core = make_core(ALLOWED_USERS="telegram:100")
    refused = await core.command(incoming("/remind", user="666"), "remind", "in 10 minutes Tea", must_answer=True)
    assert isinstance(refused, Error) and "telegram:666" in refused.message
    assert await core.pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_the_model_sees_it_and_the_reminder_arrives(
    make_core: MakeCore, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_core(DEFAULT_TIMEZONE="Europe/Berlin")
    made = await core.command(incoming("/remind"), "remind", "in 10 minutes Take the pizza out")
    assert isinstance(made, Reminded)
    fake_llm.script(Reply(text="noted"))
    await run(core, incoming("what is due?"))
    assert "Take the pizza out" in fake_llm.requests[0]["messages"][0]["content"]  # among the due-soon tasks
    printed: list[str] = []
    engine = ReminderEngine(core.pool, {"telegram": ConsoleOutbox(printed.append)}, clock)
    clock.advance(minutes=10)
    assert await engine.tick() == 1 and "⏰ Take the pizza out — due 11:10" in printed[0]
