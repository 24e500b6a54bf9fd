"""What the operator sees of one stream (``bridge/stream_telemetry.py``) on its own: totals counted once as the
stream ends, end reasons by their kind, the first audio and a barge-in timed once and only from what caused them."""

from __future__ import annotations

import pytest
import structlog
from prometheus_client import CollectorRegistry

from callbridge.bridge.call_outputs import StreamReport
from callbridge.bridge.end_reason import EndCause
from callbridge.bridge.lifecycle import StreamFacts
from callbridge.bridge.log_budget import LogBudget
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.stream_telemetry import StreamTelemetry
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.engine.events import AudioDelta

pytestmark = pytest.mark.core


def telemetry(budget: LogBudget | None = None) -> tuple[StreamTelemetry, CollectorRegistry, list[tuple[str, str]]]:
    registry, budget = CollectorRegistry(), budget or LogBudget()
    unknown: list[tuple[str, str]] = []
    seen = StreamTelemetry(
        BridgeMetrics(registry), TwilioCodec(), structlog.get_logger("test"), lambda provider, event, log: unknown.append((provider, event)),
        budget,
    )
    return seen, registry, unknown


def report(end_reason: str, *, frames_sent: int = 50, barge_ins: int = 1) -> StreamReport:
    return StreamReport(
        facts=StreamFacts(call_over=True, end_reason=EndCause.of(end_reason)), limit_reached=None, engine_failure=None, failure=None,
        stream_input_ms=2000, output_ms=frames_sent * 20, frames_sent=frames_sent, frames_flushed=3, barge_ins=barge_ins,
        late_deltas_dropped=0, heard_corrections=0, playout_underruns=0,
    )  # fmt: skip


def test_a_streams_totals_are_counted_once_as_it_ends_and_its_reason_by_its_kind() -> None:
    seen, registry, _ = telemetry()
    seen.ended(report("protocol_error:flood"))
    provider = seen.provider
    assert registry.get_sample_value("callbridge_calls_total", {"provider": provider, "end": "protocol_error"}) == 1
    assert registry.get_sample_value("callbridge_audio_seconds_total", {"provider": provider, "direction": "out"}) == 1.0
    assert registry.get_sample_value("callbridge_barge_ins_total", {"provider": provider}) == 1


def test_the_first_audio_is_timed_once_from_its_read_and_a_barge_in_only_from_an_engine_event() -> None:
    seen, registry, _ = telemetry()
    seen.audio_to_engine()  # nothing read yet: nothing to time
    assert seen.first_audio_ms is None
    seen.caller_audio_began()
    seen.audio_to_engine()
    first = seen.first_audio_ms
    seen.audio_to_engine()
    assert first is not None and seen.first_audio_ms == first
    assert registry.get_sample_value("callbridge_first_audio_to_engine_seconds_count") == 1
    seen.barge_in_flushed()  # no engine event taken yet
    assert registry.get_sample_value("callbridge_barge_in_clear_seconds_count") == 0
    seen.engine_event_taken(AudioDelta(b"", 24000, "r", "i", 0))
    seen.barge_in_flushed()
    assert registry.get_sample_value("callbridge_barge_in_clear_seconds_count") == 1


def test_a_refused_stream_past_the_budget_is_counted_and_writes_no_line(capsys: pytest.CaptureFixture[str]) -> None:
    budget = LogBudget()
    for attempt in range(3):  # one sender, one call, at once: the first refusal is logged, the others counted
        seen, registry, _ = telemetry(budget)
        seen.refused(EndCause.of("bad_token"), "CA1", "198.51.100.7")
        seen.ended(report("bad_token", frames_sent=0, barge_ins=0))
    out = capsys.readouterr().out
    assert out.count("stream_refused") == 1 and out.count("call_ended") == 1, out
    assert registry.get_sample_value("callbridge_streams_refused_total", {"provider": seen.provider, "reason": "bad_token"}) == 1


class TestLogBudget:
    def test_a_key_is_logged_first_then_once_an_interval_with_what_was_left_out(self) -> None:
        budget = LogBudget(every_ms=10_000)
        assert budget.allow("twilio:CA1", 0) == 0
        assert [budget.allow("twilio:CA1", t) for t in range(1, 3000)] == [None] * 2999  # 300 a second, 10 s
        assert budget.allow("twilio:CA1", 10_000) == 2999
        assert budget.allow("twilio:CA2", 10_001) == 0  # another call: its own first line

    def test_varying_the_key_buys_no_more_than_the_rate_across_keys(self) -> None:
        budget = LogBudget(per_s=20)
        logged = sum(budget.allow(f"twilio:CA{i}", i) is not None for i in range(1000))  # 1000 calls in 1 s
        assert logged <= 20 + 20

    def test_the_keys_remembered_are_bounded(self) -> None:
        budget = LogBudget(per_s=1_000_000, max_keys=100)
        for i in range(1000):
            budget.allow(f"k{i}", i)
        assert len(budget._keys) == 100
