"""The caller before the body (issue 31, point 2): over real HTTP, a request to the API without a valid token or
sign-in is answered from its headers before its body is read, so many parallel 29 MB bodies from strangers neither
stall the event loop (the loop that also runs Telegram, Discord and reminders) nor grow the process; strangers are
rate-limited per address before any lookup; a known caller's large body is parsed off the loop."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import os
import threading
import time
from collections.abc import Iterator

import httpx
import psutil  # type: ignore[import-untyped]
import pytest

from adapters.http.limits import JSON_CONTAINERS_MAX, MAX_BODY_BYTES, UPLOAD_BODY_BYTES
from bot.app import freeze_startup_objects
from tests import test_http_api
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import WAIT_S
from tests.test_http_api import ANN, Serve, token_of

serve = test_http_api.serve  # the fixture: a server with the /v1 routes

BEAT_S = 0.1  # the bound: no request may make the loop miss a beat of 100 ms, nor /healthz take longer
CHUNK = b"A" * (64 << 10)  # the attack's body is this chunk over and over (the client holds no 29 MB)


def head(path: str, length: int | None, headers: dict[str, str]) -> bytes:
    """A POST's request line and headers (chunked without a length)."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def post_big(port: int, path: str, headers: dict[str, str], size: int, chunked: bool) -> tuple[int, float]:
    """POST a body of `size` bytes, streamed, while reading the answer: (its status, or 0 when the connection ended
    without one; seconds until the answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    prefix = b'{"content": [{"type": "file", "name": "big.bin", "data": "'

    async def send() -> None:
        writer.write(head(path, None if chunked else size, headers))
        sent = 0
        while sent < size:
            piece = (prefix if sent == 0 else CHUNK)[: size - sent]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            await writer.drain()
            sent += len(piece)
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        status_line = await reader.readline()
    except ConnectionError:
        status_line = b""
    answered = time.monotonic() - started
    sender.cancel()
    try:
        await sender
    except (asyncio.CancelledError, ConnectionError):
        pass
    writer.close()
    parts = status_line.split()
    return (int(parts[1]) if len(parts) > 1 else 0), answered


@pytest.fixture
def started() -> Iterator[None]:
    """The process as the bot runs once started: start-up's objects frozen out of the garbage collector's full
    collections (bot/app.py), which would otherwise scan all of the test process for 100 ms and more."""
    freeze_startup_objects()
    yield
    gc.unfreeze()


async def test_many_parallel_29_mb_bodies_without_a_token_neither_stall_the_loop_nor_grow_the_process(
    serve: Serve, fake_llm: FakeOpenAI, started: None
) -> None:
    s = await serve()
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
    port = s.server.port
    made_up = "abt_" + "x" * 43  # a well-formed token nobody has
    attacks = [
        (f"/v1/sessions/{sid}/messages", {}, False),
        ("/v1/one-shot", {}, True),
        ("/v1/chat/completions", {"Authorization": f"Bearer {made_up}"}, False),
        (f"/v1/sessions/{sid}/messages", {"Authorization": f"Bearer {made_up}"}, True),
        ("/v1/one-shot", {"Cookie": "bot_signin=made-up"}, False),
        ("/v1/chat/completions", {}, True),
    ]
    size = UPLOAD_BODY_BYTES - 10

    def attack() -> list[tuple[int, float]]:
        async def waves() -> list[tuple[int, float]]:  # six at a time, again and again for a second
            answers: list[tuple[int, float]] = []
            async with asyncio.timeout(60):
                started = time.monotonic()
                while time.monotonic() - started < 1.0:
                    answers += await asyncio.gather(*(post_big(port, p, h, size, ch) for p, h, ch in attacks))
            return answers

        assert probed.wait(WAIT_S), "/healthz answered before the attack starts"
        return asyncio.run(waves())

    stop, probed = threading.Event(), threading.Event()

    def probe() -> list[float]:
        times: list[float] = []
        with httpx.Client(base_url=s.url, timeout=10) as client:
            while not stop.is_set():
                t0 = time.monotonic()
                assert client.get("/healthz").status_code == 200
                times.append(time.monotonic() - t0)
                probed.set()
                stop.wait(0.02)  # a probe every 20 ms: the pace of a health checker, ended at once by stop
        return times

    loop = asyncio.get_running_loop()
    lags: list[float] = []

    async def beat() -> None:
        while not stop.is_set():
            t0 = loop.time()
            await asyncio.sleep(0.01)
            lags.append(loop.time() - t0 - 0.01)

    me = psutil.Process()
    rss_before = me.memory_info().rss
    beating = asyncio.create_task(beat())
    prober = asyncio.create_task(asyncio.to_thread(probe))  # clients in threads of their own, off the server's loop
    async with asyncio.timeout(90):
        answers = await asyncio.to_thread(attack)
    rss_after = me.memory_info().rss
    stop.set()
    async with asyncio.timeout(15):
        health = await prober
    await beating
    statuses = {status for status, _ in answers}
    print(
        f"{len(answers)} answers {sorted(statuses)}; /healthz max {max(health) * 1000:.0f} ms of {len(health)}; "
        f"loop lag max {max(lags) * 1000:.0f} ms; RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB"
    )
    # 401 (429 once the address has had its API_STRANGER_REQUESTS_PER_MINUTE), or the connection cut before the
    # client read the answer (closed with the body unread: the client may see a reset, on a busy machine every time)
    assert statuses <= {401, 429, 0}, answers
    small = await post_big(port, "/v1/one-shot", {}, 100, False)  # a body the server reads to its end: no reset
    assert small[0] in (401, 429), "the door answers a stranger from the headers"
    assert max(t for _, t in answers) < 2.0, "answered from the headers, not after the bodies"
    assert max(health) < BEAT_S, f"/healthz took {max(health) * 1000:.0f} ms"
    assert max(lags) < BEAT_S, f"the loop missed a beat by {max(lags) * 1000:.0f} ms"
    assert rss_after - rss_before < 50 * 2**20, f"grew {(rss_after - rss_before) / 2**20:.0f} MiB"


async def test_a_stranger_is_answered_before_sending_a_byte_of_the_body(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port)
    try:
        writer.write(head("/v1/one-shot", UPLOAD_BODY_BYTES, {"Authorization": "Bearer abt_" + "y" * 43}))
        await writer.drain()
        async with asyncio.timeout(5):  # the body never comes: only the headers can have been judged
            answer = await reader.read()  # the server answers, then closes
    finally:
        writer.close()
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"connection: close" in rest.lower()
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["error"]["type"] == "unauthorized"


async def test_a_known_caller_past_the_limit_is_refused_by_its_length_and_by_counting(
    serve: Serve, fake_llm: FakeOpenAI
) -> None:
    s = await serve()
    secret = await token_of(s.core, ANN)
    # by Content-Length: 413 before the body is sent
    reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port)
    try:
        writer.write(head("/v1/sessions", MAX_BODY_BYTES + 1, {"Authorization": f"Bearer {secret}"}))
        await writer.drain()
        async with asyncio.timeout(5):  # the body never comes: its length alone is judged
            answer = await reader.readuntil(b"\r\n\r\n")
            length = int(next(h for h in answer.split(b"\r\n") if h.lower().startswith(b"content-length:"))[15:])
            body = json.loads(await reader.readexactly(length))
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert body["error"]["type"] == "too_large"
    # chunked (no length): counted as it comes
    status, _ = await post_big(s.server.port, "/v1/sessions", {"Authorization": f"Bearer {secret}"}, 3 << 20, True)
    assert status == 413


async def test_made_up_tokens_are_rate_limited_per_address_before_any_lookup(
    serve: Serve, fake_llm: FakeOpenAI
) -> None:
    s = await serve(API_STRANGER_REQUESTS_PER_MINUTE=5)
    secret = await token_of(s.core, ANN)
    async with s.client("abt_" + "z" * 43) as wrong, s.client(None) as nobody, s.client(secret) as ann:
        assert (await ann.get("/v1/sessions")).status_code == 200, "a valid token is no stranger"
        statuses = [(await c.get("/v1/sessions")).status_code for c in (wrong, nobody, wrong, nobody, wrong)]
        assert statuses == [401] * 5
        limited = await wrong.get("/v1/sessions")
        assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
        assert limited.json()["error"]["type"] == "rate_limited"
        assert (await nobody.post("/v1/one-shot", json={"prompt": "hi"})).status_code == 429
        # the address is refused before the lookup: no query can tell a made-up token from a valid one
        assert (await ann.get("/v1/sessions")).status_code == 429


async def test_a_known_callers_large_body_is_parsed_off_the_loop(
    serve: Serve, fake_llm: FakeOpenAI, started: None
) -> None:
    s = await serve()
    fake_llm.default = Reply(text="Got it.")
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    busy: list[float] = []  # the loop thread's own CPU time per beat: its work, whatever else loads the machine
    stop = asyncio.Event()

    async def beat() -> None:
        while not stop.is_set():
            t0, cpu = loop.time(), time.thread_time()
            await asyncio.sleep(0.01)
            lags.append(loop.time() - t0 - 0.01)
            busy.append(time.thread_time() - cpu)

    data = base64.b64encode(os.urandom(15 << 20)).decode()  # a 15 MiB file: 20 MB of base64
    body = json.dumps(
        {"content": [{"type": "text", "text": "what is this?"}, {"type": "file", "name": "x.bin", "data": data}]}
    ).encode()

    def chat(n: int) -> bytes:
        """A chat completion with a history of n messages (Open WebUI resends the whole chat)."""
        said = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(n)]
        return json.dumps({"model": "fake-model", "messages": said}).encode()

    def send() -> list[int]:
        with httpx.Client(base_url=s.url, timeout=30, headers={"Authorization": f"Bearer {secret}"}) as client:
            sid = client.post("/v1/sessions", json={}).json()["id"]
            headers = {"Content-Type": "application/json"}
            statuses = [client.post(f"/v1/sessions/{sid}/messages", content=body, headers=headers).status_code]
            statuses.append(client.post("/v1/chat/completions", content=chat(4_901), headers=headers).status_code)
            refused = client.post("/v1/chat/completions", content=chat(JSON_CONTAINERS_MAX), headers=headers)
            assert refused.json()["error"]["message"].startswith("The request body holds more than 5,000 objects")
            return [*statuses, refused.status_code]

    secret = await token_of(s.core, ANN)
    beating = asyncio.create_task(beat())
    async with asyncio.timeout(60):
        statuses = await asyncio.to_thread(send)  # a client off the server's loop
    stop.set()
    await beating
    print(f"loop lag max {max(lags) * 1000:.0f} ms, its own work at most {max(busy) * 1000:.0f} ms a beat")
    assert statuses == [200, 200, 413], "a 20 MB upload and a long chat are taken; countless values are refused"
    # a busy machine makes every beat late (the wall-clock lag); what the loop did between two beats is its CPU time
    assert max(busy) < BEAT_S, f"the loop worked {max(busy) * 1000:.0f} ms without a beat"
