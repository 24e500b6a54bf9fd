"""The console's pure parts: a call's card and timeline from its journal, the finished calls' search, the
credentials check, and the in-memory journal (its indexes, its caps, its expiry)."""

from __future__ import annotations

import base64

import orjson
import pytest
from pydantic import SecretStr

from callbridge.application import CallContext
from callbridge.application.events import CallEvent
from callbridge.bridge.console_http import _authorized, _credentials, console_on
from callbridge.bridge.console_view import call_card, call_view, matches, timeline
from callbridge.bridge.registry_journal import JOURNAL_ENTRIES, JournalPage, MemoryJournal
from callbridge.config import ConsoleSettings

pytestmark = pytest.mark.core

CONTEXT = CallContext(call_id="CA1", carrier="twilio", caller_number="+15551230000", called_number="+15559870000")


def _event(kind: str, at: float, **data: object) -> str:
    return CallEvent(type=kind, call_id="CA1", at=at, data=data).model_dump_json()  # type: ignore[arg-type]


def _page(*entries: str) -> JournalPage:
    return JournalPage(CONTEXT.model_dump_json(), list(entries))


REPORT = {
    "started_at": 99.5, "end_reason": "caller_hung_up", "ended_by": "caller", "duration_ms": 9000, "streams": 2,
    "engine_resumes": 1, "first_agent_audio_ms": 310, "recording": "/rec/CA1.wav", "engine_endpoint": "ws://gpu-3:8091/v1/realtime",
}  # fmt: skip
CALL = (
    _event("call.answered", 100.0, engine=None),
    _event("turn", 102.0, latency_ms=640),
    _event("barge-in", 104.0, heard_ms=1200, generated_ms=4000, decided_by="bridge"),
    _event("turn", 105.0, latency_ms=700),
    _event("turn", 106.5, latency_ms=580),
    _event("dtmf", 107.0, digit="5"),
    _event("tool", 107.5, name="lookup", ok=True, elapsed_ms=120),
)


def test_a_live_call_s_card_has_its_numbers_state_turn_latency_and_heard_ratio() -> None:
    card = call_card("CA1", _page(*CALL))
    assert card is not None
    assert (card["carrier"], card["direction"], card["caller"], card["called"]) == ("twilio", "inbound", "+15551230000", "+15559870000")
    assert (card["state"], card["started_at"], card["answered_at"], card["ended_at"]) == ("up", 100.0, 100.0, None)
    assert (card["turns"], card["turn_ms"], card["turn_p50_ms"]) == (3, 580, 640)
    assert (card["barge_ins"], card["heard_ratio"], card["dtmf"], card["tools"]) == (1, 0.3, 1, 1)
    assert card["engine"] is None and card["recording"] is False


def test_a_finished_call_s_card_takes_its_end_from_the_report() -> None:
    card = call_card("CA1", _page(*CALL, _event("call.ended", 109.0, report=REPORT)))
    assert card is not None
    assert (card["state"], card["ended_at"], card["end_reason"], card["ended_by"]) == ("ended", 109.0, "caller_hung_up", "caller")
    assert card["started_at"] == 99.5 and card["recording"] is True and card["engine"] == REPORT["engine_endpoint"]


def test_a_placed_call_that_nobody_answered_is_failed_with_its_reason() -> None:
    page = _page(_event("call.dialing", 10.0, dial_id="d1"), _event("call.ringing", 11.0), _event("call.failed", 41.0, reason="no_answer"))
    card = call_card("CA1", page)
    assert card is not None and (card["state"], card["end_reason"], card["ended_at"]) == ("failed", "no_answer", 41.0)


def test_a_journal_without_its_context_or_with_garbage_entries_is_read_without_failing() -> None:
    assert call_card("CA1", JournalPage(None, [_event("turn", 1.0, latency_ms=5)])) is None
    card = call_card("CA1", _page("not json", '"a string"', '{"no": "type"}', *CALL[:2]))
    assert card is not None and card["turns"] == 1


def test_the_timeline_says_each_event_in_words_from_the_call_s_first() -> None:
    lines = timeline(_page(*CALL, _event("call.ended", 109.0, report=REPORT)))
    assert [(line["t_ms"], line["type"]) for line in lines][:3] == [(0, "call.answered"), (2000, "turn"), (4000, "barge-in")]
    texts = [line["text"] for line in lines]
    assert texts[0] == "answered: media flowing, engine embedded"
    assert texts[1] == "turn: the agent answered 640 ms after the caller stopped"
    assert texts[2] == "barge-in (bridge): the caller heard 1.2 s of 4.0 s"
    assert texts[5:7] == ["key 5", "tool lookup: ok in 120 ms"]
    assert texts[-1] == "ended: caller_hung_up (by the caller) after 9.0 s, 2 stream(s), 1 resume(s); first agent audio 310 ms"


