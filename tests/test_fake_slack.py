"""The fake Slack answers the real slack_sdk as Slack does: tokens checked, 429 with Retry-After on demand, Socket Mode
envelopes acked by id, Events API posts signed so that slack_sdk's own verifier accepts them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from tests.fake_slack import BOT_USER, TEAM, FakeSlack
from tests.helpers import WAIT_S


@pytest.fixture
async def sl() -> AsyncIterator[FakeSlack]:
    """A fake Slack."""
    async with FakeSlack() as fake:
        yield fake


async def test_the_web_api_checks_the_token_and_keeps_what_the_bot_posts(sl: FakeSlack) -> None:
    web = AsyncWebClient(token=sl.token, base_url=sl.api_base)
    auth = await web.auth_test()
    assert (auth["team_id"], auth["user_id"]) == (TEAM, BOT_USER)
    sent = await web.chat_postMessage(channel="D0ALICE", text="hi", blocks=[{"type": "section"}])
    assert sl.sent == [sl.message("D0ALICE", sent["ts"])] and sl.sent[0]["text"] == "hi"
    with pytest.raises(SlackApiError) as refused:
        await AsyncWebClient(token="xoxb-wrong", base_url=sl.api_base).auth_test()
    assert refused.value.response["error"] == "invalid_auth"


async def test_a_scripted_429_carries_retry_after_then_the_call_passes(sl: FakeSlack) -> None:
    web = AsyncWebClient(token=sl.token, base_url=sl.api_base, retry_handlers=[])
    sl.rate_limit["chat.postMessage"] = [7]
    with pytest.raises(SlackApiError) as limited:
        await web.chat_postMessage(channel="D0ALICE", text="hi")
    assert limited.value.response.status_code == 429 and limited.value.response.headers["Retry-After"] == "7"
    await web.chat_postMessage(channel="D0ALICE", text="hi")
    assert len(sl.sent) == 1


async def test_socket_mode_pushes_envelopes_and_records_acks(sl: FakeSlack) -> None:
    opened = await AsyncWebClient(base_url=sl.api_base).apps_connections_open(app_token=sl.app_token)
    async with aiohttp.ClientSession() as session, session.ws_connect(opened["url"]) as ws:
        assert json.loads((await ws.receive(WAIT_S)).data)["type"] == "hello"
        envelope_id = await sl.push("events_api", sl.post("U0ALICE", "hello", channel="D0ALICE"))
        envelope = json.loads((await ws.receive(WAIT_S)).data)
        assert envelope["envelope_id"] == envelope_id and envelope["payload"]["event"]["text"] == "hello"
        await sl.redeliver(envelope_id)
        again = json.loads((await ws.receive(WAIT_S)).data)
        assert again["envelope_id"] == envelope_id and again["retry_attempt"] == 1
        await ws.send_str(json.dumps({"envelope_id": envelope_id}))
        await sl.wait_for(lambda: envelope_id in sl.acks, WAIT_S, what="the ack")


async def test_events_are_signed_as_slack_signs_them(sl: FakeSlack) -> None:
    body = b'{"type":"event_callback"}'
    verifier = SignatureVerifier(sl.signing_secret)
    assert verifier.is_valid_request(body, sl.sign(body))
    assert not verifier.is_valid_request(body + b" ", sl.sign(body))
    assert not SignatureVerifier("another secret").is_valid_request(body, sl.sign(body))
