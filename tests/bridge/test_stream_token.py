"""Streams started by a team's own TwiML (#40): a token the application mints with ``server.stream_token_secret``
(``bridge/stream_token.py``) admits one stream of its call, once, until it expires; no token, a forged one, one for
another call or one seen before is refused — on Twilio's signed upgrade, and with ``twilio.unsigned_upgrades`` on an
unsigned one (a Twilio-protocol sender that does not sign)."""

from __future__ import annotations

import asyncio
import contextlib

import orjson
import pytest
from pydantic import SecretStr
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from callbridge.bridge.registry import MemoryCallRegistry, MemoryStreamTokens
from callbridge.bridge.stream_token import AppMintedTokens, mint_stream_token, stream_token_expiry
from callbridge.sim.runner import RunningBridge, running_bridge
from tests.bridge.twilio_e2e import RecordingEngine, engine, settings, until

SECRET = "a-secret-shared-with-the-application-0123"


class TestMinted:
    pytestmark = pytest.mark.core

    def test_a_token_is_valid_for_its_call_until_it_expires(self) -> None:
        token = mint_stream_token(SECRET, "CA1", 300, now_s=1000)
        assert token.startswith("cb1.1300.")
        assert stream_token_expiry(SECRET, token, "CA1", 1000) == 1300
        assert stream_token_expiry(SECRET, token, "CA1", 1300) is None  # expired
        assert stream_token_expiry(SECRET, token, "CA2", 1000) is None  # another call's
        assert stream_token_expiry("another-secret-of-thirty-two-chars!", token, "CA1", 1000) is None
        assert stream_token_expiry(SECRET, token[:-1] + ("0" if token[-1] != "0" else "1"), "CA1", 1000) is None
        assert stream_token_expiry(SECRET, mint_stream_token(SECRET, "CA1", 200_000, now_s=1000), "CA1", 1000) is None  # too long

    def test_a_short_secret_is_refused(self) -> None:
        with pytest.raises(ValueError, match="32"):
            mint_stream_token("short", "CA1")

    async def test_each_is_admitted_once_and_the_bridges_own_tokens_still_are(self) -> None:
        registry, inner = MemoryCallRegistry(), MemoryStreamTokens()
        tokens = AppMintedTokens(inner, SecretStr(SECRET), registry)
        minted = mint_stream_token(SECRET, "CA1")
        assert await tokens.consume(minted, "CA1") and not await tokens.consume(minted, "CA1")
        ours = await tokens.mint("CA2")
        assert await tokens.consume(ours, "CA2") and not await tokens.consume(ours, "CA2")
        assert not await tokens.consume(None, "CA3") and not await tokens.consume("cb1.x.y", "CA3")


async def _stream(bridge: RunningBridge, call_sid: str, token: str | None, *, signed: bool = True) -> None:
    """A Twilio-protocol stream to ``/twilio/media`` for ``call_sid`` (not answered by the bridge), with ``token``:
    read for a second (a refused one is closed by the bridge: ``ConnectionClosed``), then stopped."""
    url = bridge.base_url.replace("http://", "ws://") + "/twilio/media"
    headers = {"X-Twilio-Signature": RequestValidator(bridge.carrier.secret).compute_signature(url, {})} if signed else {}
    async with connect(url, additional_headers=headers) as ws:
        sid = "MZ" + call_sid[2:]
        start = {"streamSid": sid, "accountSid": bridge.carrier.account_sid, "callSid": call_sid, "tracks": ["inbound"],
                 "customParameters": {"token": token} if token else {},
                 "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}  # fmt: skip
        await ws.send('{"event":"connected","protocol":"Call","version":"1.0.0"}')
        await ws.send(orjson.dumps({"event": "start", "streamSid": sid, "start": start}).decode())
        with contextlib.suppress(TimeoutError):
            while True:
                await asyncio.wait_for(ws.recv(), 1.0)
        await ws.send(orjson.dumps({"event": "stop", "streamSid": sid, "stop": {"callSid": call_sid}}).decode())


async def _served(bridge: RunningBridge, recorder: RecordingEngine, call_sid: str, token: str | None, *, signed: bool = True) -> bool:
    """Whether the stream was bridged (an engine session opened for it) or refused."""
    opened = len(recorder.opened)
    with contextlib.suppress(ConnectionClosed):
        await _stream(bridge, call_sid, token, signed=signed)
    return len(recorder.opened) > opened


@pytest.mark.parametrize("signed", [True, False])
async def test_a_stream_of_the_teams_own_twiml_is_admitted_with_an_application_minted_token_only(signed: bool) -> None:
    recorder = engine()
    server: dict[str, object] = {"stream_token_secret": SECRET}
    async with running_bridge(settings(server=server, twilio={"unsigned_upgrades": not signed}), recorder) as bridge:
        call_sid = "CA" + "a1" * 16
        token = mint_stream_token(SECRET, call_sid)
        assert await _served(bridge, recorder, call_sid, token, signed=signed)
        await until(lambda: recorder.session_count == 0)
        assert not await _served(bridge, recorder, call_sid, token, signed=signed)  # once
        assert not await _served(bridge, recorder, "CA" + "b2" * 16, None, signed=signed)  # none
        assert not await _served(bridge, recorder, "CA" + "c3" * 16, token, signed=signed)  # another call's
        forged = mint_stream_token("not-the-secret-but-long-enough-000000", "CA" + "d4" * 16)
        assert not await _served(bridge, recorder, "CA" + "d4" * 16, forged, signed=signed)
        refused = bridge.app.state.bridge.registry.get_sample_value("callbridge_streams_refused_total", {"provider": "twilio", "reason": "bad_token"})
    assert refused == 4


async def test_an_unsigned_upgrade_is_refused_unless_the_setting_admits_it() -> None:
    async with running_bridge(settings(server={"stream_token_secret": SECRET}), engine()) as bridge:
        with pytest.raises(InvalidStatus) as refused:
            await _stream(bridge, "CA" + "e5" * 16, mint_stream_token(SECRET, "CA" + "e5" * 16), signed=False)
    assert refused.value.response.status_code == 403
