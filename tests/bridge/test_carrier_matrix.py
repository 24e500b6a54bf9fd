"""The end-to-end matrix, for every carrier: a bridge on uvicorn, the carrier's simulator over real loopback
sockets with its quirks, and the embedded engine.

Each carrier runs: a conversation, a barge-in (the flush, and the heard position right within one frame),
DTMF, the bridge hanging up, a drop that resumes the same engine session (where the carrier reconnects),
forged credentials, and every bad input its wire allows — each ending only its own call while a good
call carries on. SIP is the exception for bad input: a malformed SIP message is answered (400, 481, 501 …)
or dropped and counted, a stray RTP datagram is dropped and counted, and the call it reached carries on too
(RFC 3261 §8.2, RFC 3550: a UDP port takes whatever arrives).
"""

from __future__ import annotations

import asyncio

import pytest

from callbridge.bridge.ws_protocol import PRE_AUTH_MAX_MESSAGE_BYTES
from callbridge.carriers.exotel.wire import exotel_frame_ms
from callbridge.carriers.sip.listener import SipListener
from callbridge.carriers.sip.sim import SimulatedSip, SipStream
from callbridge.engine.commands import (
    AckPlayback,
    CloseSession,
    CreateTextItem,
    TruncateItem,
)
from callbridge.outbound_http import http_client
from callbridge.sim.carrier import CallerScript, CallResult, SimCall, WebSocketConnection
from callbridge.sim.runner import running_bridge
from callbridge.sim.simulators import simulated
from tests.bridge.twilio_e2e import LoopStalls, engine, heard_of_the_interrupted_reply, settings, short_speech, until

pytestmark = pytest.mark.hot_path
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

SIMULATED = simulated()

SPEECH_MS = 1500
CARRIERS = sorted(SIMULATED)


