"""What a carrier media stream uses of its process (``StreamServices``): the media driver (``bridge/media.py``) and
the lifecycle's effects on the server (``bridge/stream_effects.py``) take this, not ``BridgeServices`` — the process's
settings, metrics and pacing timer; its registry, tokens and engine; the streams bound here and the fleet's word on
them; where a call's report, events and recording go; the desk and the application that set a call up; and the
carrier's hang-up and actions. ``BridgeServices`` is the one implementation; a test may pass a smaller one.

Carriers get this and a little more (``CarrierServices``, ``bridge/carrier_services.py``), whose answers come from
the answer desk (``bridge/answer_desk.py``); the app, the rest of ``BridgeServices`` through ``FleetPort`` (the
drain, the admission book, readiness, the signals' wiring).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from structlog.stdlib import BoundLogger

from callbridge.application.hooks import AssistantSource
from callbridge.bridge.actions import ActionResult, CarrierCallAction
from callbridge.bridge.answer_desk import AnswerDesk
from callbridge.bridge.answer_sessions import AnswerSessions
from callbridge.bridge.app_events import EventDelivery
from callbridge.bridge.fleet import LiveStream
from callbridge.bridge.log_budget import LogBudget
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.pacing import PacingClock
from callbridge.bridge.recording_store import RecordingStore
from callbridge.bridge.registry import CallRegistry, SignalKind, StreamTokens
from callbridge.config import Settings
from callbridge.engine.port import DuplexEngine, ResumeTicket

__all__ = ["HangUpFn", "StreamServices"]

HangUpFn = Callable[[str, str, str | None, str], Awaitable[None]]
"""``hang_up(provider, call_id, account_id, reason)``: end the phone call through the carrier."""


class StreamServices(Protocol):
    """What a carrier media stream uses of its process (see the module docstring)."""

    # the process
    @property
    def settings(self) -> Settings: ...
    @property
    def metrics(self) -> BridgeMetrics: ...
    @property
    def pacing(self) -> PacingClock: ...
    @property
    def process_id(self) -> str: ...
    def spawn(self, work: Coroutine[Any, Any, None]) -> None: ...
    def unknown_carrier_event(self, provider: str, event: str, call_log: BoundLogger) -> None: ...
    @property
    def refusal_log(self) -> LogBudget: ...

    # the registry, the tokens, the engine
    @property
    def registry(self) -> CallRegistry: ...
    @property
    def registry_shared(self) -> bool: ...
    @property
    def tokens(self) -> StreamTokens: ...
    @property
    def engine(self) -> DuplexEngine: ...
    @property
    def answer_sessions(self) -> AnswerSessions | None: ...
    async def close_parked(self, ticket: ResumeTicket, reason: str) -> bool: ...
    async def close_detached(
        self, call_id: str, reason: str, ticket: ResumeTicket | None = None, *, mark_ended: bool = True
    ) -> bool: ...

    # the streams bound here, the drain, the fleet
    @property
    def live_streams(self) -> dict[str, LiveStream]: ...
    @property
    def draining(self) -> bool: ...
    @property
    def drains_in_place(self) -> bool: ...
    def call_bound(self, call_id: str) -> None: ...
    def call_unbound(self, call_id: str) -> None: ...
    def call_over(self, call_id: str) -> None: ...
    async def send_signal(self, call_id: str, kind: SignalKind, detail: str) -> None: ...

    # the application
    @property
    def desk(self) -> AnswerDesk: ...
    @property
    def assistants(self) -> AssistantSource | None: ...
    @property
    def events(self) -> EventDelivery | None: ...
    @property
    def recordings(self) -> RecordingStore | None: ...

    # the carrier
    @property
    def hang_up(self) -> HangUpFn:
        """``hang_up(provider, call_id, account_id, reason)``: end the phone call through the carrier."""
        ...
    async def perform_action(
        self, provider: str, call_id: str, account_id: str | None, action: CarrierCallAction
    ) -> ActionResult: ...
