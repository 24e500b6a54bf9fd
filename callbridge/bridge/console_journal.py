"""The console's journal of calls, written as the bridge emits its call events (an observer of ``EventDelivery``): a
call hands an event over in O(1) (a bounded queue, never awaited), one writer puts what is queued into the registry
(``CallRegistry.journal``), one round trip per call per batch, and a queue that is full (a registry slower than the
calls) drops the newest and counts it. A call is never slowed by its console, nor ended by a registry that fails it:
that batch is lost (logged, counted) and the next is tried.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Final

from callbridge.application import CallContext
from callbridge.application.events import CallEvent
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.registry import CallRegistry, RegistryUnavailable
from callbridge.config import ConsoleSettings
from callbridge.logging import get_logger

__all__ = ["ENDING_EVENTS", "MAX_QUEUED", "CallJournal"]

log = get_logger(__name__)

MAX_QUEUED: Final = 10_000
"""Events waiting for the registry at most (as many as the application's queue holds)."""
ENDING_EVENTS: Final = frozenset({"call.ended", "call.failed"})
"""A call's last event: it moves to the finished calls."""
_HEADERS_REMEMBERED: Final = 4096
"""Calls whose context this process wrote, remembered so as not to write it with every event (a context that says more
than the one before, as a placed call's answer adds its ring time, is written again)."""


class CallJournal:
    """The process's writer of call events into the registry for ``/console`` (``observe`` … ``aclose``)."""

    def __init__(self, registry: CallRegistry, settings: ConsoleSettings, metrics: BridgeMetrics, process_id: str | None = None) -> None:
        """``process_id``: this bridge process's, written as each journal's writer (``console_fleet``'s)."""
        self._registry, self._settings, self._metrics, self._process_id = registry, settings, metrics, process_id
        self._queue: asyncio.Queue[tuple[CallContext, CallEvent]] = asyncio.Queue(MAX_QUEUED)
        self._writer: asyncio.Task[None] | None = None
        self._headers: OrderedDict[str, CallContext] = OrderedDict()

    def observe(self, call: CallContext, event: CallEvent) -> None:
        """An event as the bridge emits it (``EventDelivery.observers``); never waits. Full: dropped and counted."""
        try:
            self._queue.put_nowait((call, event))
        except asyncio.QueueFull:
            self._metrics.console_events.labels("dropped_queue_full").inc()
            return
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_forever(), name="console-journal")

    async def _write_forever(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty() and len(batch) < 500:
                batch.append(self._queue.get_nowait())
            try:
                await self._write(batch)
            except Exception as exc:  # noqa: BLE001 - a bug of ours costs this batch, never the writer (nor a call)
                self._metrics.console_events.labels("dropped_error").inc(len(batch))
                log.error("console_journal_failed", error=repr(exc), events=len(batch))
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write(self, batch: list[tuple[CallContext, CallEvent]]) -> None:
        """One registry write per call in ``batch``, in the order its events came."""
        by_call: dict[str, list[tuple[CallContext, CallEvent]]] = {}
        for call, event in batch:
            by_call.setdefault(call.call_id, []).append((call, event))
        keep_ms = int(self._settings.kept_hours * 3_600_000)
        for call_id, events in by_call.items():
            context = events[-1][0]
            new = self._headers.get(call_id) != context
            ended = next((e.at for _, e in events if e.type in ENDING_EVENTS), None)
            try:
                await self._registry.journal(
                    call_id, [event.model_dump_json() for _, event in events], keep_ms,
                    header=context.model_dump_json() if new else None, opened_at=events[0][1].at if call_id not in self._headers else None,
                    ended_at=ended, calls_kept=self._settings.calls_kept, writer=self._process_id,
                )  # fmt: skip
            except RegistryUnavailable as exc:
                self._metrics.console_events.labels("dropped_registry_unavailable").inc(len(events))
                log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=call_id)
                continue
            self._metrics.console_events.labels("written").inc(len(events))
            self._remember(call_id, context, ended is not None)

    def _remember(self, call_id: str, context: CallContext, ended: bool) -> None:
        if ended:
            self._headers.pop(call_id, None)
            return
        self._headers[call_id] = context
        self._headers.move_to_end(call_id)
        while len(self._headers) > _HEADERS_REMEMBERED:
            self._headers.popitem(last=False)

    async def aclose(self, drain_s: float = 2.0) -> None:
        """At shutdown: what is queued gets ``drain_s`` to be written (a call ended just before), then the writer stops."""
        if self._writer is None:
            return
        try:
            await asyncio.wait_for(self._queue.join(), drain_s)
        except TimeoutError:
            log.warning("console_events_left_unwritten", queued=self._queue.qsize())
        self._writer.cancel()
        await asyncio.gather(self._writer, return_exceptions=True)
        self._writer = None
