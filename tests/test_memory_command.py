"""/memory through the core's front door: shown without the LLM, per person, one line forgotten, a confirmed wipe."""

from __future__ import annotations

from collections.abc import Sequence

from core import MEMORY_WIPE_CONFIRM, Buttons, CommandArgs, Confirm, Core, Error, Incoming
from core.commands import HELP
from core.memory.blocks import Block, store
from core.memory.search import insert_archival
from core.storage import conversations
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI
from tests.helpers import incoming

ANN = incoming("/memory", user="100", name="Ann")
BOB = incoming("/memory", user="200", name="Bob")


async def remember(
    core: Core, inc: Incoming, human: Sequence[str], archival: Sequence[str] = (), **blocks: Sequence[str]
) -> int:
    """Give the speaker of `inc` memory as the tools would leave it; returns their user id."""
    user, _ = await conversations.identify(core.pool, inc, core.settings.DEFAULT_TIMEZONE)
    async with core.pool.acquire() as conn:
        for name, lines in {"human": human, **blocks}.items():
            await store(conn, user.id, Block(name, tuple(lines)))
    for text in archival:
        await insert_archival(core.pool, user.id, text, core.clock())
    return user.id


async def memory(core: Core, inc: Incoming, arg: CommandArgs | str = "") -> str:
    """The text /memory answers (an allowed user always gets one; a wipe's question comes with its button)."""
    answer = await core.command(inc, "memory", arg, must_answer=True)
    if isinstance(answer, Buttons):
        assert [b.press for row in answer.rows for b in row] == [Confirm("memory", MEMORY_WIPE_CONFIRM, inc.user_id)]
        return answer.text
    assert isinstance(answer, str), answer
    return answer


async def test_memory_shows_numbered_blocks_and_archival_count_without_the_llm(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = make_core()
    await remember(core, ANN, ["Name: Ann", "Works at: Google"], ["likes oat milk", "allergic to cats"])
    text = await memory(core, ANN)
    assert "[human] Facts about the user (2 lines, 5/500 words)\n1: Name: Ann\n2: Works at: Google\n" in text
    assert "[persona]" in text and "Archival memory: 2 entries" in text
    assert "/memory forget" in text and "/memory wipe" in text  # how to erase, right where it is shown
    assert fake_llm.requests == []


async def test_another_persons_memory_shows_nothing_of_the_first(make_core: MakeCore) -> None:
    core = make_core()
    await remember(core, ANN, ["Name: Ann", "Secret: sings in the shower"], ["Ann's passport number"])
    text = await memory(core, BOB)
    assert "Ann" not in text and "shower" not in text and "passport" not in text
    assert "(0 lines" in text and "Archival memory: 0 entries" in text
    assert "Bob" not in await memory(core, ANN)


async def test_forget_one_line_and_out_of_range_is_one_line(make_core: MakeCore) -> None:
    core = make_core()
    await remember(core, ANN, ["Name: Ann", "Works at: Google", "Likes tea"], projects=["Garden"])
    assert await memory(core, ANN, "forget human 2") == "Forgot line 2 of [human]: “Works at: Google”."
    text = await memory(core, ANN)
    assert "1: Name: Ann\n2: Likes tea" in text and "Google" not in text
    assert await memory(core, ANN, "forget user 9") == "line 9 does not exist in [human]; valid lines: 1-2"
    assert await memory(core, ANN, "forget persona 1") == "[persona] has no lines"
    unknown = await memory(core, ANN, "forget hobbies 1")
    assert "hobbies" in unknown and "\n" not in unknown
    assert await memory(core, BOB, "forget human 1") == "[human] has no lines"  # Bob cannot reach Ann's lines
    assert "1: Name: Ann" in await memory(core, ANN)
    assert await memory(core, ANN, "forget human 99999999999999999999") == (
        "line 99999999999999999999 does not exist in [human]; valid lines: 1-2"
    )
    assert await memory(core, ANN, "forget human ²") == await memory(core, ANN, "forget human " + "9" * 5000)
    assert await memory(core, ANN, "forget human") == await memory(core, ANN, "what is this")  # the usage line
    assert (await memory(core, ANN, "forget human")).startswith("Use /memory")


async def test_wipe_asks_first_then_empties_blocks_and_archival(make_core: MakeCore) -> None:
    core = make_core()
    ann = await remember(core, ANN, ["Name: Ann", "Works at: Google"], ["likes oat milk"], projects=["Garden"])
    bob = await remember(core, BOB, ["Name: Bob"], ["Bob's note"])
    ask = await memory(core, ANN, "wipe")
    assert "3 lines and 1 archival entry" in ask and "/memory wipe confirm" in ask
    assert await core.pool.fetchval("SELECT count(*) FROM memory_blocks WHERE user_id = $1", ann) == 2
    assert await core.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", ann) == 1
    done = await memory(core, ANN, MEMORY_WIPE_CONFIRM)
    assert done.startswith("Done — I erased 3 lines and 1 archival entry.")
    assert await core.pool.fetchval("SELECT count(*) FROM memory_blocks WHERE user_id = $1", ann) == 0
    assert await core.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", ann) == 0
    assert "Archival memory: 0 entries" in await memory(core, ANN)
    assert await core.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", bob) == 1
    assert "1: Name: Bob" in await memory(core, BOB)


async def test_not_allowed_user_gets_the_refusal(make_core: MakeCore) -> None:
    core = make_core(ALLOWED_USERS="telegram:100")
    await remember(core, ANN, ["Name: Ann"])
    stranger = incoming("/memory", user="300", name="Eve")
    for arg in ("", "wipe", MEMORY_WIPE_CONFIRM, "forget human 1"):
        answer = await core.command(stranger, "memory", arg, must_answer=True)
        assert isinstance(answer, Error) and answer.code == "not_allowed" and "telegram:300" in answer.message
    assert "1: Name: Ann" in await memory(core, ANN)


def test_help_mentions_memory() -> None:
    assert "/memory" in HELP and "/memory forget human 2" in HELP and "/memory wipe" in HELP
