"""A bridge process among others: the signals processes send each other about calls (a carrier's webhook reached
one process, the call's stream is on another), and the drain that moves or finishes a process's calls when it
stops (SIGTERM)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from callbridge.bridge.end_reason import EndCause
from callbridge.bridge.registry import CallRegistry, CallSignal, RegistryUnavailable, SignalKind
from callbridge.logging import get_logger

__all__ = [
    "DRAIN_NEW_CALL_BOUNCES",
    "FLEET_HOLD_MS",
    "LB_ACTS_S",
    "CallSignals",
    "LiveStream",
    "LoadBalancerGate",
    "SignalHandler",
    "drain_streams",
]

log = get_logger(__name__)

SignalHandler = Callable[[CallSignal], Awaitable[None]]
"""What a carrier does here with another process's ``CallSignal`` (``CallSignals.on``)."""

FLEET_HOLD_MS = 30_000
"""With ``server.max_calls_fleet``: how long a call counts in the fleet unless its process keeps it (every 10 s):
the calls of a process that died are let go then."""
DRAIN_NEW_CALL_BOUNCES = 3
"""How many times a new call that reached a draining process is sent back through the load balancer (each a
carrier's pause and redirect, about a second) before it is refused busy (``AnswerDesk.bounces_new_call``)."""
LB_ACTS_S = 0.25
"""After the readiness answer that takes a draining process out (``LoadBalancerGate``): the load balancer's time to
act on it (HAProxy marks the server down as the check's response arrives) before calls are moved."""
_LISTEN_AGAIN_S = 1.0
"""After the registry's signal stream fails, how long before listening again."""


_BOOKKEEPING: Final = frozenset({SignalKind.STREAM_BOUND})
"""Signals every other process gets for a call as a matter of course (one per call whose stream binds off the process
that answered it): handled without a log line each."""


class LiveStream(Protocol):
    """A call's media stream being served by this process (``MediaStreamDriver``)."""

    async def end_by_carrier(self, reason: EndCause) -> None:
        """The carrier said, out of band, that the call is over: end the stream as its ``stop`` would."""
        ...

    async def digit_by_carrier(self, digit: str) -> None:
        """The carrier said, out of band (a webhook), that the caller pressed ``digit``: as a digit on the wire."""
        ...

    async def superseded(self) -> None:
        """The carrier opened a new stream for this call: this one's connection is gone, whether or not its drop
        reached us. End it as lost (its engine session detached for the new stream)."""
        ...

    async def move_elsewhere(self) -> bool:
        """Draining: detach the engine session into the registry and close the carrier's socket without a
        goodbye, so the carrier reconnects (to another process); False where the carrier would not."""
        ...

    async def shut_down(self) -> None:
        """The process stops with the call still up (a lone process's drain ran out): the engine session is closed,
        the caller hears the closing tone, then the carrier's hang-up."""
        ...


@dataclass
class LoadBalancerGate:
    """When a draining process may move its calls: once the load balancer has taken it out, so that a moved call's
    reconnect reaches another process. Moved earlier, the reconnect (a webhook, then a stream to the public URL) can
    be routed back here by a load balancer that has not yet read ``/readyz`` 503, and moved again, each time a gap
    the caller hears. The load balancer's own readiness checks say when: moving waits for ``checks`` answers of
    503 since the drain began (HAProxy's ``fall``) and ``LB_ACTS_S`` after the last, or ``wait_s`` where fewer come
    (nothing probes ``/readyz``, or Kubernetes' preStop took the pod out before SIGTERM). Pure, clocked from
    outside (seconds, monotonic)."""

    began_s: float
    checks: int
    wait_s: float
    unready_answers: int = 0
    last_answer_s: float | None = None

    def answered_unready(self, now_s: float) -> None:
        """``/readyz`` answered 503 (draining) to a readiness check."""
        self.unready_answers += 1
        self.last_answer_s = now_s

    def taken_out(self, now_s: float) -> bool:
        """Whether moving calls may begin now."""
        if now_s - self.began_s >= self.wait_s:
            return True
        return self.unready_answers >= self.checks and self.last_answer_s is not None and now_s - self.last_answer_s >= LB_ACTS_S

    @property
    def reason(self) -> str:
        """Why moving began (logged): ``readiness_checked`` or ``waited``."""
        return "readiness_checked" if self.unready_answers >= self.checks else "waited"


