"""Our wire code against vllm-omni 0.30.0's own classes: every command we send is accepted by its
translator, and every event it emits parses into the right typed event."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from callbridge.engine import commands as ours
from callbridge.engine import events as our_events
from callbridge.engine.port import ResumeTicket, SessionConfig, TurnDetection
from callbridge.engine.projection import WireProjection
from callbridge.engine.wire import (
    command_to_wire,
    parse_server_event,
    session_resume,
    session_update,
)
from tests.engine.vllm_omni_wheel import vllm_omni  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.core, pytest.mark.usefixtures("vllm_omni")]


@pytest.mark.parametrize(
    ("command", "expected", "fields"),
    [
        (ours.AppendAudio(b"\x01\x00" * 160, 8000), "AppendAudio", {"format": "pcm_f32le", "sample_rate_hz": 16000}),
        (ours.Commit(True), "Commit", {"create_response": True}),
        (ours.Commit(), "Commit", {"create_response": None}),
        (ours.CreateResponse(), "CreateResponse", {}),
        (ours.CancelResponse("resp-1"), "CancelResponse", {"response_id": "resp-1"}),
        (ours.BargeIn(), "BargeIn", {}),
        (ours.ClearOutputAudio("resp-1"), "ClearOutputAudio", {"response_id": "resp-1"}),
        (ours.ClearInput(), "ClearInput", {}),
        (ours.AckPlayback("resp-1", 1200), "AckPlayback", {"played_ms": 1200, "response_id": "resp-1", "item_id": "item_resp-1"}),
        (ours.TruncateItem("item_resp-1", 900), "TruncateItem", {"item_id": "item_resp-1", "audio_end_ms": 900}),
        (ours.CreateTextItem("DTMF 5"), "CreateItem", {}),
        (ours.Heartbeat(), "Heartbeat", {}),
        (ours.CloseSession("call_ended"), "CloseSession", {"reason": "call_ended"}),
    ],
)
def test_every_command_is_accepted_by_vllm_omni(command: ours.EngineCommand, expected: str, fields: dict[str, Any]) -> None:
    from vllm_omni.engine.duplex.commands import command_from_realtime
    from vllm_omni.protocol.duplex import RealtimeInputDefaults

    defaults = RealtimeInputDefaults().with_session_payload(SessionConfig(input_rate_hz=8000).to_realtime())
    translated = command_from_realtime(command_to_wire(command), defaults=defaults)
    assert type(translated).__name__ == expected
    for name, value in fields.items():
        assert getattr(translated, name) == value
    if isinstance(command, ours.AppendAudio):
        assert len(translated.audio) == 320 * 4  # 20 ms at 8 kHz → 320 float32 samples at 16 kHz


def test_an_append_marked_listen_reaches_vllm_omnis_overlap_policy_as_the_clients_listen() -> None:
    """#41's bridge mode: the mark rides on the append as ``overlap_action``, which vllm-omni 0.30 keeps among the
    append's hints and its ``overlap_policy.decide`` reads as the client's *listen*; ours reads the same back."""
    from vllm_omni.engine.duplex.commands import command_from_realtime
    from vllm_omni.protocol.duplex import RealtimeInputDefaults

    from callbridge.codecs import AudioEncoding
    from callbridge.engine.wire import InputFormat, parse_client_command

    wire = command_to_wire(ours.AppendAudio(b"\x01\x00" * 160, 16000, "listen"))
    assert wire["overlap_action"] == "listen"
    defaults = RealtimeInputDefaults().with_session_payload(SessionConfig(input_rate_hz=16000).to_realtime())
    translated = command_from_realtime(wire, defaults=defaults)
    assert translated.payload()["overlap_action"] == "listen"
    assert "overlap_action" not in command_to_wire(ours.AppendAudio(b"\x01\x00" * 160, 16000))
    for value, read in (("listen", "listen"), ("Continue", "listen"), ("barge_in", None), (7, None)):
        parsed = parse_client_command({**wire, "overlap_action": value}, InputFormat(AudioEncoding.L16, 16000))
        assert isinstance(parsed, ours.AppendAudio) and parsed.overlap == read, value


def test_session_update_passes_vllm_omnis_validation() -> None:
    from vllm_omni.engine.duplex.config import DuplexSessionConfig

    config = SessionConfig(model="openbmb/MiniCPM-o-4_5", input_rate_hz=8000, ref_audio="data:audio/wav;base64,AAAA", turn_detection=TurnDetection(silence_duration_ms=400))
    payload = session_update(config)
    resolved = DuplexSessionConfig.from_realtime(payload["session"])
    assert resolved.response_format == "pcm"  # not wav
    assert resolved.overlap_policy == "barge_in_on_speech"
    assert resolved.extra_body["realtime_turn_detection"]["silence_duration_ms"] == 400
    no_vad = DuplexSessionConfig.from_realtime(SessionConfig(turn_detection=None).to_realtime())
    assert no_vad.overlap_policy == "listen_only"


def test_a_calls_engine_options_reach_vllm_omnis_session_as_its_extra_body() -> None:
    """What a model's plugin reads its own options from (AURA-Omni's ``prepare_runtime_config``: ``tts_language``,
    ``tts_speaker`` from ``config.extra_body``), beside what vllm-omni derives itself."""
    from vllm_omni.engine.duplex.config import DuplexSessionConfig

    config = SessionConfig(model="AURA-Omni", extra_body={"tts_language": "English", "tts_speaker": "Ryan"})
    resolved = DuplexSessionConfig.from_realtime(session_update(config)["session"])
    assert resolved.extra_body["tts_language"] == "English" and resolved.extra_body["tts_speaker"] == "Ryan"
    assert resolved.overlap_policy == "barge_in_on_speech" and "realtime_turn_detection" in resolved.extra_body


def test_session_resume_shape() -> None:
    assert session_resume(ResumeTicket("duplex-1", 3, "tok", 42)) == {
        "type": "session.resume",
        "session_id": "duplex-1",
        "resume_token": "tok",
        "last_received_server_event_seq": 42,
    }


def _real_events() -> list[tuple[Any, Any]]:
    from vllm_omni.engine.duplex import events as e
    from vllm_omni.engine.duplex.config import DuplexCapabilities

    caps = DuplexCapabilities(supports_barge_in=True, supports_session_resume=True, supports_audio_truncate=True).as_dict()
    pcm = b"\x01\x00\x02\x00"
    return [
        (
            e.SessionCreated(session_id="duplex-1", session={"id": "duplex-1", "capabilities": caps}, attachment_generation=1, resume_token="tok"),
            our_events.SessionCreated("duplex-1", our_events.Capabilities(True, True, True, True, 1000), "tok", 1),
        ),
        (e.SessionResumed(session_id="duplex-1", session={}, attachment_generation=2, resume_token="tok2"), our_events.SessionResumed("duplex-1", "tok2", 2)),
        (
            e.SessionResumed(session_id="duplex-1", session={"capabilities": caps}, attachment_generation=3, resume_token="tok3"),
            our_events.SessionResumed("duplex-1", "tok3", 3, our_events.Capabilities(True, True, True, True, 1000)),
        ),
        (e.SessionClosed(session_id="duplex-1", reason="client_close"), our_events.SessionClosed("duplex-1", "client_close")),
        (e.SessionExpired(session_id="duplex-1", reason="idle_ttl_expired"), our_events.SessionExpired("duplex-1", "idle_ttl_expired")),
        (e.SessionReplaced(session_id="duplex-1", attachment_generation=1), our_events.SessionReplaced("duplex-1")),
        (e.SessionHeartbeatAck(session_id="duplex-1"), our_events.HeartbeatAck()),
        (e.SpeechStarted(session_id="s", audio_start_ms=640, item_id="item_a"), our_events.SpeechStarted(640, "item_a")),
        (e.SpeechStopped(session_id="s", audio_end_ms=2200, item_id="item_a"), our_events.SpeechStopped(2200, "item_a")),
        (e.InputCommitted(session_id="s", item_id="item_a"), our_events.InputCommitted("item_a")),
        (e.InputTranscriptionCompleted(session_id="s", item_id="item_a", transcript="my order"), our_events.InputTranscript("item_a", "my order")),
        (e.ResponseCreated(session_id="s", response={"id": "resp-1", "metadata": {"epoch": 3}}, response_id="resp-1"), our_events.ResponseCreated("resp-1", 3)),
        (
            e.ResponseDone(session_id="s", response={"id": "resp-1", "status": "cancelled", "status_details": {"reason": "turn_detected"}}, response_id="resp-1"),
            our_events.ResponseDone("resp-1", "cancelled", "turn_detected", None),
        ),
        (
            e.AudioDelta(session_id="s", response_id="resp-1", item_id="item_resp-1", delta=base64.b64encode(pcm).decode(), sample_rate_hz=24000, metadata={"epoch": 3}),
            our_events.AudioDelta(pcm, 24000, "resp-1", "item_resp-1", 3),
        ),
        (e.TranscriptDelta(session_id="s", response_id="resp-1", item_id="item_resp-1", delta="hello"), our_events.TranscriptDelta("resp-1", "hello")),
        (e.OutputAudioCleared(session_id="s", response_id="resp-1"), our_events.OutputAudioCleared("resp-1")),
        (e.OverlapDecision(session_id="s", epoch=3, policy="barge_in_on_speech", action="barge_in", reason="server_vad_speech_started"), our_events.OverlapDecision("barge_in", "server_vad_speech_started", 3)),
        (e.PlaybackAcknowledged(session_id="s", details={"item_id": "item_resp-1", "played_ms": 800}), our_events.PlaybackAcknowledged("resp-1", 800)),
        (e.ItemTruncated(session_id="s", item_id="item_resp-1", audio_end_ms=800), our_events.ItemTruncated("item_resp-1", 800)),
    ]


def test_every_event_we_act_on_parses_from_vllm_omnis_wire_form() -> None:
    for real, expected in _real_events():
        parsed = parse_server_event(real.to_realtime())
        assert parsed.event == expected, real.type


def test_errors_parse_in_both_shapes() -> None:
    from vllm_omni.engine.duplex.events import error_event

    nested = error_event("resource_exhausted", "duplex_session_capacity_exhausted: limit=1", event_id="evt1").to_realtime()
    parsed = parse_server_event(nested).event
    assert parsed == our_events.EngineErrorEvent("resource_exhausted", "duplex_session_capacity_exhausted: limit=1", True, "evt1")
    flat = {"type": "error", "error": "Duplex API is not available", "code": "unsupported"}
    assert parse_server_event(flat).event == our_events.EngineErrorEvent("unsupported", "Duplex API is not available", False, None)


def test_events_we_do_not_act_on_parse_to_none() -> None:
    from vllm_omni.engine.duplex import events as e

    for real in (e.Listen(session_id="s", epoch=0), e.RateLimitsUpdated(session_id="s"), e.SessionUpdated(session_id="s", session={})):
        assert parse_server_event(real.to_realtime()).event is None


def test_an_overlap_decision_reads_its_chunk_and_speech_from_vllm_omnis_metadata() -> None:
    from vllm_omni.engine.duplex.events import OverlapDecision

    details = {"type": "overlap.decision", "policy": "listen_only", "action": "listen", "reason": "policy_listen_only", "duration_ms": 20, "overlap_speech_ms": 60}
    real = OverlapDecision(session_id="s", epoch=2, policy="listen_only", action="listen", reason="policy_listen_only", details=details)
    parsed = parse_server_event(real.to_realtime()).event
    assert parsed == our_events.OverlapDecision("listen", "policy_listen_only", 2, 20, 60, "listen_only")
    assert our_events.is_chunk_verdict(parsed)  # nothing the bridge acts on
    odd = {**real.to_realtime(), "metadata": {"duration_ms": 20.5, "overlap_speech_ms": "x"}}
    assert parse_server_event(odd).event == our_events.OverlapDecision("listen", "policy_listen_only", 2, 0, 0, "listen_only")


def test_the_callers_transcript_is_projected_as_vllm_omni_sends_it() -> None:
    """The engine server (``WireProjection``) sends a caller's transcript with vllm-omni's keys; it parses back."""
    from vllm_omni.engine.duplex import events as e

    real = e.InputTranscriptionCompleted(session_id="s", item_id="item_a", transcript="my order").to_realtime()
    (ours,) = WireProjection("duplex-1").project(our_events.InputTranscript("item_a", "my order"))
    assert set(ours) == set(real) and {k: ours[k] for k in ("type", "item_id", "content_index", "transcript")} == {
        k: real[k] for k in ("type", "item_id", "content_index", "transcript")
    }
    assert parse_server_event(ours).event == our_events.InputTranscript("item_a", "my order")
