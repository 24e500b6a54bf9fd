"""Call events to the application (``bridge/app_events.py``), on the shipped bounds: never waited for by a call,
retried where the application may answer later, dropped and counted where it will not or the queue is full."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from callbridge.application import CallContext
from callbridge.application.events import CallEvent
from callbridge.application.hooks import ApplicationFailed, ModuleApplication
from callbridge.bridge.app_events import MAX_QUEUED, RETRY_DELAYS_S, SENDERS, EventDelivery, event_delivery
from callbridge.bridge.metrics import BridgeMetrics

CALL = CallContext(call_id="CA1", carrier="twilio")


def _event(seq: int = 1) -> CallEvent:
    return CallEvent(type="turn", call_id="CA1", at=time.time(), seq=seq, data={"latency_ms": 480})


class _App:
    def __init__(self, failures: list[Exception] | None = None, block: asyncio.Event | None = None) -> None:
        self.failures = failures or []
        self.block = block
        self.got: list[CallEvent] = []

    async def assistant(self, call: CallContext) -> None: ...

    async def event(self, call: CallContext, event: CallEvent) -> None:
        if self.block is not None:
            await self.block.wait()
        if self.failures:
            raise self.failures.pop(0)
        self.got.append(event)


def _delivery(app: _App) -> tuple[EventDelivery, CollectorRegistry]:
    registry = CollectorRegistry()
    delivery = event_delivery(ModuleApplication(app), BridgeMetrics(registry))
    assert delivery is not None
    return delivery, registry


def _count(registry: CollectorRegistry, outcome: str) -> float:
    return registry.get_sample_value("callbridge_app_events_total", {"type": "turn", "outcome": outcome}) or 0.0


async def test_an_application_that_fails_twice_gets_the_event_on_the_third_try() -> None:
    app = _App([ApplicationFailed("status_503"), ApplicationFailed("timeout")])
    delivery, registry = _delivery(app)
    started = time.monotonic()
    delivery.emit(CALL, _event())
    await asyncio.wait_for(delivery.queue.join(), 10)
    assert [event.seq for event in app.got] == [1]
    assert time.monotonic() - started >= RETRY_DELAYS_S[0] + RETRY_DELAYS_S[1]
    assert _count(registry, "delivered") == 1
    await delivery.aclose()


async def test_an_answer_that_will_not_change_is_not_tried_again() -> None:
    app = _App([ApplicationFailed("status_400")])
    delivery, registry = _delivery(app)
    delivery.emit(CALL, _event())
    await asyncio.wait_for(delivery.queue.join(), 5)
    assert app.got == [] and _count(registry, "dropped_status_400") == 1
    await delivery.aclose()


async def test_a_full_queue_drops_the_newest_without_waiting() -> None:
    """An application that never answers: the senders hold one event each, the queue its bound; the next is
    dropped at once, counted. Handing over every one of them takes no await at all."""
    block = asyncio.Event()
    delivery, registry = _delivery(_App(block=block))
    started = time.perf_counter()
    for seq in range(MAX_QUEUED + SENDERS + 1):
        delivery.emit(CALL, _event(seq))
        if seq == 0:
            await asyncio.sleep(0)  # the senders start and take their first events
    per_event_us = (time.perf_counter() - started) / (MAX_QUEUED + SENDERS + 1) * 1e6
    await asyncio.sleep(0)
    assert _count(registry, "dropped_queue_full") >= 1
    print(f"emit: {per_event_us:.2f} µs an event")
    block.set()
    await delivery.aclose(drain_s=30)


def test_a_module_without_an_event_hook_gets_no_delivery() -> None:
    class NoEvents:
        async def assistant(self, call: CallContext) -> None: ...

    assert event_delivery(ModuleApplication(NoEvents()), BridgeMetrics(CollectorRegistry())) is None


@pytest.mark.parametrize("failure", [RuntimeError("bug"), ApplicationFailed("unreachable")])
async def test_every_retry_failing_drops_the_event_once_logged(failure: Exception) -> None:
    app = _App([failure] * (len(RETRY_DELAYS_S) + 1))
    delivery, registry = _delivery(app)
    delivery.emit(CALL, _event())
    await asyncio.wait_for(delivery.queue.join(), sum(RETRY_DELAYS_S) + 5)
    outcome = "dropped_error" if isinstance(failure, RuntimeError) else "dropped_unreachable"
    assert app.got == [] and _count(registry, outcome) == 1
    await delivery.aclose()