@pytest.mark.parametrize("provider", CARRIERS)
async def test_conversation(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        result = await bridge.carrier.place_call(CallerScript(utterances=((300, short_speech()),)))
        sim = bridge.carrier
        # a carrier that says nothing on the socket when the caller hangs up tells the bridge by webhook (Plivo,
        # Vonage, Telnyx) or does not come back within its reconnect window (AudioSocket): the session closes
        await until(lambda: recorder.session_count == 0, timeout_s=6)
    assert result.warnings == [] and result.hung_up_by == "caller" and len(result.streams) == 1, result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000, result.render()  # the echo: prefix, speech, tail
    if sim.uses_marks:
        assert len(result.marks_echoed) >= result.agent_speech_ms // 200 - 1
    (session_id,) = recorder.opened
    acks = [c for c in recorder.commands[session_id] if isinstance(c, AckPlayback)]
    assert acks and acks[-1].played_ms >= result.agent_speech_ms - 100
    if sim.says_goodbye:
        assert recorder.commands[session_id][-1] == CloseSession("call_ended")  # the caller's hang-up closes it
        assert recorder.session_count == 0


@pytest.mark.parametrize("provider", CARRIERS)
async def test_barge_in_flushes_and_acks_what_was_heard(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=6000)
        async with LoopStalls() as stalls:
            result = await bridge.carrier.place_call(script)
        clear_latency = bridge.app.state.bridge.registry.get_sample_value("callbridge_barge_in_clear_seconds_sum")
    assert result.warnings == [], result.render()
    truncates = recorder.of(TruncateItem)
    if SIMULATED[provider].says_goodbye:
        assert len(truncates) == 1
    # else the caller's hang-up at 6 s is a plain close, cut like a drop: the reply then playing is truncated too
    truncate = truncates[0]
    heard_acks = [a for a in recorder.of(AckPlayback) if f"item_{a.response_id}" == truncate.item_id]
    assert heard_acks[-1].played_ms == truncate.audio_end_ms
    heard, replayed_ms = heard_of_the_interrupted_reply(result, exotel_frame_ms(8000) if provider == "exotel" else 20)
    # A carrier with a buffer plays on until the flush arrives: what it played between the bridge's decision and
    # the flush's arrival (the event loop's lag here, on a loaded test machine) is heard but cannot be known.
    in_flight_ms = max(0.0, (result.cleared_at_s[-1] - recorder.truncated_at_s[0]) * 1000) if result.clears else 0.0
    tolerance_ms = stalls.heard_tolerance_ms + in_flight_ms + replayed_ms
    assert abs(truncate.audio_end_ms - heard) <= tolerance_ms, (truncate.audio_end_ms, heard, result.render())
    assert heard < SPEECH_MS  # cut short, not played out
    if result.clears:  # carriers with a buffer of their own get a flush (each pause one); the others stop getting audio
        assert result.clears[-1] > 0
    assert clear_latency is not None and clear_latency < 0.05


@pytest.mark.parametrize("provider", CARRIERS)
async def test_dtmf_reaches_the_engine(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        result = await bridge.carrier.place_call(CallerScript(dtmf=((200, "5"), (400, "#")), hangup_at_ms=700))
    assert result.warnings == [], result.render()
    assert recorder.of(CreateTextItem) == [CreateTextItem("DTMF 5"), CreateTextItem("DTMF #")]


@pytest.mark.parametrize("provider", CARRIERS)
async def test_bridge_hangs_up_when_the_engine_session_ends(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        call = asyncio.create_task(bridge.carrier.place_call(CallerScript(hangup_at_ms=5000)))
        await until(lambda: recorder.session_count == 1)
        await recorder.sessions[recorder.opened[0]].close("agent_ended_the_call")
        result = await call
    assert result.hung_up_by == "bridge", result.render()
    assert result.heard_ms < 4000


@pytest.mark.parametrize("provider", CARRIERS)
async def test_drop_resumes_the_same_session(provider: str) -> None:
    if not SIMULATED[provider].can_reconnect:
        pytest.skip(f"{provider} does not reconnect a dropped media connection")
    recorder = engine(agent="tone")
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        script = CallerScript(utterances=((1500, short_speech(800)),), drop_stream_at_ms=(1000,), hangup_at_ms=3500)
        result = await bridge.carrier.place_call(script)
    assert len(result.streams) == 2 and result.warnings == [], result.render()
    assert recorder.opened == recorder.resumed == [recorder.opened[0]]  # one session, resumed
    # the 660 ms greeting once, not replayed on the new stream (1320 ms); padded to the carrier's outbound chunk
    # (Exotel at 8 kHz: 200 ms)
    assert 600 <= result.agent_speech_ms <= 860, result.render()


@pytest.mark.parametrize("provider", CARRIERS)
async def test_forged_credentials_are_refused(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        assert await bridge.carrier.forged_requests_refused()
    assert recorder.opened == []


UNKNOWN_EVENT_TYPES = {"vonage": "websocket:transcription", "audiosocket": "0x20", "jambonz": "playDone"}
"""The event type each simulator's ``unknown_event`` names (the JSON carriers: ``transcription``)."""


@pytest.mark.parametrize("provider", CARRIERS)
async def test_an_event_type_the_carrier_adds_is_ignored_and_counted(provider: str) -> None:
    """Fail open on the unknown (issue #15): three messages of an event type the carrier might add tomorrow, on a
    live call, before and while the caller speaks: the conversation goes on as if they were not there, each is
    counted by its type, and the type is logged once."""
    if provider == "sip":
        pytest.skip("SIP answers an unknown method 501 and drops an unknown RTP payload type, counted: test_sip_bad_input_...")
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        script = CallerScript(utterances=((300, short_speech()),), unknown_events_at_ms=(200, 400, 600))
        result = await bridge.carrier.place_call(script)
        metrics = bridge.app.state.bridge.registry
        labels = {"provider": provider, "event": UNKNOWN_EVENT_TYPES.get(provider, "transcription")}
        await until(lambda: metrics.get_sample_value("callbridge_unknown_events_total", labels) == 3)
    assert result.warnings == [] and result.hung_up_by == "caller" and len(result.streams) == 1, result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000, result.render()
    assert recorder.session_count == 0 or not bridge.carrier.says_goodbye


@pytest.mark.parametrize("provider", CARRIERS)
async def test_bad_input_ends_only_its_own_call(provider: str) -> None:
    if provider == "sip":
        pytest.skip("a SIP call carries on through bad input: test_sip_bad_input_is_answered_or_dropped_and_counted")
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        sim = bridge.carrier
        metrics = bridge.app.state.bridge.registry
        good_call = asyncio.create_task(sim.place_call(CallerScript(utterances=((300, short_speech()),))))
        await until(lambda: recorder.session_count == 1)
        expected: dict[str, int] = {}
        names: list[str] | None = None
        index = 0
        while names is None or index < len(names):
            call = SimCall(sim.new_call_id(), CallResult("bad_input"), lambda: 0)
            sim.calls[call.call_id] = call
            stream = await sim.open_stream(call, "answer")
            assert stream is not None
            cases = sim.bad_inputs(stream)
            if names is None:
                names = sorted(cases)
                assert len(names) >= 5
            case = names[index]
            index += 1
            await until(lambda: recorder.session_count == 2)
            message, reason = cases[case]
            await stream.conn.send(message)

            async def closed(s=stream) -> None:  # type: ignore[no-untyped-def]
                async for _ in s.conn.messages():
                    pass

            await asyncio.wait_for(closed(), 5)
            # a websocket is closed with 1008 (policy violation), or 1009 (message too big) where the message was
            # refused unread, over the protocol's limit; a TCP carrier's connection has no close code
            too_big = len(message) > PRE_AUTH_MAX_MESSAGE_BYTES
            expected_code = (1009 if too_big else 1008) if isinstance(stream.conn, WebSocketConnection) else None
            assert stream.conn.close_code == expected_code, (case, stream.conn.close_code)
            await until(lambda: recorder.session_count == 1)
            expected[reason] = expected.get(reason, 0) + 1
            labels = {"provider": provider, "reason": reason}
            count = expected[reason]
            await until(lambda n=count, by=labels: metrics.get_sample_value("callbridge_carrier_protocol_errors_total", by) == n)
        async with http_client() as http:
            assert (await http.get(bridge.base_url + "/healthz")).status_code == 200
        result = await good_call
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000


def _sip_counter(listener: SipListener, call_id: str, name: str) -> int:
    """A SIP drop counter: the listener's (SIP datagrams), or the call's RTP codec's while the call is up (the
    listener adds those up when the call ends)."""
    codec = listener.calls[call_id].transport.codec
    per_call = {"rtp_malformed": codec.malformed, "rtp_other_payload_type": codec.other_payload_types, "rtp_dtmf_malformed": codec.dtmf.malformed}
    return per_call[name] if name in per_call else listener.dropped[name]


async def test_sip_bad_input_is_answered_or_dropped_and_counted() -> None:
    """Each bad input on a call's SIP and RTP sockets gets its RFC answer, or is dropped and counted; the call
    carries on (and hangs up cleanly at the end) and so does another call."""
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="sip") as bridge:
        sim = bridge.carrier
        listener = bridge.app.state.bridge.services.carrier_state["sip"]
        assert isinstance(listener, SipListener)
        good_call = asyncio.create_task(sim.place_call(CallerScript(utterances=((300, short_speech()),))))
        await until(lambda: recorder.session_count == 1)
        call = SimCall(sim.new_call_id(), CallResult("bad_input"), lambda: 0)
        sim.calls[call.call_id] = call
        stream = await sim.open_stream(call, "answer")
        assert isinstance(stream, SipStream)

        async def receive(s: SipStream = stream) -> None:
            async for message in s.conn.messages():
                s.receive(message)

        receiver = asyncio.create_task(receive())
        await until(lambda: recorder.session_count == 2)
        cases = sim.bad_inputs(stream)
        assert len(cases) >= 10
        dropped: dict[str, int] = {}
        for case, (message, expected) in sorted(cases.items()):
            kind, _, what = expected.partition(":")
            if kind == "dropped":
                dropped[what] = dropped.get(what, 0) + 1
            if kind == "status":
                answered = len(stream.responses)
                await stream.conn.send(message)
                await until(lambda n=answered: len(stream.responses) > n)
                assert stream.responses[-1][1] == int(what), (case, stream.responses)
            else:
                before = _sip_counter(listener, call.call_id, what)
                await stream.conn.send(message)
                await until(lambda w=what, n=before: _sip_counter(listener, call.call_id, w) == n + 1)
        assert recorder.session_count == 2 and not call.ended.is_set()  # the call took it all and is still up
        await stream.send_stop()
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
        await until(lambda: recorder.session_count == 1)
        metrics = bridge.app.state.bridge.registry
        for reason, count in dropped.items():  # every drop in Prometheus, by reason
            labels = {"reason": reason}
            await until(lambda n=count, by=labels: metrics.get_sample_value("callbridge_sip_dropped_total", by) == n)
        async with http_client() as http:
            assert (await http.get(bridge.base_url + "/healthz")).status_code == 200
        result = await good_call
    assert ("BYE", 200) in stream.responses and call.result.warnings == [], (stream.responses, call.result.warnings)
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000


async def test_sip_trunk_outside_the_allow_list_gets_in_with_digest_credentials() -> None:
    """The other half of SIP's forged-credentials case: the right password from 127.0.0.2 answers the 401."""
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="sip") as bridge:
        trunk = SimulatedSip(bridge.base_url, bridge.carrier.secret, codec="PCMA", local_host="127.0.0.2")
        trunk.configure(bridge.settings)
        result = await trunk.place_call(CallerScript(utterances=((300, short_speech(800)),), hangup_at_ms=3000))
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    assert "200 OK: PCMA" in result.render() and result.agent_speech_ms >= 800, result.render()
    assert recorder.of(CloseSession) == [CloseSession("call_ended")]
