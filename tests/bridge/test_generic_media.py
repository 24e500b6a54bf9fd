"""The one-URL-for-all ``/media`` endpoint end to end: each websocket carrier's simulator, its media connection
pointed at ``/media`` instead of the carrier's own path (re-signed where the carrier signs the URL)."""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import pytest
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from callbridge.carriers.twilio.wire import ACCOUNT_PARAM
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from callbridge.sim.simulators import simulated
from tests.bridge.twilio_e2e import engine, post_answer, settings, short_speech, until

SIMULATED = simulated()

WEBSOCKET_CARRIERS = sorted(name for name in SIMULATED if name not in ("audiosocket", "sip"))
SIGNATURE_HEADERS = ("X-Twilio-Signature", "X-SignalWire-Signature")


def generic_url(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/media", parts.query, ""))


@pytest.mark.parametrize("provider", WEBSOCKET_CARRIERS)
async def test_a_call_through_the_generic_media_url(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = engine()
    # the module whose ``connect`` the simulator opens its streams with (SignalWire's is Twilio's, which it extends)
    module = next(sys.modules[c.__module__] for c in SIMULATED[provider].__mro__ if hasattr(sys.modules[c.__module__], "connect"))
    original_connect = module.connect
    opened: list[str] = []

    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        validator = RequestValidator(bridge.carrier.secret)

        def connect(url: str, *args: Any, additional_headers: Any = None, **kwargs: Any) -> Any:
            url = generic_url(url)
            opened.append(url)
            headers = dict(additional_headers or {})
            for header in SIGNATURE_HEADERS:
                if header in headers:
                    headers[header] = validator.compute_signature(url, {})
            return original_connect(url, *args, additional_headers=headers, **kwargs)

        monkeypatch.setattr(module, "connect", connect)
        script = CallerScript(utterances=((300, short_speech()),), dtmf=((200, "7"),), interrupt_after_agent_ms=600, hangup_at_ms=5000)
        result = await bridge.carrier.place_call(script)
        await until(lambda: recorder.session_count == 0, timeout_s=6)
        ended = sum(
            sample.value
            for metric in bridge.app.state.bridge.registry.collect()
            for sample in metric.samples
            if sample.name == "callbridge_calls_total" and sample.labels["provider"] == provider
        )
    assert opened and all(urlsplit(url).path == "/media" for url in opened)
    assert result.warnings == [] and result.agent_speech_ms > 0, result.render()
    assert len(recorder.opened) == 1 and recorder.session_count == 0
    assert ended >= 1  # counted under the carrier it was recognised as, not "unknown"


async def test_forged_signature_and_missing_token_are_refused() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        url = bridge.base_url.replace("http://", "ws://") + "/media"
        with pytest.raises(InvalidStatus) as refused:
            await connect(url, additional_headers={"X-Twilio-Signature": "forged"})
        assert refused.value.response.status_code == 403
        signature = RequestValidator(bridge.carrier.secret).compute_signature(url, {})
        async with connect(url, additional_headers={"X-Twilio-Signature": signature}) as ws:
            start = {"streamSid": "MZ9", "accountSid": "AC" + "1" * 32, "callSid": "CA9", "customParameters": {"token": "not-minted"},
                     "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}  # fmt: skip
            await ws.send(orjson.dumps({"event": "start", "streamSid": "MZ9", "start": start}).decode())
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1008
    assert recorder.opened == []


async def test_a_sender_that_leaves_the_account_empty_is_twilios_and_is_hung_up_by_the_account_the_answer_saw() -> None:
    """#40: a Twilio-protocol sender (a SIP-to-websocket bridge) whose ``start`` has ``accountSid: ""``, streaming to
    ``/media`` from our answer's TwiML. Before: labelled SignalWire, and its hang-up failed ("needs the call's
    account id") though the answer webhook had the ``AccountSid``: the caller was left on a dead line. The answer's
    ``<Stream>`` now carries it (``callbridge_account``); the stream is Twilio's and is hung up through it."""
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        call_sid = "CA" + "5" * 32
        answer = await post_answer(bridge, call_sid)
        params = dict(re.findall(r'<Parameter name="([^"]+)" value="([^"]+)"/>', answer.text))
        assert params.get(ACCOUNT_PARAM) == bridge.carrier.account_sid, answer.text
        url = bridge.base_url.replace("http://", "ws://") + "/media"
        signature = RequestValidator(bridge.carrier.secret).compute_signature(url, {})
        async with connect(url, additional_headers={"X-Twilio-Signature": signature}) as ws:
            start = {"streamSid": "MZ" + "5" * 32, "accountSid": "", "callSid": call_sid, "customParameters": params,
                     "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}  # fmt: skip
            await ws.send(orjson.dumps({"event": "start", "streamSid": start["streamSid"], "start": start}).decode())
            await until(lambda: recorder.session_count == 1, timeout_s=5)
            await ws.send('{"event":"media","streamSid":"MZ' + "5" * 32 + '","media":{"payload":"not base64!"}}')  # ends it
            with pytest.raises(ConnectionClosed):
                while True:
                    await asyncio.wait_for(ws.recv(), 5)
        metrics = bridge.app.state.bridge.registry
        await until(lambda: (metrics.get_sample_value("callbridge_hangups_total", {"provider": "twilio", "result": "ok"}) or 0) == 1)
        await until(lambda: metrics.get_sample_value("callbridge_calls_total", {"provider": "twilio", "end": "protocol_error"}) == 1)
