"""A placed call's answer on its stream (``AnswerGate``, #42), under a fake clock: the agent's audio held until who
answered is known — then played to a person, dropped for a machine, and the voicemail message left after its beep."""

from __future__ import annotations

from pathlib import Path

import pytest

from callbridge.application import MachineDetection
from callbridge.bridge.call_outputs import HangUpCall, Observed
from callbridge.codecs import pcm16_to_ulaw
from callbridge.engine.commands import AppendAudio, CancelResponse, CloseSession, CreateResponse, CreateTextItem
from callbridge.engine.events import AudioDelta, ResponseDone
from callbridge.sim.placed_call import beep
from callbridge.sim.runner import load_wav_8k
from tests.bridge.test_call import CallerSays, Harness, agent_audio

pytestmark = pytest.mark.core

ANSWERS = Path(__file__).resolve().parents[2] / "bench" / "corpus" / "answers"
VOICEMAIL = MachineDetection(mode="voicemail", voicemail_message="Say the clinic called.")
GREETING = "Greet them."


def frames(pcm: bytes) -> list[bytes]:
    """PCM16 8 kHz as the carrier's 20 ms μ-law payloads."""
    pcm = pcm + bytes(-len(pcm) % 320)
    return [pcm16_to_ulaw(pcm[i : i + 320]) for i in range(0, len(pcm), 320)]


def silence(ms: int) -> bytes:
    return bytes(16 * ms)


def says(h: Harness, pcm: bytes) -> None:
    """The callee's line, 20 ms a frame in real time (one media timeline per call)."""
    line = h.__dict__.setdefault("callee_line", CallerSays(h))
    for payload in frames(pcm):
        line(payload)
        h.advance(20)


def answered_by(h: Harness) -> list[str | None]:
    return [o.detail for o in h.outputs if isinstance(o, Observed) and o.kind == "answered-by"]


def greeted(detection: MachineDetection) -> Harness:
    """Bound with ``detection``, the greeting asked for and its first second of audio come from the engine."""
    h = Harness().live(machine_detection=detection, greeting=GREETING)
    assert [c.text for c in h.of(CreateTextItem)] == [GREETING]
    h.engine(AudioDelta(agent_audio(1000), 24000, "resp-1", "item_resp-1", 0))
    return h


def test_a_person_hears_the_held_greeting_from_its_start_300_ms_after_their_hello() -> None:
    h = greeted(VOICEMAIL)
    hello = load_wav_8k(ANSWERS / "person-0-f2.wav")  # "Hello?", 480 ms
    says(h, hello + silence(280))
    assert h.media_frames() == [] and answered_by(h) == []  # held: nothing of the agent yet
    assert {c.overlap for c in h.of(AppendAudio)} == {"listen"}  # the hello does not cut a greeting it never heard
    says(h, silence(40))
    assert answered_by(h) == ["person:short_greeting"]
    assert len(h.media_frames()) >= 5  # the greeting from its start, up to the lead
    assert h.of(CancelResponse) == []


def test_without_a_held_reply_the_callees_words_are_a_turn() -> None:
    """No greeting: nothing is held, so the callee's hello goes to the engine as any caller's words (its answer is
    held until who answered is known)."""
    h = Harness().live(machine_detection=VOICEMAIL)
    says(h, load_wav_8k(ANSWERS / "person-0-f2.wav"))
    assert h.of(AppendAudio) and {c.overlap for c in h.of(AppendAudio)} == {None}


def test_a_machine_is_hung_up_on_without_hearing_the_agent() -> None:
    h = greeted(MachineDetection(mode="hang_up"))
    says(h, load_wav_8k(ANSWERS / "machine-0-m3.wav")[: 16 * 3000])
    assert answered_by(h) == ["machine:long_greeting"]
    assert h.media_frames() == []
    assert h.of(CancelResponse) and h.of(CloseSession)
    assert [o.reason for o in h.outputs if isinstance(o, HangUpCall)] == ["machine_detected"]


def test_a_machine_gets_the_voicemail_message_after_its_beep_then_the_hang_up() -> None:
    h = greeted(VOICEMAIL)
    says(h, load_wav_8k(ANSWERS / "machine-0-m3.wav") + silence(300))
    assert answered_by(h) == ["machine:long_greeting"] and h.of(CancelResponse)
    assert h.media_frames() == [] and len(h.of(CreateTextItem)) == 1  # waiting for the greeting's end
    says(h, beep() + silence(60))  # its end is known a frame or two after it
    cues = [o for o in h.outputs if isinstance(o, Observed) and o.kind == "voicemail-cue"]
    assert [c.detail for c in cues] == ["beep"]
    assert [c.text for c in h.of(CreateTextItem)] == [GREETING, "Say the clinic called."] and h.of(CreateResponse)
    assert h.media_frames() == []
    h.engine(AudioDelta(agent_audio(600), 24000, "resp-2", "item_resp-2", 0))  # the message
    h.engine(ResponseDone("resp-2", "completed", None, 0))
    assert h.media_frames()  # played at once: nothing holds it now
    h.advance(1000)
    assert [o.kind for o in h.outputs if isinstance(o, Observed) and o.kind == "voicemail-left"] == ["voicemail-left"]
    assert [o.reason for o in h.outputs if isinstance(o, HangUpCall)] == ["voicemail_left"]
    assert len(h.media_frames()) >= 30  # the whole message, 600 ms (and the last frame padded)


def test_late_audio_of_a_reply_to_the_machine_is_dropped() -> None:
    """The reply being generated when the machine is known is cancelled; what still comes of it never plays."""
    h = greeted(VOICEMAIL)
    says(h, load_wav_8k(ANSWERS / "machine-0-m3.wav")[: 16 * 3000])
    h.engine(AudioDelta(agent_audio(400), 24000, "resp-1", "item_resp-1", 0))
    says(h, load_wav_8k(ANSWERS / "machine-0-m3.wav")[16 * 3000 :] + silence(300) + beep() + silence(40))
    assert h.media_frames() == []


def test_nobody_heard_taken_for_a_machine_gets_the_message_at_once() -> None:
    """``on_uncertain`` machine: 3 s of nobody is no greeting to wait out — the message is asked for then (the
    classifier cues only a machine it heard)."""
    h = greeted(MachineDetection(mode="voicemail", voicemail_message="Say the clinic called.", on_uncertain="machine"))
    says(h, silence(3100))
    assert answered_by(h) == ["uncertain:silence"]
    assert [c.text for c in h.of(CreateTextItem)] == [GREETING, "Say the clinic called."]
    h.engine(AudioDelta(agent_audio(400), 24000, "resp-2", "item_resp-2", 0))
    assert h.media_frames()  # the message plays


def test_nobody_heard_taken_for_a_person_hears_the_greeting() -> None:
    h = greeted(VOICEMAIL)  # on_uncertain: person
    says(h, silence(3100))
    assert answered_by(h) == ["uncertain:silence"] and h.media_frames()
