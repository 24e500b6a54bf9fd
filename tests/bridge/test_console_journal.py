"""The console's journal writer (``bridge/console_journal.py``) on the in-memory registry: a call's events in order
under its context, written once; the call moved to the finished ones by its last event; a registry that fails a
write costs that batch alone, counted; a queue that is full drops the newest, counted — and the call that emitted
them is never made to wait."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from prometheus_client import CollectorRegistry

from callbridge.application import CallContext
from callbridge.application.events import CallEvent, EventType
from callbridge.bridge.console_http import live_cards
from callbridge.bridge.console_journal import CallJournal
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.registry import MemoryCallRegistry, RegistryUnavailable
from callbridge.config import ConsoleSettings

pytestmark = pytest.mark.core

CONTEXT = CallContext(call_id="CA1", carrier="sip", caller_number="+15551230000")


class FlakyRegistry(MemoryCallRegistry):
    """Fails the first ``failures`` journal writes with ``error``, then writes."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        super().__init__()
        self.failures, self.error = failures, error or RegistryUnavailable("journal", "down")
        self.writes: list[tuple[str, int, str | None, float | None, float | None]] = []

    async def journal(
        self, call_id: str, entries: list[str], keep_ms: int, header: str | None = None, opened_at: float | None = None,
        ended_at: float | None = None, calls_kept: int = 2000, writer: str | None = None,
    ) -> None:  # fmt: skip
        if self.failures:
            self.failures -= 1
            raise self.error
        self.writes.append((call_id, len(entries), header, opened_at, ended_at))
        await super().journal(call_id, entries, keep_ms, header, opened_at, ended_at, calls_kept, writer)


def _event(kind: EventType, at: float) -> CallEvent:
    return CallEvent(type=kind, call_id="CA1", at=at)


async def _answered_then_a_turn(journal: CallJournal) -> None:
    """Two events of one call, each written on its own (the writer runs between them), then the writer closed."""
    journal.observe(CONTEXT, _event("call.answered", 10.0))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    journal.observe(CONTEXT, _event("turn", 11.0))
    await journal.aclose()


def _metric(registry: CollectorRegistry, outcome: str) -> float:
    return registry.get_sample_value("callbridge_console_events_total", {"outcome": outcome}) or 0.0


async def test_a_call_s_events_are_written_in_order_under_its_context_once() -> None:
    registry, metrics_registry = FlakyRegistry(0), CollectorRegistry()
    journal = CallJournal(registry, ConsoleSettings(), BridgeMetrics(metrics_registry), process_id="bridge-1")
    journal.observe(CONTEXT, _event("call.answered", 10.0))
    journal.observe(CONTEXT, _event("turn", 11.0))
    await asyncio.sleep(0)  # the writer takes what is queued at once, as one batch
    journal.observe(CONTEXT, _event("barge-in", 12.0))
    journal.observe(CONTEXT, _event("call.ended", 13.0))
    await journal.aclose()
    assert registry.writes == [("CA1", 2, CONTEXT.model_dump_json(), 10.0, None), ("CA1", 2, None, None, 13.0)]
    page = await registry.journal_of("CA1")
    assert [orjson.loads(entry)["type"] for entry in page.entries] == ["call.answered", "turn", "barge-in", "call.ended"]
    assert page.writer == "bridge-1"
    assert await registry.journaled(False, 10) == ["CA1"] and _metric(metrics_registry, "written") == 4


async def test_a_failed_write_costs_its_batch_alone_and_a_full_queue_drops_the_newest() -> None:
    registry, metrics_registry = FlakyRegistry(1), CollectorRegistry()
    journal = CallJournal(registry, ConsoleSettings(), BridgeMetrics(metrics_registry))
    await _answered_then_a_turn(journal)
    assert _metric(metrics_registry, "dropped_registry_unavailable") == 1 and _metric(metrics_registry, "written") == 1
    assert registry.writes == [("CA1", 1, CONTEXT.model_dump_json(), 11.0, None)]  # its context on the next write
    journal._queue = asyncio.Queue(2)
    for at in (1.0, 2.0, 3.0):
        journal.observe(CONTEXT, _event("turn", at))  # nothing awaited: the third is past the queue
    assert _metric(metrics_registry, "dropped_queue_full") == 1
    await journal.aclose()


async def test_a_live_call_whose_bridge_no_longer_announces_itself_is_lost() -> None:
    """A bridge died with its calls and nothing took them on: their journals say up, but the process that wrote them
    last is gone from the fleet's announcements."""
    registry = MemoryCallRegistry()
    for call_id, writer in (("CA1", "alive"), ("CA2", "dead")):
        context = CONTEXT.model_copy(update={"call_id": call_id})
        await registry.journal(call_id, [_event("call.answered", 1.0).model_dump_json()], 60_000, header=context.model_dump_json(),
                               opened_at=1.0, writer=writer)  # fmt: skip
    assert [card["state"] for card in await live_cards(registry)] == ["up", "up"]  # nobody announces: nothing known
    await registry.announce("alive", orjson.dumps({"process_id": "alive"}).decode(), 15_000)
    cards = {card["call_id"]: card for card in await live_cards(registry)}
    assert (cards["CA1"]["state"], cards["CA1"]["bridge"]) == ("up", "alive")
    assert (cards["CA2"]["state"], cards["CA2"]["bridge"]) == ("lost", "dead")


async def test_a_write_that_fails_for_any_other_reason_costs_its_batch_and_the_writer_goes_on() -> None:
    registry, metrics_registry = FlakyRegistry(1, ValueError("a bug")), CollectorRegistry()
    journal = CallJournal(registry, ConsoleSettings(), BridgeMetrics(metrics_registry))
    await _answered_then_a_turn(journal)
    assert _metric(metrics_registry, "dropped_error") == 1 and _metric(metrics_registry, "written") == 1
