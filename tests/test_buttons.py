"""The one button codec (core/buttons.py): every press packs into what Telegram and Discord carry and back, the forms
of buttons sent before it still read the same, and anything else is no button of ours."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core import COMMANDS, Allow, Confirm, OnTask, Press, ShowSteps, pack, unpack
from core.commands.base import Ask, Command

TELEGRAM_CALLBACK_BYTES = 64  # Bot API: callback_data is 1-64 bytes
DISCORD_CUSTOM_ID = 100  # a component's custom_id is at most 100 characters

ids = st.integers(min_value=1, max_value=10**18 - 1)
owners = st.integers(min_value=1, max_value=2**63 - 1).map(str)
words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
presses: st.SearchStrategy[Press] = st.one_of(
    st.builds(OnTask, st.sampled_from(["done", "snooze10", "snooze60", "undo"]), ids),
    st.builds(ShowSteps, ids, st.booleans()),
    st.builds(Allow, ids),
    st.builds(Confirm, words, st.dictionaries(words, st.text(max_size=8), max_size=2), owners),
)


@given(presses)
def test_every_press_packs_and_unpacks_to_itself(press: Press) -> None:
    assert unpack(pack(press)) == press


def test_the_forms_of_buttons_sent_before_the_codec_read_the_same() -> None:
    assert unpack("mem:wipe:1001") == Confirm("memory", {"action": "wipe", "confirm": "true"}, "1001")
    assert unpack("forget:2001") == Confirm("forget_me", {"confirm": "true"}, "2001")
    assert unpack("model:1:1a2b3c4d:1001") == Confirm("model", {"choice": "1:1a2b3c4d"}, "1001")
    assert unpack("rem:snooze10:12") == OnTask("snooze10", 12)
    assert unpack("steps:7:shown") == ShowSteps(7, True)
    assert unpack("mcp:ok:5") == Allow(5)
    assert pack(Confirm("memory", {"action": "wipe", "confirm": "true"}, "1001")) == "mem:wipe:1001"
    assert pack(Confirm("model", {"choice": "1:1a2b3c4d"}, "1001")) == "model:1:1a2b3c4d:1001"


def test_what_is_no_button_of_ours_unpacks_to_nothing() -> None:
    for data in (
        "",
        "rem:done:",
        "rem:done:not-a-task",
        "steps:x",
        "mem:wipe:",
        "model:1:zz:1",
        "cmd:memory",
        "other:1",
        "mcp:ok:1" + "0" * 19,
    ):
        assert unpack(data) is None, data


def test_the_buttons_the_commands_send_fit_both_platforms() -> None:
    largest: list[Press] = [
        OnTask("snooze60", 10**18 - 1),
        ShowSteps(10**18 - 1, True),
        Allow(10**18 - 1),
        Confirm("memory", {"action": "wipe", "confirm": "true"}, str(2**63 - 1)),
        Confirm("forget_me", {"confirm": "true"}, str(2**63 - 1)),
        Confirm("model", {"choice": "99:1a2b3c4d"}, str(2**63 - 1)),
    ]
    for press in largest:
        data = pack(press)
        assert len(data.encode()) <= TELEGRAM_CALLBACK_BYTES and len(data) <= DISCORD_CUSTOM_ID, data


def test_each_command_is_one_declaration_with_its_handler() -> None:
    names = [c.name for c in COMMANDS]
    assert len(names) == len(set(names))
    for command in COMMANDS:
        assert isinstance(command, Command) and callable(command.run)
        assert command.run.__doc__, f"/{command.name}'s handler says what it does"
    assert Ask.__doc__
