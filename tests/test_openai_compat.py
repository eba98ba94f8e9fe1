"""POST /v1/chat/completions with the real `openai` SDK as the client (issue 22): the bot answers as a model, streaming
and not, with its tool steps as a <details> block, the turn's tokens as usage, sessions named by X-Session-Id, and
the API's errors as the SDK's exceptions."""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest

from tests import test_http_api
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_http_api import ANN, BOB, Serve, Served, token_of

serve = test_http_api.serve  # the fixture: a server with the /v1 routes

BLOCK = re.compile(r"<details>\n<summary>🔧 (\d+) steps? · \d+\.\d s</summary>\n\n((?:- .*\n)+)</details>\n\n")


def sdk(s: Served, secret: str) -> openai.AsyncOpenAI:
    """The openai SDK pointed at the bot, as Open WebUI or a script would be."""
    return openai.AsyncOpenAI(base_url=f"{s.url}/v1", api_key=secret, max_retries=0, timeout=10)


def said(text: str) -> list[Any]:
    """One user message."""
    return [{"role": "user", "content": text}]


async def test_answer_as_a_model_with_usage_in_a_fresh_session(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.default = Reply(
        text="Hello there.", usage={"prompt_tokens": 900, "completion_tokens": 100, "prompt_tokens_details": {}}
    )
    secret = await token_of(s.core, ANN)
    async with sdk(s, secret) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="fake-model",
            messages=[
                {"role": "system", "content": "You are Open WebUI's system prompt."},
                {"role": "user", "content": "OLD-QUESTION"},
                {"role": "assistant", "content": "OLD-ANSWER"},
                {"role": "user", "content": [{"type": "text", "text": "hi,"}, {"type": "text", "text": "bot"}]},
            ],
            temperature=0.2,
            user="someone",
        )
        done = raw.parse()
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-msg_") and done.model == "fake-model"
    assert done.choices[0].message.content == "Hello there."
    assert done.choices[0].message.role == "assistant" and done.choices[0].finish_reason == "stop"
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (900, 100, 1000)
    sent = json.dumps(fake_llm.requests[-1]["messages"])
    assert "hi,\\nbot" in sent, "the last user message is the turn (its text parts joined)"
    assert "OLD-QUESTION" not in sent and "OLD-ANSWER" not in sent and "Open WebUI's system" not in sent
    sid = raw.headers["X-Session-Id"]
    async with s.client(secret) as c:
        session = (await c.get(f"/v1/sessions/{sid}")).json()
        assert session["title"] == "hi, bot"
        stored = (await c.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
        assert stored[-1]["id"] == done.id.removeprefix("chatcmpl-") + "-reply"


async def test_stream_with_tool_steps_as_one_block_then_the_answer(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.script(
        Reply(
            tool_calls=[("manage_tasks", {"action": "create", "title": "Buy <b>milk</b>"})],
            usage={"prompt_tokens": 900, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 512}},
        ),
        Reply(text="Noted: **Buy milk** is on your list.", usage={"prompt_tokens": 1000, "completion_tokens": 50}),
    )
    async with sdk(s, await token_of(s.core, ANN)) as client:
        stream = await client.chat.completions.create(
            model="fake-model", messages=said("add buy milk"), stream=True, stream_options={"include_usage": True}
        )
        assert stream.response.headers["X-Session-Id"].startswith("ses_")
        chunks = [chunk async for chunk in stream]
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    block = BLOCK.match(content)
    assert block is not None, content
    assert block.group(1) == "1"
    assert block.group(2).startswith("- ✅ manage_tasks create → ") and "Buy &lt;b&gt;milk&lt;/b&gt;" in block.group(2)
    assert content[block.end() :] == "Noted: **Buy milk** is on your list."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None, "the usage comes last, as include_usage asks"
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (1900, 150, 2050)
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 512


async def test_stream_and_whole_answer_say_the_same_and_curl_sees_done(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    secret = await token_of(s.core, ANN)

    def script() -> None:
        fake_llm.script(
            Reply(text="Let me look.", tool_calls=[("manage_tasks", {"action": "list"})]),
            Reply(tool_calls=[("manage_tasks", {"action": "list"})]),
            Reply(text="Nothing is on your list."),
        )

    script()
    async with sdk(s, secret) as client:
        whole = await client.chat.completions.create(model="fake-model", messages=said("what is on my list?"))
        script()
        stream = await client.chat.completions.create(model="fake-model", messages=said("and now?"), stream=True)
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    content = whole.choices[0].message.content
    assert content == streamed
    assert content is not None and content.startswith("Let me look.\n\n<details>\n<summary>🔧 2 steps")
    assert content.endswith("</details>\n\nNothing is on your list.")
    assert whole.usage is not None and whole.usage.prompt_tokens > 0, "the fake's own estimate, summed"
    fake_llm.default = Reply(text="Plain.")
    async with (
        s.client(secret) as c,
        c.stream(
            "POST", "/v1/chat/completions", json={"model": "fake-model", "messages": said("hi"), "stream": True}
        ) as r,
    ):
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in r.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    assert json.loads(lines[0][6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}


async def test_session_header_continues_a_session_and_none_starts_a_fresh_one(
    serve: Serve, fake_llm: FakeOpenAI
) -> None:
    s = await serve()
    fake_llm.script(Reply(text="Paris is the capital."), Reply(text="About two million."), Reply(text="Hi."))
    async with sdk(s, await token_of(s.core, ANN)) as client:
        first = await client.chat.completions.with_raw_response.create(
            model="fake-model", messages=said("What is the capital of France?")
        )
        sid = first.headers["X-Session-Id"]
        second = await client.chat.completions.with_raw_response.create(
            model="fake-model", messages=said("How many live there?"), extra_headers={"X-Session-Id": sid}
        )
        assert second.headers["X-Session-Id"] == sid
        assert second.parse().choices[0].message.content == "About two million."
        contents = [m.get("content") for m in fake_llm.requests[-1]["messages"]]
        assert "Paris is the capital." in contents, "the second turn's prompt holds the first exchange"
        assert any("What is the capital of France?" in str(x) for x in contents)
        third = await client.chat.completions.with_raw_response.create(model="fake-model", messages=said("hello"))
    assert third.headers["X-Session-Id"] != sid, "no header: a fresh session"
    assert "Paris is the capital." not in json.dumps(fake_llm.requests[-1]["messages"])


async def test_errors_are_the_sdks_exceptions_with_our_messages(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve(LLM_MODELS="fake-model,other-model")
    fake_llm.default = Reply(text="ok")
    ann, bob = await token_of(s.core, ANN), await token_of(s.core, BOB)
    async with sdk(s, "abt_" + "x" * 32) as wrong:
        with pytest.raises(openai.AuthenticationError) as refused:
            await wrong.chat.completions.create(model="fake-model", messages=said("hi"))
    assert isinstance(refused.value.body, dict) and "/token new" in refused.value.body["message"]
    async with sdk(s, ann) as client, sdk(s, bob) as other:
        assert [m.id async for m in client.models.list()] == ["fake-model", "other-model"]
        with pytest.raises(openai.BadRequestError) as unknown:
            await client.chat.completions.create(model="gpt-secret", messages=said("hi"))
        assert isinstance(unknown.value.body, dict)
        assert unknown.value.body["message"].startswith("Unknown model `gpt-secret`: pick one of `fake-model`")
        assert "Unknown model `gpt-secret`" in str(unknown.value)
        with pytest.raises(openai.BadRequestError, match="there is no user message"):
            await client.chat.completions.create(model="fake-model", messages=[{"role": "system", "content": "x"}])
        with pytest.raises(openai.BadRequestError, match="Links are not fetched"):
            await client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y"}}]}],
            )
        ours = await client.chat.completions.with_raw_response.create(model="other-model", messages=said("mine"))
        assert fake_llm.requests[-1]["model"] == "other-model"
        with pytest.raises(openai.NotFoundError) as theirs:
            await other.chat.completions.create(
                model="fake-model", messages=said("hi"), extra_headers={"X-Session-Id": ours.headers["X-Session-Id"]}
            )
        assert isinstance(theirs.value.body, dict) and theirs.value.body["message"] == "No such session."


async def test_a_failed_turn_is_the_answers_text(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.script(Reply(status=400, text="the request exceeds the available context size"))
    async with sdk(s, await token_of(s.core, ANN)) as client:
        done = await client.chat.completions.create(model="fake-model", messages=said("hi"))
        fake_llm.script(Reply(status=400, text="the request exceeds the available context size"))
        stream = await client.chat.completions.create(model="fake-model", messages=said("hi"), stream=True)
        chunks = [c async for c in stream]
    content = done.choices[0].message.content
    assert content is not None and "exceeds the available context size" in content
    assert "Your message is saved" in content
    assert done.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == content
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_final_text_the_stream_never_had_is_sent_too(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve(AGENT_MAX_STEPS=1)
    fake_llm.script(Reply(tool_calls=[("manage_tasks", {"action": "list"})]), Reply(text="I listed your tasks."))
    async with sdk(s, await token_of(s.core, ANN)) as client:
        stream = await client.chat.completions.create(model="fake-model", messages=said("list"), stream=True)
        wrapped = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        fake_llm.script(Reply(text="A long story", finish_reason="length"))
        stream = await client.chat.completions.create(model="fake-model", messages=said("tell"), stream=True)
        cut = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    block = BLOCK.match(wrapped)
    assert block is not None and block.group(1) == "1", wrapped
    assert wrapped[block.end() :] == "I listed your tasks.\n\n_(Cut short: the step limit (1 steps).)_"
    assert cut == "A long story\n\n_(cut short: the model hit its length limit)_"


async def test_open_webui_chat_id_keeps_one_session_per_chat_and_person(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.default = Reply(text="ok")
    async with sdk(s, await token_of(s.core, ANN)) as ann, sdk(s, await token_of(s.core, BOB)) as bob:
        chat = {"X-OpenWebUI-Chat-Id": "0b7c-chat-1"}
        first = await ann.chat.completions.with_raw_response.create(
            model="fake-model", messages=said("My code word is Heliotrope."), extra_headers=chat
        )
        second = await ann.chat.completions.with_raw_response.create(
            model="fake-model", messages=said("What is my code word?"), extra_headers=chat
        )
        assert first.headers["X-Session-Id"] == second.headers["X-Session-Id"]
        assert "Heliotrope" in json.dumps(fake_llm.requests[-1]["messages"]), "the chat's earlier turn is replayed"
        other = await ann.chat.completions.with_raw_response.create(
            model="fake-model", messages=said("hi"), extra_headers={"X-OpenWebUI-Chat-Id": "another-chat"}
        )
        assert other.headers["X-Session-Id"] != first.headers["X-Session-Id"]
        theirs = await bob.chat.completions.with_raw_response.create(
            model="fake-model", messages=said("What is my code word?"), extra_headers=chat
        )
        assert theirs.headers["X-Session-Id"] != first.headers["X-Session-Id"], "the same chat id: Bob's own session"
        assert "Heliotrope" not in json.dumps(fake_llm.requests[-1]["messages"])


async def test_every_message_follows_the_described_rules_not_only_the_last(serve: Serve, fake_llm: FakeOpenAI) -> None:
    """The description cannot say "the last user message", so the server checks every message the same way."""
    s = await serve()
    fake_llm.default = Reply(text="ok")
    secret = await token_of(s.core, ANN)
    ok_png = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    async with sdk(s, secret) as client:
        for history, error in [
            ([{"type": "image_url", "image_url": {"url": "https://x/y.png"}}], "Links are not fetched"),
            ([{"type": "file", "file": {"file_id": "file-1"}}], "file ids are not known here"),
            ([{"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}], "not valid base64"),
            ([{"type": "text", "text": " \t"}], "a user message has neither text nor a file"),
            ([ok_png] * 6, "At most 5 files"),
        ]:
            asked: Any = [{"role": "user", "content": history}, {"role": "user", "content": "now this"}]
            with pytest.raises(openai.BadRequestError, match=error):
                await client.chat.completions.create(model="fake-model", messages=asked)
        fine: Any = [{"role": "user", "content": [ok_png]}, {"role": "user", "content": "hi"}]
        done = await client.chat.completions.create(model="fake-model", messages=fine)
    assert done.choices[0].message.content == "ok"
