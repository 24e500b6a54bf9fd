"""Engine sessions opened when a call is answered, for its first media stream to take.

Why: a carrier opens the media stream a few hundred ms after the answer webhook returns. Opening the engine
session then, rather than when the stream starts, takes the engine's handshake (a websocket connect and
``session.create`` to a GPU server, tens to hundreds of ms) off the call's start: the caller's first audio
reaches the engine as it is read (peers.md §3, item 30: pipecat read the first media 1.6 s after ``start``).
The stream never waits for it to *start* reading either way; with a session ready it also never waits to
hand audio over.

Only where the process that answers is the one the stream reaches: ``engine.open_at_answer = "auto"`` opens
them with the memory registry (one process) and not with Redis (the stream may land on another worker or host,
which would open its own). A session nobody takes within ``engine.open_at_answer_ttl_s`` (the caller hung up
while it rang, the stream went elsewhere) is closed.
"""

from __future__ import annotations

import asyncio
from typing import Final

from callbridge.engine.errors import EngineError
from callbridge.engine.port import DuplexEngine, DuplexSession, SessionConfig
from callbridge.logging import get_logger

__all__ = ["AnswerSessions"]

log = get_logger(__name__)

_CLOSE_TIMEOUT_S: Final = 5.0


class AnswerSessions:
    """call id → the engine session being opened (or open) for the call's first stream."""

    def __init__(self, engine: DuplexEngine, ttl_s: float) -> None:
        self._engine = engine
        self._ttl_s = ttl_s
        self._opening: dict[str, asyncio.Task[DuplexSession]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._opening)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._opening

    def open(self, call_id: str, config: SessionConfig) -> None:
        """Start opening the call's session (nothing if one is already on its way)."""
        if call_id in self._opening:
            return
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._engine.open(config))
        self._opening[call_id] = task
        self._timers[call_id] = loop.call_later(self._ttl_s, self._expire, call_id, task)

    async def refusal(self, call_id: str, wait_s: float) -> EngineError | None:
        """Wait up to ``wait_s`` for the call's session to open; the engine's error if it refused it (the call
        is then forgotten here), else None (open, or still opening: the stream takes it)."""
        task = self._opening.get(call_id)
        if task is None:
            return None
        done, _ = await asyncio.wait({task}, timeout=wait_s)
        if not done or task.cancelled():
            return None
        error = task.exception()
        if not isinstance(error, EngineError):
            return None
        self._pop(call_id)
        return error

    async def take(self, call_id: str) -> DuplexSession | None:
        """The session opened for the call at its answer, once open; None when there is none or it failed to
        open (the stream opens its own and reports why). Cancelled while it waits, the session is closed."""
        task = self._pop(call_id)
        if task is None:
            return None
        try:
            session = await asyncio.shield(task)
        except asyncio.CancelledError:
            self._close_when_open(task, "stream_ended")
            raise
        except EngineError as exc:
            log.info("answer_session_failed", call_id=call_id, reason=exc.code, detail=exc.message)
            return None
        return session

    def discard(self, call_id: str, reason: str) -> None:
        """The call's stream ended without taking its session (refused, bad input, dropped at once): close it."""
        task = self._pop(call_id)
        if task is not None:
            self._close_when_open(task, reason)

    def _pop(self, call_id: str) -> asyncio.Task[DuplexSession] | None:
        timer = self._timers.pop(call_id, None)
        if timer is not None:
            timer.cancel()
        return self._opening.pop(call_id, None)

    def _expire(self, call_id: str, task: asyncio.Task[DuplexSession]) -> None:
        if self._opening.get(call_id) is not task:
            return
        del self._opening[call_id]
        self._timers.pop(call_id, None)
        log.info("answer_session_unclaimed", call_id=call_id, ttl_s=self._ttl_s)
        self._close_when_open(task, "not_claimed")

    def _close_when_open(self, task: asyncio.Task[DuplexSession], reason: str) -> None:
        closing = asyncio.get_running_loop().create_task(self._close(task, reason))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(task: asyncio.Task[DuplexSession], reason: str) -> None:
        try:
            session = await task
            await asyncio.wait_for(session.close(reason), _CLOSE_TIMEOUT_S)
        except (EngineError, asyncio.CancelledError, TimeoutError):
            pass  # it never opened, or the engine does not answer: its grace ends it
        except Exception as exc:  # noqa: BLE001 - a cleanup in the background: logged, never raised
            log.warning("answer_session_close_failed", error=repr(exc))

    async def aclose(self) -> None:
        """Shutting down: close every session nobody took."""
        opening, self._opening = list(self._opening.values()), {}
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in opening:
            self._close_when_open(task, "bridge_stopping")
        if self._closing:
            await asyncio.wait(self._closing, timeout=_CLOSE_TIMEOUT_S + 1)
