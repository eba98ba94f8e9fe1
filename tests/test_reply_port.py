"""The reply port (core/turn/reply.py): the core sends a turn's events through the port a front end hands it, records
the parts the port yields as accepted, and fetches a message's files only for who may use the bot."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

from core.inbox import Delivery
from core.storage.db import Pool
from core.types import Assistant, Error, Spoken, ToolCall, ToolResult, Upload
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import incoming

OGG = b"OggS\x00\x02" + bytes(range(200))


@dataclass
class Port:
    """A front end's port that keeps what the core sent through it, in order; `parts`: how many parts an answer
    is sent in; `fail_after`: a send that fails after that many parts (the platform went away)."""

    streams: bool = True
    parts: int = 1
    fail_after: int | None = None
    seen: list[str] = field(default_factory=list)

    @asynccontextmanager
    async def working(self) -> AsyncIterator[None]:
        """Note when the turn starts and ends."""
        self.seen.append("working")
        try:
            yield
        finally:
            self.seen.append("done")

    async def draft(self, text: str) -> None:
        """Keep the streamed text."""
        self.seen.append(f"draft:{text}")

    async def step(self, event: ToolCall | ToolResult) -> None:
        """Keep the tool's name."""
        self.seen.append(f"{type(event).__name__}:{event.name if isinstance(event, ToolCall) else event.step.name}")

    async def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """Send the parts not sent before, one at a time."""
        for n in range(answer.sent_parts + 1, self.parts + 1):
            if self.fail_after is not None and n > self.fail_after:
                raise ConnectionError("the platform went away")
            self.seen.append(f"part {n}:{answer.text}")
            yield n

    async def error(self, error: Error) -> None:
        """Keep the error's code."""
        self.seen.append(f"error:{error.code}")

    async def voice(self, spoken: Spoken) -> None:
        """Keep that it came."""
        self.seen.append("voice")


async def test_the_core_sends_every_event_through_the_port_in_order(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(tool_calls=[("manage_tasks", {"action": "list"})]), Reply(text="nothing open"))
    port = Port()
    await core.answer(incoming("what is open?"), port)
    drafts = [s for s in port.seen if s.startswith("draft:")]
    assert "".join(d.removeprefix("draft:") for d in drafts) == "nothing open"
    rest = [s for s in port.seen if not s.startswith("draft:")]
    assert rest == [
        "working",
        "ToolCall:manage_tasks",
        "ToolResult:manage_tasks",
        "part 1:nothing open",
        "done",
    ]


async def test_a_port_that_does_not_stream_gets_no_drafts(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(text="hello"))
    port = Port(streams=False)
    await core.answer(incoming("hi"), port)
    assert port.seen == ["working", "part 1:hello", "done"]


async def test_each_part_the_port_yields_is_recorded_so_a_retry_sends_only_the_rest(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    fake_llm.script(Reply(text="long answer"))
    inc = incoming("tell me", message_id="m1")
    first = Delivery("telegram", 1, attempt=1, update=None)
    port = Port(parts=3, fail_after=2)
    try:
        await core.answer(inc, port, delivery=first)
    except ConnectionError:
        pass
    else:
        raise AssertionError("the port's failure should reach the caller (the inbox hands the update back)")
    assert await pool.fetchval("SELECT sent_parts FROM turns") == 2  # recorded by the core, part by part
    again = Port(parts=3)
    await core.answer(inc, again, delivery=Delivery("telegram", 1, attempt=2, update=None))
    assert again.seen == ["working", "part 3:long answer", "done"]  # the stored answer, only what did not go out
    assert len(fake_llm.requests) == 1, "not asked again"


async def test_a_strangers_file_is_never_fetched(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(ALLOWED_USERS="telegram:100")
    loads: list[str] = []

    def voice(user: str) -> Upload:
        base = Upload("voice", "v.ogg", "audio/ogg", None, platform_ref=f"file-{user}")

        async def load() -> Upload:
            loads.append(user)
            return replace(base, data=OGG)

        return replace(base, load=load)

    fake_llm.default = Reply(text="ok")
    fake_llm.script_transcripts(Reply(text="call the plumber"))
    stranger = Port()
    await core.answer(replace(incoming("", user="666", message_id="s1"), uploads=(voice("666"),)), stranger)
    assert stranger.seen == ["working", "error:not_allowed", "done"]
    friend = Port()
    await core.answer(replace(incoming("", user="100", message_id="f1"), uploads=(voice("100"),)), friend)
    assert loads == ["100"], "fetched once, for the person who may use the bot only"
    assert fake_llm.requests[-1]["messages"][-1]["content"] == "call the plumber"


async def test_files_past_the_persons_rate_are_not_fetched(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(USER_MESSAGES_PER_MINUTE=1)
    fake_llm.default = Reply(text="ok")
    loads: list[int] = []

    def voice(i: int) -> Upload:
        base = Upload("voice", "v.ogg", "audio/ogg", None)

        async def load() -> Upload:
            loads.append(i)
            return replace(base, data=OGG)

        return replace(base, load=load)

    fake_llm.script_transcripts(Reply(text="first note"))
    for i in range(3):
        await core.answer(replace(incoming("", user="77", message_id=str(i)), uploads=(voice(i),)), Port())
    assert loads == [0], "the second and third notes are not even downloaded"


async def test_an_update_whose_answer_went_out_recorded_is_journaled_and_a_duplicate_is_not(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = make_core()
    fake_llm.script(Reply(text="hello"))
    first = Delivery("telegram", 1, attempt=1, update=None)
    await core.answer(incoming("hi", message_id="m1"), Port(parts=2), delivery=first)
    assert first.journaled  # the answer and both parts are stored: the inbox's mark need not wait for the disk
    again = Delivery("telegram", 2, attempt=1, update=None)
    await core.answer(incoming("hi", message_id="m1"), Port(), delivery=again)  # the same message: nothing went out
    assert not again.journaled
    resent = Delivery("telegram", 1, attempt=2, update=None)  # taken again after its answer went out in full
    await core.answer(incoming("hi", message_id="m1"), Port(parts=2), delivery=resent)
    assert resent.journaled