def test_the_search_matches_a_number_a_carrier_and_an_end_reason() -> None:
    card = call_card("CA1", _page(*CALL, _event("call.ended", 109.0, report=REPORT)))
    assert card is not None
    assert matches(card, number=None, carrier=None, reason=None)
    assert matches(card, number="555987", carrier="twilio", reason="hung_up")
    assert not matches(card, number="444", carrier=None, reason=None)
    assert not matches(card, number=None, carrier="telnyx", reason=None)
    assert not matches(card, number=None, carrier=None, reason="engine")


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_the_console_is_on_only_with_a_credential_and_takes_only_those() -> None:
    assert not console_on(ConsoleSettings())
    token, password = "t" * 24, "p" * 16
    bearers, basics = _credentials(ConsoleSettings(token=SecretStr(token), password=SecretStr(password)))
    for shown in (f"Bearer {token}", _basic("anyone", token), _basic("operator", password)):
        assert _authorized(shown, bearers, basics), shown
    for shown in (None, "", "Bearer", f"Bearer {password}", _basic("someone", password), _basic("operator", token[:-1]),
                  "Basic !!!", "Basic " + base64.b64encode(b"no colon").decode(), f"Digest {token}", "Bearer " + "x" * 2000):  # fmt: skip
        assert not _authorized(shown, bearers, basics), shown


def test_the_memory_journal_lists_calls_live_then_finished_newest_first_and_keeps_only_the_newest() -> None:
    now = [0]
    journal = MemoryJournal(lambda: now[0])
    for i in range(5):
        journal.write(f"c{i}", [f'{{"n": {i}}}'], 60_000, header=f'{{"call_id": "c{i}"}}', opened_at=100.0 + i, ended_at=None, calls_kept=3)
    assert journal.calls(True, 10) == ["c4", "c3", "c2", "c1", "c0"] and journal.calls(False, 10) == []
    for i in range(5):
        journal.write(f"c{i}", ["{}"], 60_000, header=None, opened_at=None, ended_at=200.0 + i, calls_kept=3)
    assert journal.calls(True, 10) == [] and journal.calls(False, 10) == ["c4", "c3", "c2"]
    assert journal.read("c0") == JournalPage(None, [])
    assert journal.read("c4") == JournalPage('{"call_id": "c4"}', ['{"n": 4}', "{}"])
    now[0] += 60_000
    assert journal.calls(False, 10) == [] and journal.read("c4") == JournalPage(None, [])


def test_a_call_s_journal_keeps_its_newest_entries() -> None:
    journal = MemoryJournal(lambda: 0)
    entries = [orjson.dumps({"n": i}).decode() for i in range(JOURNAL_ENTRIES + 10)]
    journal.write("c", entries, 1000, header="{}", opened_at=1.0, ended_at=None, calls_kept=10)
    assert journal.read("c").entries == entries[10:]


def test_a_bridge_s_announcement_lapses_unless_it_comes_again() -> None:
    now = [0]
    journal = MemoryJournal(lambda: now[0])
    journal.announce("b", '{"p": "b"}', 15_000)
    journal.announce("a", '{"p": "a"}', 15_000)
    now[0] += 10_000
    journal.announce("a", '{"p": "a2"}', 15_000)
    assert journal.announced() == ['{"p": "a2"}', '{"p": "b"}']
    now[0] += 5_000
    assert journal.announced() == ['{"p": "a2"}']


def test_a_later_stream_of_the_call_is_a_line_of_its_timeline_and_keeps_the_call_up() -> None:
    page = _page(
        _event("call.answered", 1.0, engine="ws://gpu-1:8091/v1/realtime"),
        _event("call.resumed", 3.0, stream=2, session="resumed", engine="ws://gpu-1:8091/v1/realtime"),
        _event("call.resumed", 5.0, stream=3, session="new", engine="ws://gpu-2:8091/v1/realtime"),
    )
    assert [line["text"] for line in timeline(page)[1:]] == [
        "stream 2: its session resumed, engine ws://gpu-1:8091/v1/realtime",
        "stream 3: a new engine session (the last one was lost), engine ws://gpu-2:8091/v1/realtime",
    ]
    card = call_card("CA1", page)
    assert card is not None and (card["state"], card["engine"], card["answered_at"]) == ("up", "ws://gpu-2:8091/v1/realtime", 1.0)


def test_the_call_s_view_is_its_card_its_timeline_and_its_report_read_at_once() -> None:
    page = _page(*CALL, _event("call.ended", 109.0, report=REPORT))
    view = call_view("CA1", page)
    assert view is not None
    card, lines, report = view
    assert (card, lines, report) == (call_card("CA1", page), timeline(page), REPORT)
    live = call_view("CA1", _page(*CALL))
    assert live is not None and live[2] is None
    assert call_view("CA1", JournalPage(None, [])) is None
