"""A placed call's answer, judged on the call (#42), end to end: ``POST /calls`` with ``machine_detection``, the
simulated Twilio's callee a person ("Hello?") or a voicemail greeting and its beep from the answers' corpus — the
agent's audio held until the bridge knows who answered, what each hears, and what the application is told."""

from __future__ import annotations

from pathlib import Path

import pytest

from callbridge.application.events import CallReport
from callbridge.carriers.twilio.sim import SimulatedTwilio
from callbridge.sim.callee import Callee
from callbridge.sim.caller import CallResult
from callbridge.sim.carrier import CallerScript
from callbridge.sim.placed_call import beep
from callbridge.sim.runner import load_wav_8k, running_bridge
from tests.bridge import agent_app
from tests.bridge.test_outbound_e2e import CALLEE, OURS, events_of, outbound_settings, post_call
from tests.bridge.twilio_e2e import engine, until

ANSWERS = Path(__file__).resolve().parents[2] / "bench" / "corpus" / "answers"
SPEAKS_AT_MS = 300
"""The callee's first word, after the answer."""
BEEP_MS = 400
MESSAGE = "Leave a message that the clinic called about tomorrow's appointment."


@pytest.fixture(autouse=True)
def _fresh_app() -> None:
    agent_app.CallsOut.asked.clear()
    agent_app.CallsOut.events.clear()


async def place(script: CallerScript, **request: object) -> tuple[CallResult, list[str], CallReport]:
    """One call placed with ``request``'s fields to a callee acting ``script`` from the answer."""
    async with running_bridge(outbound_settings(), engine()) as bridge:
        assert isinstance(bridge.carrier, SimulatedTwilio)
        bridge.carrier.callees[CALLEE] = Callee(ring_ms=100, script=script)
        response = await post_call(bridge, {"carrier": "twilio", "to": CALLEE, "from": OURS, **request})
        assert response.status_code == 202, response.text
        dial_id = response.json()["dial_id"]
        await until(lambda: len(bridge.carrier.dialled) == 1)
        (ringing,) = bridge.carrier.dialled.values()
        result = await ringing
        assert result is not None
        await until(lambda: "call.ended" in events_of(dial_id), timeout_s=5)
    report = CallReport.model_validate(agent_app.CallsOut.events[-1][1].data["report"])
    return result, events_of(dial_id), report


async def test_a_person_hears_the_agent_soon_after_their_hello() -> None:
    """"Hello?" (480 ms) and the person waits: nothing of the agent before it — its greeting, generated at the
    answer, is held — then the greeting within 500 ms of the hello's end (the decision comes 300 ms after it);
    ``call.machine_detected`` says person."""
    hello = load_wav_8k(ANSWERS / "person-0-f2.wav")
    result, kinds, report = await place(
        CallerScript(utterances=((SPEAKS_AT_MS, hello),), hangup_at_ms=4000), machine_detection="voicemail", voicemail_message=MESSAGE
    )
    hello_end_ms = SPEAKS_AT_MS + len(hello) // 16
    first = result.first_agent_heard_ms
    assert first is not None and hello_end_ms <= first <= hello_end_ms + 500, (first, hello_end_ms, result.render())
    assert kinds[:5] == ["call.dialing", "call.ringing", "call.started", "call.answered", "call.machine_detected"], kinds
    detected = next(event for call, event in agent_app.CallsOut.events if event.type == "call.machine_detected")
    assert (detected.data["answered_by"], detected.data["why"]) == ("person", "short_greeting"), detected.data
    assert report.answered_by == "person" and report.end_reason.startswith("caller_hung_up"), report
    # known 300 ms after their hello's end (780 ms after the answer), on the callee's audio clock; that nothing was
    # heard before is the callee's own timeline above (the agent's first audio, timed from the engine's bind, comes
    # sooner after the bind where a loaded process bound late: no bound on it)
    assert report.answered_by_after_ms is not None and report.answered_by_after_ms >= 1060, report
    assert report.first_agent_audio_ms is not None, report
    assert "call.voicemail_left" not in kinds


async def test_a_machine_hears_nothing_before_its_beep_then_the_whole_message() -> None:
    """A voicemail greeting (5.8 s), its beep 300 ms later: the agent's audio never reaches the machine before the
    beep has ended; the voicemail message starts within 500 ms of it, plays whole, and then the bridge hangs up
    (``voicemail_left``); the application hears ``call.machine_detected`` (machine) and ``call.voicemail_left``."""
    greeting = load_wav_8k(ANSWERS / "machine-0-m3.wav")
    beep_at_ms = SPEAKS_AT_MS + len(greeting) // 16 + 300
    answer = greeting + bytes(300 * 16) + beep()
    result, kinds, report = await place(
        CallerScript(utterances=((SPEAKS_AT_MS, answer),), hangup_at_ms=25_000), machine_detection="voicemail", voicemail_message=MESSAGE
    )
    beep_end_ms = beep_at_ms + BEEP_MS
    first = result.first_agent_heard_ms
    assert first is not None and beep_end_ms <= first <= beep_end_ms + 500, (first, beep_end_ms, result.render())
    assert result.hung_up_by == "bridge" and set(result.played_ms_at_clear) <= {0}, result.render()  # nothing heard was cut
    assert report.end_reason == "voicemail_left" and report.ended_by == "agent" and report.answered_by == "machine", report
    assert kinds.index("call.machine_detected") < kinds.index("call.voicemail_left") < kinds.index("call.ended"), kinds
    detected = next(event for call, event in agent_app.CallsOut.events if event.type == "call.machine_detected")
    assert detected.data["answered_by"] == "machine", detected.data


async def test_a_machine_is_hung_up_on_and_never_hears_the_agent() -> None:
    """``hang_up``: once its greeting is known for a machine's (speech going on past 2.5 s), the call ends; the
    machine heard nothing of the agent."""
    greeting = load_wav_8k(ANSWERS / "machine-0-m3.wav")
    result, kinds, report = await place(CallerScript(utterances=((SPEAKS_AT_MS, greeting + beep()),), hangup_at_ms=25_000), machine_detection="hang_up")
    assert result.first_agent_heard_ms is None, result.render()
    assert result.hung_up_by == "bridge"
    assert report.end_reason == "machine_detected" and report.answered_by == "machine", report
    assert report.answered_by_after_ms is not None and report.answered_by_after_ms <= SPEAKS_AT_MS + 2500 + 200, report
    assert "call.voicemail_left" not in kinds
