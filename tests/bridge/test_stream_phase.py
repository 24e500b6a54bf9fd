"""The stream's phase and the account of its end (``bridge/stream_phase.py``) on its own: the transition table's
errors, and what each way of ending does to the engine session, the call and the carrier's socket."""

from __future__ import annotations

import pytest

from callbridge.bridge.agent_speech import AgentSpeech
from callbridge.bridge.call_options import CallOptions
from callbridge.bridge.call_outputs import CallOutput, CloseTransport, HangUpCall, ToEngine
from callbridge.bridge.call_state import CallState, CallStateError, Trigger
from callbridge.bridge.carrier_link import CarrierLink
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.stream_phase import StreamPhase
from callbridge.carriers.base import ProtocolErrorReason, RemoteProtocolError
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.engine.commands import CloseSession

pytestmark = pytest.mark.core


def phase_at(*triggers: Trigger) -> tuple[StreamPhase, list[CallOutput]]:
    out: list[CallOutput] = []
    link = CarrierLink(TwilioCodec(), out)
    phase = StreamPhase(link, AgentSpeech(CallOptions(), out, link), out, lambda reason, detail: RemoteProtocolError(reason, detail, provider="twilio"))
    for trigger in triggers:
        phase.go(trigger)
    return phase, out


def test_a_carrier_event_out_of_order_is_its_protocol_error_and_the_drivers_a_bug() -> None:
    phase, _ = phase_at()
    with pytest.raises(RemoteProtocolError) as refused:
        phase.go(Trigger.STOPPED)  # before its start
    assert refused.value.reason is ProtocolErrorReason.OUT_OF_ORDER and phase.state is CallState.AWAITING_START
    with pytest.raises(CallStateError):
        phase.go(Trigger.ENGINE_BOUND)


def test_a_protocol_error_of_a_known_call_closes_its_session_hangs_it_up_and_closes_the_socket_as_a_violation() -> None:
    phase, out = phase_at(Trigger.STARTED, Trigger.ENGINE_BOUND)
    phase.fail(RemoteProtocolError(ProtocolErrorReason.FLOOD, "too many", provider="twilio"), started=True)
    assert phase.over and phase.reason == "protocol_error:flood" and phase.failure is not None
    assert [type(o) for o in out] == [ToEngine, HangUpCall, CloseTransport]
    assert out[-1] == CloseTransport(1008)


def test_a_protocol_error_before_the_start_only_closes_the_socket() -> None:
    phase, out = phase_at()
    phase.fail(RemoteProtocolError(ProtocolErrorReason.OVERSIZED, "big", provider="twilio"), started=False)
    assert out == [CloseTransport(1008)]


def test_a_limit_on_a_live_call_closes_its_session_and_hangs_up_one_not_bridged_only_closes() -> None:
    phase, out = phase_at(Trigger.STARTED, Trigger.ENGINE_BOUND)
    phase.end_call(EndCause.of("max_call_duration"))
    assert out[0] == ToEngine(CloseSession("max_call_duration")) and isinstance(out[1], HangUpCall)
    assert phase.state is CallState.ENDED and out[-1] == CloseTransport(1000)
    starting, out = phase_at(Trigger.STARTED)
    starting.end_call(EndCause.of("first_message_timeout"))
    assert out == [CloseTransport(1000)] and starting.reason == "first_message_timeout"


def test_someone_elses_token_closes_as_a_policy_violation() -> None:
    phase, out = phase_at(Trigger.STARTED)
    phase.end(Trigger.START_REFUSED, EndCause(EndReason.BAD_TOKEN))
    assert out == [CloseTransport(1008)] and phase.close_code == 1008
