"""Drop audio that arrives after its response was cancelled (reference §5.2).

In vllm-omni 0.30.0 audio already queued in a session's outbox can still
reach the client after a cancel, before the cancellation events; the bridge
must not play it. The filter watches the stream in order: a cancelled
``response.done`` marks its response; the highest epoch seen fences older
ones. Audio of either kind is dropped.
"""

from __future__ import annotations

from callbridge.engine.events import (
    AudioDelta,
    EngineEvent,
    OverlapDecision,
    ResponseCreated,
    ResponseDone,
)

__all__ = ["LateAudioFilter"]


class LateAudioFilter:
    """Pass events through in order; ``admit`` says False for late audio."""

    __slots__ = ("_cancelled", "_max_epoch", "dropped")

    def __init__(self) -> None:
        self._max_epoch = -1
        self._cancelled: set[str] = set()
        self.dropped = 0

    def admit(self, event: EngineEvent) -> bool:
        if isinstance(event, AudioDelta):
            if event.response_id in self._cancelled or (event.epoch is not None and event.epoch < self._max_epoch):
                self.dropped += 1
                return False
        elif isinstance(event, ResponseDone) and event.status == "cancelled":
            self._cancelled.add(event.response_id)
        if isinstance(event, ResponseCreated | ResponseDone | OverlapDecision | AudioDelta) and event.epoch is not None:
            self._max_epoch = max(self._max_epoch, event.epoch)
        return True
