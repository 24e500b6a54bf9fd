"""The ordered event stream behind ``DuplexSession.events()``: one consumer at a time, ended by a terminal
event, interrupted (not drained) by a detach, drained once the session has ended."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterable

from callbridge.engine.events import TERMINAL_EVENTS, EngineEvent

__all__ = ["EventStream"]


class EventStream:
    """Events queued by an engine session, read by the bridge.

    ``pause()`` (detach) ends the current iteration and keeps what is queued for the next one;
    ``finish()`` (the session ended) lets the consumer drain the queue, then ends.
    """

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._queue: deque[EngineEvent] = deque()
        self._wakeup = asyncio.Event()
        self._consuming = False
        self.paused = False
        self.finished = False

    def put(self, event: EngineEvent) -> None:
        self._queue.append(event)
        self._wakeup.set()

    def put_first(self, events: Iterable[EngineEvent]) -> None:
        """Queue ``events`` ahead of everything waiting (a resumed marker before what was kept)."""
        self._queue.extendleft(reversed(list(events)))
        self._wakeup.set()

    def pause(self) -> None:
        self.paused = True
        self._wakeup.set()

    def unpause(self) -> None:
        self.paused = False
        self._wakeup.set()

    def finish(self) -> None:
        self.finished = True
        self._wakeup.set()

    async def iterate(self) -> AsyncIterator[EngineEvent]:
        """The events, in order. Raises ``RuntimeError`` if another iteration is running."""
        if self._consuming:
            raise RuntimeError(f"session {self._owner} already has an events() consumer")
        self._consuming = True
        try:
            while True:
                while self._queue and (not self.paused or self.finished):
                    event = self._queue.popleft()
                    yield event
                    if isinstance(event, TERMINAL_EVENTS):
                        return
                if self.paused or self.finished:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
        finally:
            self._consuming = False
