"""A call, fuzzed end to end without sockets: a ``CallSession`` on each carrier's codec, fed near-valid carrier
messages, engine frames (fuzzed, parsed by the wire client's parser, as the pump would get them), clock jumps,
dropped sockets and finished agent actions, in any order, driven the way ``MediaStreamDriver`` drives it.

Nothing escapes; every message it sends is one its codec makes; its deadlines never stay in the past (a
pacer would spin); a failing engine's fallback plays out and hangs up; and the bridge can always end it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from callbridge.bridge.actions import ActionResult
from callbridge.bridge.binding import EngineBinding
from callbridge.bridge.call import CallOptions, CallSession, CallState
from callbridge.bridge.call_outputs import Perform, ToCarrier
from callbridge.bridge.end_reason import EndCause
from callbridge.carriers.audiosocket.wire import AudioSocketCodec
from callbridge.engine.errors import EngineError
from callbridge.engine.events import Capabilities
from callbridge.engine.wire import parse_server_event
from tests.fuzz.strategies import budget, messages, mutated
from tests.fuzz.test_audiosocket import UUID_FRAME, _frames
from tests.fuzz.test_codecs import CODECS, opening
from tests.fuzz.test_engine_wire import PCM, SERVER_EVENTS

pytestmark = [pytest.mark.hot_path, pytest.mark.background]
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

CAPS = Capabilities(
    supports_barge_in=True, supports_session_resume=True, supports_audio_truncate=True, supports_playback_ack=True
)
_LONG_AUDIO = {
    "type": "response.output_audio.delta",
    "response_id": "resp-2",
    "delta": PCM * 20,
    "sample_rate_hz": 24000,
}
ENGINE_FRAMES = [*SERVER_EVENTS, _LONG_AUDIO, {**_LONG_AUDIO, "sample_rate_hz": 16000}]
CARRIERS: dict[str, Any] = {name: CODECS[name] for name in ("twilio", "telnyx", "plivo", "exotel", "vonage", "detect")}
CARRIERS["audiosocket"] = (AudioSocketCodec, None, _frames())


def _steps(name: str) -> st.SearchStrategy[list[tuple[str, Any]]]:
    _, templates, binary = CARRIERS[name]
    carrier = binary if templates is None else messages(templates, binary=binary, max_changes=1)
    step = st.one_of(
        st.tuples(st.just("carrier"), carrier),
        st.tuples(st.just("carrier"), carrier),
        st.tuples(st.just("engine"), st.sampled_from(ENGINE_FRAMES)),
        st.tuples(
            st.just("engine"),
            st.sampled_from(ENGINE_FRAMES).flatmap(lambda p: mutated(p, 1)).filter(lambda p: isinstance(p, dict)),
        ),
        st.tuples(st.just("tick"), st.sampled_from([0, 1, 20, 100, 700, 5000, 60_000])),
        st.tuples(st.just("bind"), st.booleans()),
        st.tuples(st.just("lost"), st.just(None)),
        st.tuples(st.just("action"), st.booleans()),
    )
    return st.lists(step, max_size=30)


class Driver:
    """What ``MediaStreamDriver`` does with the core, with a clock of our own."""

    def __init__(self, call: CallSession) -> None:
        self.call = call
        self.now_ms = 0
        self.pending: list[str] = []
        self.states: set[CallState] = set()

    def drain(self) -> None:
        self.states.add(self.call.state)
        self.take_outputs()
        self.pace()

    def take_outputs(self) -> None:
        for output in self.call.outputs():
            if isinstance(output, ToCarrier):
                assert isinstance(output.message, str | bytes) and output.message
            elif isinstance(output, Perform):
                self.pending.append(output.pending.call_id)

    def pace(self) -> None:
        """Tick while a deadline is due; one still due after that many ticks at one instant is a spinning pacer."""
        for _ in range(1000):
            deadline = self.call.next_deadline_ms()
            if deadline is None or deadline > self.now_ms:
                return
            self.call.tick(self.now_ms)
            self.take_outputs()
        raise AssertionError(f"deadline {self.call.next_deadline_ms()} still due at {self.now_ms} ({self.call.state})")

    def advance(self, ms: int) -> None:
        end = self.now_ms + ms
        while (deadline := self.call.next_deadline_ms()) is not None and deadline <= end:
            self.now_ms = max(self.now_ms, deadline)
            self.drain()
        self.now_ms = end
        self.drain()

    def step(self, kind: str, value: Any) -> None:
        call = self.call
        if kind == "carrier":
            call.receive_message(value, self.now_ms)
        elif kind == "engine":
            try:
                event = parse_server_event(value).event
            except EngineError:
                return  # the client logs and skips it
            if event is not None:
                call.receive_engine_event(event, self.now_ms)
        elif kind == "tick":
            self.advance(value)
            return
        elif kind == "bind" and call.state is CallState.STARTING and call.start_request is not None:
            if value:
                call.engine_bound(EngineBinding(CAPS), self.now_ms)
            else:
                call.start_refused(EndCause.of("fuzz"))
        elif kind == "lost":
            call.transport_lost(self.now_ms)
        elif kind == "action" and self.pending:
            call.action_finished(
                self.pending.pop(0), ActionResult.done() if value else ActionResult.failed("fuzz"), self.now_ms
            )
        self.drain()


@pytest.mark.parametrize("name", sorted(CARRIERS))
@budget(0.5)
@given(data=st.data())
def test_a_call_survives_any_sequence_and_always_ends(name: str, data: st.DataObject) -> None:
    factory = CARRIERS[name][0]
    driver = Driver(CallSession(factory(), CallOptions(lead_ms=100, failure_tone_ms=600)))
    if data.draw(st.booleans(), label="from a live call"):
        start = [UUID_FRAME, b"\x10\x01\x40" + bytes(320)] if name == "audiosocket" else opening(name)
        for message in start:
            driver.step("carrier", message)
        driver.step("bind", True)
    elif name == "audiosocket":
        driver.step("carrier", UUID_FRAME)
    for kind, value in data.draw(_steps(name), label="steps"):
        driver.step(kind, value)
    call = driver.call
    event(f"reached {'+'.join(sorted(s.value for s in driver.states))}")  # --hypothesis-show-statistics
    if call.state is CallState.ENDING:  # the fallback tone plays out, then the call is hung up
        driver.advance(5000)
        assert call.state is CallState.ENDED and call.link.closed, call.state
    call.end_call(EndCause.of("fuzz_end"), driver.now_ms)  # the bridge can always end it: its driver stops at these states
    driver.drain()
    assert call.state in (CallState.ENDED, CallState.DETACHED) and call.next_deadline_ms() is None
