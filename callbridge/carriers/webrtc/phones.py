"""The browser calls of one process: an offer from ``/talk`` answered by aiortc, then served through the call core
(``MediaStreamDriver``) as any carrier's stream, until it ends.

Before anything is set up, an offer must pass the budgets a phone call's stream does (the process is not draining,
``server.max_calls`` and the fleet's), and ``webrtc.max_calls`` of this process's browser calls: a refusal costs no
peer connection. An offer aiortc cannot take (not SDP, no audio, no Opus) is refused and its connection closed. A call
whose browser never connects gives its admission back at once.

aiortc (and PyAV with it: about 0.6 s and 34 MB a process) is imported with the first offer, not at start: a bridge
that never takes a browser call never loads it."""

from __future__ import annotations

import asyncio
import importlib
import secrets
import sys
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self

from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.media import MediaStreamDriver
from callbridge.carriers.webrtc.settings import WebRtcSettings
from callbridge.carriers.webrtc.wire import PROVIDER, WebRtcCodec
from callbridge.logging import get_logger

if TYPE_CHECKING:
    from callbridge.carriers.webrtc.transport import PeerTransport

__all__ = ["Answered", "BrowserPhones"]

log = get_logger(__name__)

_SHUTDOWN_WAIT_S: Final = 5.0
_TRANSPORT: Final = "callbridge.carriers.webrtc.transport"


@dataclass(frozen=True, slots=True)
class Answered:
    """An offer answered (its call id and the answer's SDP), or refused: ``refusal`` is (HTTP status, reason, detail)."""

    call_id: str = ""
    sdp: str = ""
    refusal: tuple[int, str, str] | None = None


class BrowserPhones(AbstractAsyncContextManager["BrowserPhones"]):
    """This process's browser calls, for the life of the app (``services.carrier_state["webrtc"]``: the routes find
    them there)."""

    def __init__(self, services: CarrierServices) -> None:
        self.services = services
        self.settings: WebRtcSettings = services.settings.webrtc
        self.calls: dict[str, PeerTransport] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._answering = 0
        """Offers being answered now (each will be a call of ``calls``, or refused)."""

    async def __aenter__(self) -> Self:
        self.services.carrier_state[PROVIDER] = self
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._closing = True
        for transport in list(self.calls.values()):
            await transport.close()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=_SHUTDOWN_WAIT_S)
        for task in list(self._tasks):
            task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await task
        self.services.carrier_state.pop(PROVIDER, None)

    async def answer(self, offer_sdp: str, parameters: Mapping[str, str], peer: str | None) -> Answered:
        """The answer to a browser's offer, its call under way; or why it is refused (nothing of it kept)."""
        if self._closing or self.services.desk.refusal_before_call_id() is not None:
            return self._refused(503, "draining", "this bridge is shutting down", peer)
        if len(self.calls) + self._answering >= self.settings.max_calls:
            return self._refused(503, "busy", f"{self.settings.max_calls} browser calls are up here (webrtc.max_calls)", peer)
        self._answering += 1  # its place held while it is answered: offers at once do not all pass the count
        try:
            return await self._answer(offer_sdp, parameters, peer)
        finally:
            self._answering -= 1

    async def _answer(self, offer_sdp: str, parameters: Mapping[str, str], peer: str | None) -> Answered:
        call_id = f"webrtc-{secrets.token_hex(12)}"
        if (refusal := await self.services.desk.stream_refusal(call_id)) is not None:
            return self._refused(503, str(refusal), "no room for another call here", peer)
        if _TRANSPORT not in sys.modules:  # the first offer: aiortc loaded beside the event loop, not in it (0.6 s)
            await asyncio.to_thread(importlib.import_module, _TRANSPORT)
        from callbridge.carriers.webrtc.transport import BadOffer, answer_offer

        try:
            transport, answer_sdp = await answer_offer(call_id, offer_sdp, self.settings)
        except BadOffer as exc:
            self.services.desk.give_back_admission(call_id)
            return self._refused(400, "bad_offer", str(exc), peer)
        self.calls[call_id] = transport
        task = asyncio.create_task(self._serve(transport, WebRtcCodec(call_id, parameters)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        log.info("webrtc_call_answered", provider=PROVIDER, call_id=call_id, peer=peer)
        return Answered(call_id, answer_sdp)

    async def _serve(self, transport: PeerTransport, codec: WebRtcCodec) -> None:
        call_id = transport.call_id
        try:
            await MediaStreamDriver(transport, codec, self.services, check_token=False).run()
        finally:
            await transport.close()
            self.calls.pop(call_id, None)
            if not transport.connected:
                self.services.desk.give_back_admission(call_id)
                self.services.metrics.stream_refused.labels(PROVIDER, "no_connection").inc()
            if transport.agent.dropped or transport.overflow or transport.control_dropped:
                log.warning("webrtc_dropped", provider=PROVIDER, call_id=call_id, agent_frames=transport.agent.dropped,
                            caller_frames=transport.overflow, control_messages=transport.control_dropped)  # fmt: skip

    def _refused(self, status: int, reason: str, detail: str, peer: str | None) -> Answered:
        self.services.metrics.stream_refused.labels(PROVIDER, reason).inc()
        log.warning("stream_refused", provider=PROVIDER, reason=reason, peer=peer, detail=detail)
        return Answered(refusal=(status, reason, detail))
