"""Call events to the application, off the media path: a call hands an event over in O(1) (``emit``: a bounded
queue, never awaited), a few senders deliver them with retries, and a queue that is full (an application down or
slower than the calls) drops the newest and counts it — a call is never slowed by its application.

A webhook application gets ``{"type": "call-event", "call": CallContext, "event": CallEvent}`` POSTed, signed as
every request to it is; a 2xx delivers it, a 5xx, 429, timeout or refused connection is tried again
(``RETRY_DELAYS_S``), any other answer drops it. A Python application's ``async def event(self, call, event)``
is awaited the same way (an exception is a failed attempt)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from callbridge.application import CallContext
from callbridge.application.events import CallEvent
from callbridge.application.hooks import ApplicationFailed, ModuleApplication, WebhookApplication
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.logging import get_logger

__all__ = ["MAX_QUEUED", "RETRY_DELAYS_S", "EventDelivery", "event_delivery"]

log = get_logger(__name__)

MAX_QUEUED: Final = 10_000
"""Events waiting at most: at 100 calls, a minute and more of an application that does not answer."""
RETRY_DELAYS_S: Final = (0.5, 2.0, 8.0)
"""Waits before the second, third and fourth attempts; then the event is dropped (logged, counted)."""
SENDERS: Final = 4
_ATTEMPT_TIMEOUT_S: Final = 5.0
_RETRIED: Final = frozenset({"timeout", "unreachable", "status_429", "error"})


class EventDelivery:
    """The process's one queue of events to the application, and its senders (``start`` … ``aclose``)."""

    def __init__(self, application: WebhookApplication | ModuleApplication | None, metrics: BridgeMetrics, *, max_queued: int = MAX_QUEUED) -> None:
        self.application = application
        """None: no application takes events (the observers do: the console's journal)."""
        self.metrics = metrics
        self.queue: asyncio.Queue[tuple[CallContext, CallEvent]] = asyncio.Queue(max_queued)
        self.senders: list[asyncio.Task[None]] = []
        self.observers: list[Callable[[CallContext, CallEvent], None]] = []
        """Called with each event as it is emitted, in this process (``callbridge simulate`` shows them)."""

    def emit(self, call: CallContext, event: CallEvent) -> None:
        """Hand ``event`` over for delivery; never waits. Full: dropped and counted."""
        for observer in self.observers:
            observer(call, event)
        if self.application is None:
            return
        try:
            self.queue.put_nowait((call, event))
        except asyncio.QueueFull:
            self.metrics.app_events.labels(event.type, "dropped_queue_full").inc()
            return
        if not self.senders:
            self.start()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.senders = [loop.create_task(self._send_forever()) for _ in range(SENDERS)]

    async def _send_forever(self) -> None:
        while True:
            call, event = await self.queue.get()
            try:
                outcome = await self._deliver(call, event)
            finally:
                self.queue.task_done()
            self.metrics.app_events.labels(event.type, outcome).inc()

    async def _deliver(self, call: CallContext, event: CallEvent) -> str:
        """Every attempt at one event; how it went: ``delivered``, or why it was dropped."""
        failure = "error"
        for attempt, delay_s in enumerate((0.0, *RETRY_DELAYS_S)):
            if delay_s:
                await asyncio.sleep(delay_s)
            try:
                await asyncio.wait_for(self._attempt(call, event), _ATTEMPT_TIMEOUT_S)
                return "delivered"
            except TimeoutError:
                failure = "timeout"
            except ApplicationFailed as exc:
                failure = exc.reason
            except Exception as exc:  # noqa: BLE001 - the application's own bug: logged, tried again
                failure = "error"
                log.warning("app_event_failed", call_id=event.call_id, event_type=event.type, attempt=attempt + 1, error=repr(exc))
            if failure not in _RETRIED and not failure.startswith("status_5"):
                break
        log.warning("app_event_dropped", call_id=event.call_id, event_type=event.type, failure=failure)
        return f"dropped_{failure}"

    async def _attempt(self, call: CallContext, event: CallEvent) -> None:
        application = self.application
        assert application is not None, "nothing is queued without an application"
        if isinstance(application, WebhookApplication):
            payload: dict[str, object] = {"type": "call-event", "call": call.model_dump(mode="json"), "event": event.model_dump(mode="json")}
            await application.post(payload, timeout_s=_ATTEMPT_TIMEOUT_S)
        else:
            await application.event(call, event)

    async def aclose(self, drain_s: float = 2.0) -> None:
        """At shutdown: what is queued gets ``drain_s`` to go (a call ended just before), then the senders stop."""
        if self.senders:
            try:
                await asyncio.wait_for(self.queue.join(), drain_s)
            except TimeoutError:
                log.warning("app_events_left_undelivered", queued=self.queue.qsize())
        for task in self.senders:
            task.cancel()
        await asyncio.gather(*self.senders, return_exceptions=True)
        self.senders = []


def event_delivery(application: object, metrics: BridgeMetrics, *, observed: bool = False) -> EventDelivery | None:
    """Delivery for an application that takes events (a webhook, or a module with an ``event`` hook), or for
    observers alone where ``observed`` (the console's journal); None: nobody takes them, and none are built."""
    if isinstance(application, WebhookApplication) or (
        isinstance(application, ModuleApplication) and callable(getattr(application.target, "event", None))
    ):
        return EventDelivery(application, metrics)
    return EventDelivery(None, metrics) if observed else None
