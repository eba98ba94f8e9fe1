"""/openapi.json is true (issue 31, point 7): Schemathesis, with every one of its checks, against the real server in
this test's loop with a valid token — responses, statuses, error bodies, event streams, `Allow` headers and
authentication as described, and no request the description allows refused. Bounded (a few examples per operation,
one worker, derandomized) and on a fresh database, so it asks the same requests every run."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

from tests import test_http_api
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_http_api import ANN, Serve, token_of

serve = test_http_api.serve  # the fixture: a server with the /v1 routes

EXAMPLES = 10  # per operation and phase: about 740 test cases, 15 s on a quiet 2-core machine
TIMEOUT_S = 120.0  # the run ends within this even on a busy machine, else the test fails
UNLIMITED = 1_000_000  # the rate limits are not what is tested here


async def test_schemathesis_finds_the_description_true(serve: Serve, fake_llm: FakeOpenAI, tmp_path: Path) -> None:
    s = await serve(
        API_REQUESTS_PER_MINUTE=UNLIMITED,
        USER_MESSAGES_PER_MINUTE=UNLIMITED,
        API_STRANGER_REQUESTS_PER_MINUTE=UNLIMITED,
    )
    fake_llm.default = Reply(text="ok")
    secret = await token_of(s.core, ANN)
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("st")),
        *("run", f"{s.url}/openapi.json", "--header", f"Authorization: Bearer {secret}"),
        *(
            "--checks",
            "all",
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            "31",
            "--generation-deterministic",
        ),  # no example database either
        *("--workers", "1", "--request-timeout", "30", "--no-color"),
        cwd=tmp_path,  # its reports and any files it writes stay in the test's folder
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    report = out.decode(errors="replace").replace(secret, "abt_…")
    failures = report[report.find("FAILURES") :] if "FAILURES" in report else report[-4000:]
    assert proc.returncode == 0, f"Schemathesis failed after {time.monotonic() - started:.0f} s:\n{failures}"
    ran = re.search(r"(\d+) generated, \1 passed", report)
    assert ran and int(ran[1]) > 17 * EXAMPLES, report[-2000:]  # every operation was tried
