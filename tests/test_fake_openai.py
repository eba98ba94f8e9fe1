"""Tests for the fake OpenAI server driven by the real openai SDK."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from tests.fake_openai import OGG_OPUS_HEAD, TRANSCRIPT, FakeOpenAI, Reply, Upload, speech_audio


def _client(fake: FakeOpenAI, max_retries: int = 2) -> openai.AsyncOpenAI:
    """Build a real SDK client pointed at the fake server."""
    return openai.AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=max_retries, timeout=5.0)


async def test_text_reply() -> None:
    """A scripted text reply comes back as a normal completion."""
    async with FakeOpenAI() as fake:
        fake.script(Reply(text="hello there"))
        client = _client(fake)
        resp = await client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}])
        assert resp.model == "m1"
        assert resp.choices[0].message.content == "hello there"
        assert resp.choices[0].message.tool_calls is None
        assert resp.choices[0].finish_reason == "stop"
        assert resp.usage is not None and resp.usage.total_tokens > 0
        assert fake.requests[0]["messages"] == [{"role": "user", "content": "hi"}]
        models = await client.models.list()
        assert [m.id for m in models.data] == ["fake-model"]
        await client.close()


async def test_tool_call_reply_and_round_trip() -> None:
    """Tool calls get unique ids and their results are accepted in the next turn."""
    async with FakeOpenAI(default=Reply(text="done")) as fake:
        fake.script(Reply(tool_calls=[("add", {"a": 1, "b": 2}), ("bad", "{not json")]))
        client = _client(fake)
        msgs: list[Any] = [{"role": "user", "content": "add"}]
        resp = await client.chat.completions.create(model="m", messages=msgs)
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        assert calls is not None and len(calls) == 2
        assert all(isinstance(c, ChatCompletionMessageFunctionToolCall) for c in calls)
        assert isinstance(calls[0], ChatCompletionMessageFunctionToolCall)
        assert isinstance(calls[1], ChatCompletionMessageFunctionToolCall)
        assert calls[0].function.name == "add"
        assert json.loads(calls[0].function.arguments) == {"a": 1, "b": 2}
        assert calls[1].function.arguments == "{not json"
        assert [c.id for c in calls] == ["call_1", "call_2"]
        msgs.append(choice.message.model_dump(exclude_none=True))
        msgs += [{"role": "tool", "tool_call_id": c.id, "content": "3"} for c in calls]
        resp2 = await client.chat.completions.create(model="m", messages=msgs)
        assert resp2.choices[0].message.content == "done"
        await client.close()


async def test_streaming_text_and_tool_call() -> None:
    """Streamed text arrives in several deltas and streamed tool calls assemble correctly."""
    async with FakeOpenAI() as fake:
        fake.script(Reply(text="streaming works fine"), Reply(tool_calls=[("lookup", {"q": "x" * 10})]))
        client = _client(fake)
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces: list[str] = []
        finish: str | None = None
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for ch in chunk.choices:
                if ch.delta.content:
                    pieces.append(ch.delta.content)
                finish = ch.finish_reason or finish
        assert len(pieces) >= 2
        assert "".join(pieces) == "streaming works fine"
        assert finish == "stop"
        assert usage is not None and usage.total_tokens > 0

        stream2 = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "look"}], stream=True
        )
        calls: dict[int, dict[str, str]] = {}
        finish = None
        async for chunk in stream2:
            assert chunk.usage is None
            for ch in chunk.choices:
                for tc in ch.delta.tool_calls or []:
                    entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    entry["id"] += tc.id or ""
                    if tc.function is not None:
                        entry["name"] += tc.function.name or ""
                        entry["arguments"] += tc.function.arguments or ""
                finish = ch.finish_reason or finish
        assert finish == "tool_calls"
        assert calls == {0: {"id": "call_1", "name": "lookup", "arguments": json.dumps({"q": "x" * 10})}}
        await client.close()


async def test_500_then_success_via_sdk_retry() -> None:
    """The SDK retries a 500 and gets the next scripted reply."""
    async with FakeOpenAI() as fake:
        fake.script(Reply(status=500), Reply(text="ok"))
        client = _client(fake)
        resp = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert resp.choices[0].message.content == "ok"
        assert len(fake.requests) == 2
        await client.close()


async def test_error_without_retry() -> None:
    """With retries disabled a scripted 429 surfaces as RateLimitError; an empty queue gives 500."""
    async with FakeOpenAI() as fake:
        fake.script(Reply(status=429, text="slow down"))
        client = _client(fake, max_retries=0)
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert "slow down" in str(info.value)
        with pytest.raises(openai.InternalServerError, match="no scripted reply"):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        await client.close()


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "x"}],
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "x"},
            {"role": "user", "content": "again"},
        ],
        [{"role": "robot", "content": "hi"}],
    ],
)
async def test_broken_message_order_is_400(messages: list[Any]) -> None:
    """Invalid tool message ordering is rejected with 400 without consuming a scripted reply."""
    async with FakeOpenAI() as fake:
        fake.script(Reply(text="still here"))
        client = _client(fake)
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="m", messages=messages)
        assert len(fake.requests) == 1
        resp = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert resp.choices[0].message.content == "still here"
        await client.close()


async def test_down_and_up() -> None:
    """down() makes requests fail to connect; up() restores service on the same port."""
    async with FakeOpenAI(default=Reply(text="ok")) as fake:
        client = _client(fake, max_retries=0)
        url = fake.base_url
        resp = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        assert resp.choices[0].message.content == "ok"
        fake.down()
        started = time.monotonic()
        with pytest.raises(openai.APIConnectionError):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
        assert time.monotonic() - started < 5.0  # refused at once, not the client's 10 s timeout
        await fake.up()
        assert fake.base_url == url
        resp = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "c"}])
        assert resp.choices[0].message.content == "ok"
        await client.close()


async def test_scripted_length_finish_and_malformed_sse() -> None:
    """finish_reason can be scripted; a malformed `data:` line reaches the SDK as a JSON error."""
    async with FakeOpenAI() as fake:
        fake.script(Reply(text="cut", finish_reason="length"), Reply(text="half", bad_sse=["{not json"]))
        client = _client(fake)
        resp = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert resp.choices[0].finish_reason == "length"
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        with pytest.raises(json.JSONDecodeError):
            async for _ in stream:
                pass
        await client.close()


async def test_transcriptions_record_the_upload_and_answer_the_script() -> None:
    """/audio/transcriptions keeps each multipart upload as sent (file, name, type, model, other fields, key) and
    answers the scripted transcripts in order, then the default; a scripted status is an error."""
    async with FakeOpenAI() as fake:
        fake.script_transcripts(Reply(text="first"), Reply(status=503, text="busy"))
        client = _client(fake, max_retries=0)
        data = bytes(range(256)) * 3  # every byte value, CR LF and dashes included
        first = await client.audio.transcriptions.create(
            model="whisper-1", file=("note.oga", data, "audio/ogg"), language="de"
        )
        assert first.text == "first"
        with pytest.raises(openai.InternalServerError, match="busy"):
            await client.audio.transcriptions.create(model="whisper-1", file=("b.mp3", b"mp3", "audio/mpeg"))
        third = await client.audio.transcriptions.create(model="m2", file=("c.wav", b"RIFF", "audio/wav"))
        assert third.text == TRANSCRIPT
        assert fake.uploads == [
            Upload("note.oga", "audio/ogg", data, "whisper-1", {"language": "de"}, "test"),
            Upload("b.mp3", "audio/mpeg", b"mp3", "whisper-1", {}, "test"),
            Upload("c.wav", "audio/wav", b"RIFF", "m2", {}, "test"),
        ]
        await client.close()


async def test_speech_records_the_request_and_answers_ogg_opus() -> None:
    """/audio/speech keeps each JSON body and answers an OGG/Opus page followed by the text; `speech_status` makes
    it an error."""
    async with FakeOpenAI() as fake:
        client = _client(fake, max_retries=0)
        spoken = await client.audio.speech.create(model="tts-1", voice="alloy", input="hello", response_format="opus")
        audio = await spoken.aread()
        assert audio == speech_audio("hello") and audio.startswith(b"OggS") and b"OpusHead" in OGG_OPUS_HEAD
        assert fake.speech_requests == [
            {"model": "tts-1", "voice": "alloy", "input": "hello", "response_format": "opus"}
        ]
        fake.speech_status = 500
        with pytest.raises(openai.InternalServerError):
            await client.audio.speech.create(model="tts-1", voice="alloy", input="again")
        assert len(fake.speech_requests) == 2
        await client.close()
