"""The end-of-call report as streams build it (``CallReportBuilder``): handed on between streams as JSON, the
lines of both sides in order, the engine sessions and resumes counted."""

from __future__ import annotations

import pytest

from callbridge.application import CallContext
from callbridge.bridge.call_outputs import Observed
from callbridge.bridge.call_report import CallReportBuilder, ended_by
from callbridge.bridge.end_reason import EndCause

pytestmark = pytest.mark.core

CALL = CallContext(call_id="CA1", carrier="twilio")


def test_both_sides_lines_and_the_engine_sessions_survive_the_hand_on_between_streams() -> None:
    first = CallReportBuilder(started_at=100.0, streams=1)
    first.bound(resumed=False, endpoint="ws://gpu-1:8091/v1/duplex")
    first.transcribed("resp-1", "Hello, ")
    first.transcribed("resp-1", "how can I help?")
    first.caller_said("item_1", "where is my order")
    second = CallReportBuilder.from_json(first.to_json())  # the next stream takes it from the registry
    second.streams += 1
    second.bound(resumed=True, endpoint="ws://gpu-2:8091/v1/duplex")
    second.transcribed("resp-2", "It ships today.")
    second.observe(Observed("barge-in", 700, of_ms=1200, response_id="resp-2"))
    report = second.report(CALL, ended_at=110.0, end_reason=EndCause.of("caller_hung_up"), engine_session_id="duplex-1")
    assert [(line.role, line.text) for line in report.transcript] == [
        ("agent", "Hello, how can I help?"), ("caller", "where is my order"), ("agent", "It ships today."),
    ]  # fmt: skip
    assert report.transcript[1].item_id == "item_1" and report.transcript[2].heard_ms == 700
    assert (report.streams, report.engine_sessions, report.engine_resumes) == (2, 1, 1)
    assert report.engine_endpoint == "ws://gpu-2:8091/v1/duplex" and report.duration_ms == 10_000


def test_a_report_handed_on_before_callers_lines_existed_reads_as_the_agents() -> None:
    old = '{"started_at": 1.0, "transcript": [{"response_id": "r", "text": "hi", "heard_ms": null}]}'
    report = CallReportBuilder.from_json(old).report(CALL, ended_at=2.0, end_reason=EndCause.of("caller_hung_up"), engine_session_id=None)
    assert report.transcript[0].role == "agent" and (report.engine_sessions, report.engine_resumes) == (0, 0)


@pytest.mark.parametrize(
    ("end_reason", "who"),
    [
        ("caller_hung_up", "caller"),
        ("stream_stopped", "caller"),
        ("caller_silent", "agent"),
        ("agent_hung_up", "agent"),
        ("engine_failed", "engine"),
        ("protocol_error:bad_json", "carrier"),
        ("no_reconnect", "carrier"),  # its stream closed and did not come back (AudioSocket's hang-up)
        ("max_duration", "bridge"),
    ],
)
def test_who_ended_the_call_is_read_from_how_its_last_stream_ended(end_reason: str, who: str) -> None:
    assert ended_by(EndCause.of(end_reason)) == who


def test_bridge_mode_pauses_and_their_resumes_are_counted_over_the_call() -> None:
    first = CallReportBuilder(started_at=100.0, streams=1)
    first.observe(Observed("barge-in-pause", 900, response_id="resp-1"))
    first.observe(Observed("barge-in-resume"))
    second = CallReportBuilder.from_json(first.to_json())  # a reconnect: the next stream goes on counting
    second.observe(Observed("barge-in-pause", 300, response_id="resp-2"))
    second.observe(Observed("barge-in", 300, of_ms=2000, response_id="resp-2"))  # confirmed
    report = second.report(CALL, ended_at=110.0, end_reason=EndCause.of("caller_hung_up"), engine_session_id="duplex-1")
    assert (report.barge_in_pauses, report.barge_in_resumes, report.barge_ins) == (2, 1, 1)
