"""How a stream ended (``bridge/end_reason.py``): a kind and a detail, written as end reasons always were, read back
from outside the one way."""

from __future__ import annotations

import pickle

import orjson
import pytest

from callbridge.bridge.call import engine_failure_kind
from callbridge.bridge.call_report import ended_by
from callbridge.bridge.end_reason import EndCause, EndReason

pytestmark = pytest.mark.core


def test_a_cause_is_written_kind_or_kind_and_detail_and_is_that_text() -> None:
    assert EndCause(EndReason.CALLER_HUNG_UP) == "caller_hung_up" and EndCause(EndReason.CALLER_HUNG_UP) == EndReason.CALLER_HUNG_UP.value
    cause = EndCause(EndReason.PROTOCOL_ERROR, "bad_json")
    assert cause == "protocol_error:bad_json" and (cause.kind, cause.detail) == (EndReason.PROTOCOL_ERROR, "bad_json")
    assert orjson.dumps({"reason": cause}) == b'{"reason":"protocol_error:bad_json"}'
    assert pickle.loads(pickle.dumps(cause)).kind is EndReason.PROTOCOL_ERROR


@pytest.mark.parametrize("kind", list(EndReason))
def test_every_kind_reads_back_as_it_was_written(kind: EndReason) -> None:
    for detail in ("", "x", "resync_required:stale"):
        written = str(EndCause(kind, detail))
        read = EndCause.of(written)
        assert (read, read.kind) == (written, kind) and (kind is EndReason.UNKNOWN or read.detail == detail)


def test_text_that_names_no_kind_is_kept_as_it_came() -> None:
    read = EndCause.of("normal_clearing")
    assert read == "normal_clearing" and read.kind is EndReason.UNKNOWN and read.detail == "normal_clearing"


def test_what_decides_reads_the_kind_and_the_detail() -> None:
    assert ended_by(EndCause(EndReason.ENGINE_SESSION_CLOSED, "shutdown")) == "engine"
    assert ended_by(EndCause(EndReason.IDLE_TIMEOUT)) == "bridge"
    assert engine_failure_kind(EndCause(EndReason.ENGINE_SESSION_CLOSED, "connection_failed")) == "connection_failed"
    assert engine_failure_kind(EndCause(EndReason.ENGINE_SESSION_CLOSED, "resync_required:gap")) == "resync_required"
    assert engine_failure_kind(EndCause(EndReason.ENGINE_SESSION_EXPIRED, "disconnect_grace_expired")) == "expired"
    assert engine_failure_kind(EndCause(EndReason.ENGINE_SESSION_CLOSED, "agent_done")) == "other"
