"""A stream's limits that no message enforces, sans-I/O: a connection that never starts its stream, a stream gone
quiet, a call past the longest allowed (the bridge's, or its assistant's own). ``CallSession`` reads their verdict on
its ticks and acts on it.

After a stall of this process (stopped, its VM frozen) the first tick to run is far later than the deadline it
answers, and it runs before the reader gets to the carrier's messages of that time: the carrier's limits are then
judged ``PROCESS_STALL_MS`` later, once the reader has had its turn (``put_off_if_late``), once.
"""

from __future__ import annotations

from typing import Final

from callbridge.bridge.end_reason import EndReason
from callbridge.stall import PROCESS_STALL_MS

__all__ = ["ASSISTANT_MAX_DURATION", "FIRST_MESSAGE_TIMEOUT", "IDLE_TIMEOUT", "MAX_CALL_DURATION", "StreamLimits"]

MAX_CALL_DURATION: Final = EndReason.MAX_CALL_DURATION
ASSISTANT_MAX_DURATION: Final = EndReason.ASSISTANT_MAX_DURATION
FIRST_MESSAGE_TIMEOUT: Final = EndReason.FIRST_MESSAGE_TIMEOUT
IDLE_TIMEOUT: Final = EndReason.IDLE_TIMEOUT
"""A started stream that sent nothing this long: taken for dropped (its session waits for the next stream)."""


class StreamLimits:
    """The limits of one carrier stream, from its connection on. See the module docstring."""

    __slots__ = (
        "first_message_timeout_ms", "idle_timeout_ms", "max_call_ms", "connected_at_ms", "last_message_ms",
        "deferred", "due_ms", "call_ends_at_ms",
    )  # fmt: skip

    def __init__(self, first_message_timeout_ms: int, idle_timeout_ms: int, max_call_ms: int | None) -> None:
        self.first_message_timeout_ms = first_message_timeout_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.max_call_ms = max_call_ms
        self.connected_at_ms: int | None = None
        self.last_message_ms = 0
        self.deferred = False
        """A late tick put off the verdict (``PROCESS_STALL_MS``) and no message has been read since."""
        self.due_ms: int | None = None
        """When the verdict is next due (it moves only then, not with every message); None: no limit runs."""
        self.call_ends_at_ms: int | None = None
        """The call's own limit, where its assistant set one."""

    def connected(self, now_ms: int) -> None:
        """The carrier's connection is open: the limits run from now."""
        self.connected_at_ms = self.last_message_ms = now_ms
        self.due_ms = now_ms + self.first_message_timeout_ms
        if self.max_call_ms is not None:
            self.due_ms = min(self.due_ms, now_ms + self.max_call_ms)

    def message_read(self, now_ms: int) -> None:
        self.last_message_ms = now_ms
        self.deferred = False

    def stream_started(self, now_ms: int) -> None:
        """The stream's ``start`` was read: from now on the idle limit runs."""
        if self.due_ms is not None:
            self.due_ms = min(self.due_ms, now_ms + self.idle_timeout_ms)

    def call_ends_at(self, at_ms: int | None) -> None:
        """The call's assistant limits its length: it ends at ``at_ms`` (None: it sets no limit)."""
        if at_ms is None:
            return
        self.call_ends_at_ms = at_ms
        self.due_ms = at_ms if self.due_ms is None else min(self.due_ms, at_ms)

    def put_off_if_late(self, now_ms: int, asked_ms: int | None) -> None:
        """A tick at ``now_ms`` for the deadline ``asked_ms``: where the verdict is due and the tick came at least
        ``PROCESS_STALL_MS`` late, put the verdict off that long (once, until a message is read)."""
        due = self.due_ms
        if due is None or now_ms < due or self.deferred:
            return
        if asked_ms is not None and now_ms - asked_ms >= PROCESS_STALL_MS:
            self.deferred = True
            self.due_ms = now_ms + PROCESS_STALL_MS

    def is_due(self, now_ms: int) -> bool:
        return self.due_ms is not None and now_ms >= self.due_ms

    def reached(self, now_ms: int, *, started: bool, over: bool) -> EndReason | None:
        """The limit reached at ``now_ms``, where one is due (``verdict``); none for a stream ``over`` (they stop)."""
        if not self.is_due(now_ms):
            return None
        if over:
            self.stop()
            return None
        return self.verdict(now_ms, started=started)

    def verdict(self, now_ms: int, *, started: bool) -> EndReason | None:
        """The limit reached at ``now_ms`` (``started``: the stream's ``start`` was read), or None and the next time
        one is due."""
        connected = self.connected_at_ms
        self.due_ms = None
        if connected is None:
            return None
        max_call_ms = self.max_call_ms
        if max_call_ms is not None and now_ms >= connected + max_call_ms:
            return MAX_CALL_DURATION
        if self.call_ends_at_ms is not None and now_ms >= self.call_ends_at_ms:
            return ASSISTANT_MAX_DURATION
        if not started:
            due = connected + self.first_message_timeout_ms
            if now_ms >= due:
                return FIRST_MESSAGE_TIMEOUT
        else:
            due = self.last_message_ms + self.idle_timeout_ms
            if now_ms >= due:
                return IDLE_TIMEOUT
        limits = (due, connected + max_call_ms if max_call_ms is not None else None, self.call_ends_at_ms)
        self.due_ms = min(limit for limit in limits if limit is not None)
        return None

    def stop(self) -> None:
        """The stream is over: no limit runs any more."""
        self.due_ms = None