class CallSignals:
    """Signals about calls between the processes sharing a registry. A signal for a call whose stream is here goes
    to that stream (the call ended, its stream was superseded, a digit); every signal also goes to the handlers
    registered for its kind (a carrier's own, e.g. stream events its webhooks report)."""

    def __init__(
        self, registry: CallRegistry, streams: Mapping[str, LiveStream], spawn: Callable[[Coroutine[Any, Any, None]], None]
    ) -> None:
        self.registry = registry
        self.streams = streams
        self.spawn = spawn
        self.process_id = uuid.uuid4().hex
        """Names this process in the signals it sends (``CallSignal.origin``)."""
        self.handlers: dict[SignalKind, list[tuple[SignalHandler, bool]]] = {}
        """kind → its handlers, each with whether its work is logged (``on``)."""
        self.listener: asyncio.Task[None] | None = None
        """Takes other processes' signals (``start``), from the app's start to its shutdown."""

    def on(self, kind: SignalKind, handler: SignalHandler, *, bookkeeping: bool = False) -> None:
        """Have ``handler`` take the signals of ``kind`` other processes send. ``bookkeeping``: what every process
        does with every such signal (its admission's books), handled without a log line each."""
        self.handlers.setdefault(kind, []).append((handler, bookkeeping))

    def start(self) -> None:
        if self.listener is None:
            self.listener = asyncio.get_running_loop().create_task(self._listen())

    async def aclose(self) -> None:
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def send(self, call_id: str, kind: SignalKind, detail: str) -> None:
        """Tell the other processes (whichever serves the call's stream) what a carrier's webhook said here. Best
        effort: with the registry unreachable it is logged and dropped, never failing the webhook that sent it."""
        try:
            await self.registry.signal(CallSignal(call_id, kind, detail, self.process_id))
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=call_id)

    def _for_stream(self, signal: CallSignal, stream: LiveStream) -> Awaitable[None] | None:
        match signal.kind:
            case SignalKind.CALL_ENDED:
                return stream.end_by_carrier(EndCause.of(signal.detail))  # as the other process wrote it
            case SignalKind.STREAM_SUPERSEDED:
                return stream.superseded()
            case SignalKind.DTMF:
                return stream.digit_by_carrier(signal.detail)
            case _:
                return None

    async def _listen(self) -> None:
        while True:
            try:
                async for signal in self.registry.listen(self.process_id):
                    stream = self.streams.get(signal.call_id)
                    work = self._for_stream(signal, stream) if stream is not None else None
                    if work is not None:
                        self.spawn(self._take(signal, work, logged=signal.kind not in _BOOKKEEPING))
                    for handler, bookkeeping in self.handlers.get(signal.kind, ()):
                        self.spawn(self._take(signal, handler(signal), logged=not bookkeeping))
            except Exception as exc:  # noqa: BLE001 - the listener outlives any one failure; it listens again
                log.error("call_signals_failed", error=repr(exc))
            await asyncio.sleep(_LISTEN_AGAIN_S)

    async def _take(self, signal: CallSignal, work: Awaitable[None], *, logged: bool) -> None:
        try:
            await work
        except Exception as exc:  # noqa: BLE001 - one call's signal never stops the listener or another call
            log.warning("call_signal_failed", call_id=signal.call_id, signal=signal.kind.value, error=repr(exc))
        else:
            if logged:
                log.info("call_signal_handled", call_id=signal.call_id, signal=signal.kind.value, origin=signal.origin)


async def drain_streams(
    streams: Mapping[str, LiveStream],
    calls_left: Callable[[], int],
    *,
    in_place: bool,
    timeout_s: float,
    goodbye_s: float,
    may_move: Callable[[], bool] = lambda: True,
) -> None:
    """SIGTERM, once new calls are refused: unless ``in_place``, move every running call whose carrier reconnects to
    another process (``LiveStream.move_elsewhere``, again as streams arrive) from when ``may_move`` says the load
    balancer has taken this process out (``LoadBalancerGate``); wait up to ``timeout_s`` for the others to end. In place (a lone process), the calls are served on, and those still up at the timeout hear the
    closing tone and are hung up (waited for up to ``goodbye_s``). Returns when no call is left, or at the timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while calls_left() or streams:
        if not in_place and may_move():
            for stream in list(streams.values()):
                await stream.move_elsewhere()
        if loop.time() >= deadline:
            log.warning("drain_timeout", calls_left=calls_left())
            if in_place:
                for stream in list(streams.values()):
                    await stream.shut_down()
                until = loop.time() + goodbye_s
                while streams and loop.time() < until:
                    await asyncio.sleep(0.05)
            return
        await asyncio.sleep(0.05)
    log.info("bridge_drained")
