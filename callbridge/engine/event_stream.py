"""The ordered event stream behind ``DuplexSession.events()``: one consumer at a time, ended by a terminal
event, interrupted (not drained) by a detach, drained once the session has ended.

``take_ready`` lets the code that just submitted a command take the events it caused at once (the embedded
engine answers synchronously): they are handled in the same turn of the loop, and the consumer of
``events()`` is not woken for them. That is why ``put`` wakes the consumer with ``call_soon`` rather than
at once: by then the events may have been taken.
"""

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
        self._wake_pending = False
        self._ended = False
        """A terminal event was taken by ``take_ready``: iteration ends."""
        self.paused = False
        self.finished = False

    @property
    def queued(self) -> int:
        """Events put and not yet taken by a consumer."""
        return len(self._queue)

    def put(self, event: EngineEvent) -> None:
        self._queue.append(event)
        if not self._wake_pending:
            self._wake_pending = True
            try:
                asyncio.get_running_loop().call_soon(self._wake_if_queued)
            except RuntimeError:  # no loop running: nobody can be waiting yet
                self._wake_if_queued()

    def take_ready(self) -> list[EngineEvent]:
        """The queued events, in order, up to and including a terminal one; none while paused (they are kept
        for the next consumer). The caller must not be between taking an event of ``iterate`` and handling it."""
        taken: list[EngineEvent] = []
        queue = self._queue
        while queue and (not self.paused or self.finished) and not self._ended:
            event = queue.popleft()
            taken.append(event)
            if isinstance(event, TERMINAL_EVENTS):
                self._ended = True
                self._wakeup.set()  # the consumer's iteration ends
        return taken

    def _wake_if_queued(self) -> None:
        self._wake_pending = False
        if self._queue:
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
            while not self._ended:
                while self._queue and (not self.paused or self.finished):
                    event = self._queue.popleft()
                    yield event
                    if isinstance(event, TERMINAL_EVENTS):
                        return
                if self.paused or self.finished or self._ended:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
        finally:
            self._consuming = False
