"""A file someone sent and personal memory: "save it to memory" puts its whole text into archival memory in chunks
(each naming the file and page), never in a group and never another person's file; /memory counts the kept files and
/memory wipe erases them with the rest."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from core.buttons import Buttons
from core.constants import ARCHIVAL_CONTENT_CHARS
from core.memory.tools import SAVE_FILE, file_chunks
from core.storage.db import Pool
from core.types import Incoming, Upload
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, incoming, run, tool_messages, tool_names

WORDS = " ".join(f"word{i}" for i in range(2500))  # ~20,000 characters: several pages of a text file


def with_file(
    text: str, *, user: str = "80", chat: str | None = None, kind: str = "private", mid: str = "1"
) -> Incoming:
    """A message carrying a text file, as an adapter builds it."""
    up = Upload("document", "notes.txt", "text/plain", WORDS.encode())
    return replace(incoming(text, user=user, chat=chat, kind=kind, message_id=mid), uploads=(up,))


def save_the_file(body: dict[str, Any]) -> Reply:
    """The model asks to save the attachment its user message names."""
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    found = re.search(r"attachment #(\d+)", "\n".join(u for u in users if isinstance(u, str)))
    assert found is not None
    return Reply(tool_calls=[(SAVE_FILE, {"id": int(found.group(1))})])


def test_chunks_name_the_file_and_page_and_stay_within_an_entry() -> None:
    chunks = file_chunks("notes.txt", ["a " * 3000, "last page"])
    assert all(len(c) <= ARCHIVAL_CONTENT_CHARS for c in chunks)
    assert chunks[0].startswith("[from the file notes.txt, page 1] a a")
    assert chunks[-1] == "[from the file notes.txt, page 2] last page"
    assert sum(c.split("] ", 1)[1].split().count("a") for c in chunks) == 3000, "no word is lost"


async def test_save_it_to_memory_puts_the_whole_file_into_archival_memory(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    fake_llm.script(save_the_file, Reply(text="Saved it."))
    events = await run(core, with_file("save it to memory"))
    assert answer(events).text == "Saved it."
    assert SAVE_FILE in tool_names(fake_llm.requests[0])
    result = tool_messages(fake_llm.requests[1])[0]
    assert result["ok"] and "Saved notes.txt to archival memory in" in str(result)
    rows = await pool.fetch("SELECT content FROM archival_memory ORDER BY id")
    pages = await pool.fetchval("SELECT pages FROM attachments")
    assert [r["content"] for r in rows] == file_chunks("notes.txt", list(pages))
    assert " ".join(r["content"].split("] ", 1)[1] for r in rows) == WORDS, "the whole text, in order"

    fake_llm.script(save_the_file, Reply(text="Already there."))
    await run(core, with_file("save it again", mid="2"))
    assert await pool.fetchval("SELECT count(*) FROM archival_memory") == len(rows), "saved twice: stored once"

    ask = await core.command(incoming("/memory wipe", user="80"), "memory", "wipe")
    assert isinstance(ask, Buttons) and f"{len(rows)} archival entries, plus 2 files you sent" in ask.text
    done = await core.command(incoming("/memory wipe confirm", user="80"), "memory", "wipe confirm")
    assert isinstance(done, str) and "plus 2 files you sent" in done
    assert await pool.fetchval("SELECT count(*) FROM attachments") == 0
    assert await pool.fetchval("SELECT count(*) FROM archival_memory") == 0


async def test_never_in_a_group_and_never_another_persons_file(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    fake_llm.default = Reply(text="ok")
    await run(core, with_file("here are the notes", user="81", chat="-500", kind="group"))
    assert SAVE_FILE not in tool_names(fake_llm.requests[-1]), "no personal memory in a group"
    theirs = await pool.fetchval("SELECT id FROM attachments")
    fake_llm.script(save_the_file, Reply(text="done"))
    await run(core, with_file("save it", user="82"))
    mine = await pool.fetchval("SELECT id FROM attachments WHERE id <> $1", theirs)
    fake_llm.script(Reply(tool_calls=[(SAVE_FILE, {"id": theirs})]), Reply(text="no"))
    await run(core, with_file("save the group's file", user="82", mid="2"))
    refused = tool_messages(fake_llm.requests[-1])[-1]
    assert not refused["ok"] and refused["error"]["code"] == "not_found"
    owners = await pool.fetch("SELECT DISTINCT user_id FROM archival_memory")
    mine_account = await pool.fetchval("SELECT account_id FROM attachments WHERE id = $1", mine)
    assert [r["user_id"] for r in owners] == [mine_account], "only the speaker's own file went in, to their memory"
