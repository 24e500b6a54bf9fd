"""The calls the agent places (#42): a request is taken (``place``), paced per carrier (``OutboundPacer``; with a
shared registry, the fleet's turns too: ``CallRegistry.reserve_dial``, so N processes dial at the carrier's rate, not N
times it), dialled through the carrier's REST API (``CarrierDialer``), and followed by the carrier's progress reports (``progress``)
until it is answered — then it is a call like any other, through the carrier's answer webhook, with the request's
dial id and metadata in its ``CallContext`` and its assistant, where the request gave one (``answering``).

The application hears ``call.dialing`` once the carrier took the request, ``call.ringing``, and ``call.failed`` with
the reason where nobody answers (busy, no answer, refused, never dialled); an answered call's events are an inbound
call's. A call frees its pacing slot when it ends here (``call_over``: the bridge's own word), or when the carrier says it
ended; a carrier that never reports how a dialled call went does not hold its slot for ever: a call not answered
within its ring timeout and ``_REPORT_GRACE_S`` is given up as unanswered, an answered one whose end never came
here after ``server.max_call_duration_s``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import orjson

from callbridge.application import AssistantConfig, CallContext, MachineDetection
from callbridge.application.events import CallEvent
from callbridge.bridge.app_events import EventDelivery
from callbridge.bridge.fleet import SignalHandler
from callbridge.bridge.registry import CallRegistry, CallSignal, RegistryUnavailable, SignalKind
from callbridge.config import Settings
from callbridge.logging import get_logger
from callbridge.outbound.pacing import Dial, OutboundPacer, PacingSettings, Queued, Refused
from callbridge.outbound.request import DialAccepted, DialRefusal, DialRequest

__all__ = [
    "PLACED_NOTE",
    "Answering",
    "CancelOutcome",
    "CarrierDialer",
    "ApplicationCalls",
    "DialLeg",
    "DialProgress",
    "DialRejected",
    "Dialer",
    "DialerHost",
    "FailReason",
]

log = get_logger(__name__)

_REPORT_GRACE_S: Final = 30.0
"""How long past a call's ring timeout (or its longest duration, answered) the carrier's word on it is waited for."""
_MARGIN_SHARE: Final = 0.05
_MARGIN_MAX_MS: Final = 20.0
"""Each dial interval has 5 % (at most 20 ms) on top (``PacingSettings.margin_ms``): at 10 calls a second the requests
reached the simulated carrier as close as 95 ms apart when the bridge sent them 100 ms apart (one core, 100 calls up:
``callbridge loadtest --outbound``), which a carrier counting by its own clock takes for 11 in a second."""
_MAX_KNOWN: Final = 100_000
"""Placed calls followed at most (a bound on memory whatever the settings say)."""
PLACED_NOTE: Final = "placed"
"""The registry note (keyed by the dial id) that lets any process of the fleet answer a call placed by another."""

DialProgress = Literal["ringing", "answered", "completed", "busy", "no_answer", "declined", "failed", "canceled"]
"""What a carrier reports of a call it dialled, in callbridge's words (each carrier maps its own)."""
FailReason = Literal["busy", "no_answer", "declined", "failed", "canceled"]
CancelOutcome = Literal["canceled", "canceling", "answered", "not_found"]
"""What ``Dialer.cancel`` did: never dialled now; asked of the carrier (it reports the end); too late; no such call."""
_FAILURES: Final[dict[str, FailReason]] = {"busy": "busy", "no_answer": "no_answer", "declined": "declined", "failed": "failed", "canceled": "canceled"}
"""The progress that ends a call nobody answered, and the reason it fails with."""


@dataclass(frozen=True, slots=True)
class DialLeg:
    """What a carrier's REST dial needs: the numbers, the ring timeout, and where this bridge is (its public base
    URL, for the answer and status callbacks the carrier is pointed at; ``dial_id`` goes on the answer URL)."""

    dial_id: str
    to: str
    from_: str
    ring_timeout_s: int
    base_url: str


class DialRejected(Exception):
    """The carrier did not take the dial: ``refused`` (its API said no: a number it will not call, the account's
    limits), ``unreachable`` (no answer from its API), ``not_configured`` (no account to dial from)."""

    def __init__(self, reason: Literal["refused", "unreachable", "not_configured"], detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class CarrierDialer(Protocol):
    """A carrier's REST dial (its ``CarrierRest``, where it can dial)."""

    @property
    def can_dial(self) -> bool:
        """Configured to dial (an account to dial from, its credentials)."""
        ...

    async def dial(self, leg: DialLeg) -> str:
        """Ask the carrier to call ``leg.to``; its id for the call. Raises ``DialRejected``."""
        ...

    async def cancel(self, call_id: str) -> bool:
        """Stop a call it dialled that is still ringing; False where that was not done (answered, over, refused)."""
        ...

    async def prepare(self) -> None:
        """Get ready to dial before the first call (read a signing key, fetch a token): what a dial does first it
        would do after the pacer let it go, and the carrier would see that dial late and the next one too soon
        after it. Raises where it cannot (logged; the dial tries again)."""
        ...


class DialerHost(Protocol):
    """What the dialer reads of its bridge process (``BridgeServices``)."""

    settings: Settings
    draining: bool
    events: EventDelivery | None
    registry: CallRegistry

    def spawn(self, work: Coroutine[Any, Any, None]) -> None: ...

    def on_signal(self, kind: SignalKind, handler: SignalHandler) -> None: ...

    async def send_signal(self, call_id: str, kind: SignalKind, detail: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Answering:
    """A placed call, answered: its context (the dial id and metadata), and the request's assistant and machine
    detection (None: the application's assistant; none)."""

    context: CallContext
    assistant: AssistantConfig | None
    machine_detection: MachineDetection | None

    def applied_to(self, webhook: CallContext) -> CallContext:
        """The call's context as its answer webhook tells it, with what the dial adds (its id, metadata, ring time),
        and outbound, whether or not the webhook says so (not every carrier's answer webhook does)."""
        placed = self.context
        return webhook.model_copy(update={"dial_id": placed.dial_id, "metadata": placed.metadata, "ring_ms": placed.ring_ms, "direction": "outbound"})


@dataclass(slots=True)
class _Placed:
    request: DialRequest
    dial_id: str
    base_url: str
    ring_timeout_s: int
    carrier_call_id: str | None = None
    dialling: bool = False
    """Its dial has gone to the carrier (whose answer may still be on its way)."""
    cancel_asked: bool = False
    ringing_at_ms: int | None = None
    ring_ms: int | None = None
    answered: bool = False
    reported: set[str] = field(default_factory=set)

    def answer(self) -> None:
        """It was answered (its answer webhook here, or another process's word): how long it rang, once."""
        if not self.answered and self.ringing_at_ms is not None:
            self.ring_ms = max(0, _now_ms() - self.ringing_at_ms)
        self.answered = True

    def context(self) -> CallContext:
        request = self.request
        return CallContext(
            call_id=self.carrier_call_id or self.dial_id, carrier=request.carrier, direction="outbound",
            caller_number=request.from_, called_number=request.to, dial_id=self.dial_id, metadata=request.metadata,
            ring_ms=self.ring_ms,
        )  # fmt: skip


class Dialer:
    """The process's outbound calls: one pacer per carrier, the calls placed and not over. See the module
    docstring."""

    def __init__(self, host: DialerHost, dialers: Mapping[str, CarrierDialer]) -> None:
        self._host = host
        self._dialers = dict(dialers)
        outbound = host.settings.outbound
        self._pacing = PacingSettings(
            calls_per_second=outbound.calls_per_second, max_concurrent=outbound.max_concurrent,
            max_queued=outbound.max_queued, max_wait_ms=int(outbound.max_wait_s * 1000),
            margin_ms=min(_MARGIN_MAX_MS, _MARGIN_SHARE * 1000 / outbound.calls_per_second),
        )  # fmt: skip
        self._pacers: dict[str, OutboundPacer] = {}
        self._placed: dict[str, _Placed] = {}
        """dial id → a call placed and not over."""
        self._by_call_id: dict[str, str] = {}
        """The carrier's call id → dial id."""
        self._wake: asyncio.TimerHandle | None = None
        self._answered_here: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Calls another process placed whose answer came here (carrier call id → dial id, carrier): their end is
        told to it."""
        host.on_signal(SignalKind.DIAL_PROGRESS, self._on_signal)

    async def prepare(self) -> None:
        """Each carrier that can dial gets ready to (``CarrierDialer.prepare``), at the process's start."""
        for name, dialer in self._dialers.items():
            if not dialer.can_dial:
                continue
            try:
                await dialer.prepare()
            except Exception as exc:  # noqa: BLE001 - a carrier not ready is tried again by its first dial; the bridge starts
                log.warning("dialer_not_ready", carrier=name, error=repr(exc)[:300])

    def add(self, carrier: str, dialer: CarrierDialer) -> None:
        """A carrier that dials without a REST client of its own (the SIP listener, once it is up)."""
        self._dialers[carrier] = dialer

    def place(self, request: DialRequest, base_url: str) -> DialAccepted | DialRefusal:
        """Take ``request`` (dialled now, or queued for the carrier's rate), or refuse it with the reason."""
        dialer = self._dialers.get(request.carrier)
        if self._host.draining:
            return DialRefusal("draining", "this process is draining: place the call through another", 503)
        if dialer is None:
            return DialRefusal("carrier_cannot_dial", f"{request.carrier!r} cannot place calls here (those that can: {', '.join(sorted(self._dialers))})", 400)
        if not dialer.can_dial:
            return DialRefusal("carrier_not_configured", f"{request.carrier} has no account to dial from (see config/callbridge.example.toml)", 400)
        if len(self._placed) >= _MAX_KNOWN:
            return DialRefusal("queue_full", "too many calls placed and not over", 429)
        dial_id = "dl_" + secrets.token_hex(12)
        pacer = self._pacers.get(request.carrier)
        if pacer is None:
            pacer = self._pacers[request.carrier] = OutboundPacer(self._pacing)
        decision = pacer.request(dial_id, _now_ms())
        if isinstance(decision, Refused):
            return DialRefusal(decision.reason, f"{pacer.waiting} calls wait for {request.carrier} already", 429)
        ring_timeout_s = request.ring_timeout_s or self._host.settings.outbound.ring_timeout_s
        self._placed[dial_id] = _Placed(request, dial_id, base_url.rstrip("/"), ring_timeout_s)
        log.info("call_placed", dial_id=dial_id, carrier=request.carrier, to=request.to, queued_behind=getattr(decision, "ahead", 0))
        if isinstance(decision, Dial):
            self._host.spawn(self._dial(dial_id))
            return DialAccepted(dial_id, 0)
        assert isinstance(decision, Queued)
        self._schedule()
        return DialAccepted(dial_id, decision.ahead + 1)

    async def answering(self, dial_id: str | None, carrier: str, carrier_call_id: str) -> Answering | None:
        """The carrier's answer webhook for a call the agent placed (its answer URL names ``dial_id``): what the call's
        context gets from the request (its dial id and metadata), the request's assistant and machine detection.
        A call another process placed is read from its note in the registry (``PLACED_NOTE``), and that process told
        it was answered. None: not a placed call (or not this one)."""
        placed = self._placed.get(dial_id) if dial_id else None
        if placed is None:
            return await self._placed_elsewhere(dial_id, carrier, carrier_call_id) if dial_id else None
        if placed.request.carrier != carrier or placed.carrier_call_id not in (None, carrier_call_id):
            return None
        self._known_as(placed, carrier_call_id)
        placed.answer()
        return Answering(placed.context(), placed.request.assistant, placed.request.detection())

    async def _placed_elsewhere(self, dial_id: str, carrier: str, carrier_call_id: str) -> Answering | None:
        """A call another process of the fleet placed, answered here (the load balancer sent its webhook here)."""
        try:
            note = await self._host.registry.note(dial_id, PLACED_NOTE)
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, dial_id=dial_id)
            return None
        try:
            request = DialRequest.model_validate(orjson.loads(note)["request"]) if note is not None else None
        except (ValueError, KeyError, TypeError):  # not a note this code wrote (another version's): not a placed call here
            log.warning("placed_note_unreadable", dial_id=dial_id)
            return None
        if request is None or request.carrier != carrier:
            return None
        placed = _Placed(request, dial_id, "", 0, carrier_call_id=carrier_call_id, answered=True)
        self._answered_here[carrier_call_id] = (dial_id, carrier)
        while len(self._answered_here) > _MAX_KNOWN:
            self._answered_here.popitem(last=False)
        self._tell_placer(carrier, carrier_call_id, "answered", "", dial_id)
        log.info("placed_call_answered_here", dial_id=dial_id, carrier=carrier, call_id=carrier_call_id)
        return Answering(placed.context(), request.assistant, request.detection())

    def progress(self, carrier: str, carrier_call_id: str, status: DialProgress, detail: str = "") -> None:
        """The carrier's report on a call it dialled (its status callback); one placed by another process of the
        fleet is told to it (``SignalKind.DIAL_PROGRESS``)."""
        dial_id = self._by_call_id.get(carrier_call_id)
        placed = self._placed.get(dial_id) if dial_id else None
        if placed is None:
            self._tell_placer(carrier, carrier_call_id, status, detail, self._answered_here.get(carrier_call_id, (None, ""))[0])
            return
        self._progress_here(placed, carrier, status, detail)

    def _progress_here(self, placed: _Placed, carrier: str, status: str, detail: str) -> None:
        if placed.request.carrier != carrier or status in placed.reported:
            return
        placed.reported.add(status)
        if status == "ringing" and not placed.answered:
            placed.ringing_at_ms = _now_ms()
            self._emit(placed, "call.ringing", {"dial_id": placed.dial_id})
        elif status == "answered":
            placed.answer()
        elif status in _FAILURES and not placed.answered:  # a carrier with no word for "canceled" says no answer
            self._failed(placed, "canceled" if placed.cancel_asked and status == "no_answer" else _FAILURES[status], detail)
        elif status == "completed" or status in _FAILURES:
            self._forget(placed)

    def cancel(self, dial_id: str) -> CancelOutcome:
        """The application gives up on a call it placed: one still waiting for its turn is never dialled
        (``call.failed`` canceled, now); one ringing is canceled at the carrier, which reports it (``call.failed``
        canceled, then); one answered is a call like any other, and ends as they do."""
        placed = self._placed.get(dial_id)
        if placed is None:
            return "not_found"
        if placed.answered:
            return "answered"
        if not placed.dialling:
            self._failed(placed, "canceled", "canceled by the application: never dialled")
            return "canceled"
        if placed.cancel_asked:
            return "canceling"  # asked already: the carrier's report is to come
        placed.cancel_asked = True
        if placed.carrier_call_id is not None:  # else once the carrier names the call (``_dial``)
            self._host.spawn(self._cancel_at_carrier(placed))
        return "canceling"

    async def _cancel_at_carrier(self, placed: _Placed) -> None:
        assert placed.carrier_call_id is not None
        if not await self._dialers[placed.request.carrier].cancel(placed.carrier_call_id):  # answered meanwhile, or over
            log.info("cancel_not_taken", dial_id=placed.dial_id, carrier=placed.request.carrier, call_id=placed.carrier_call_id)

    def call_over(self, call_id: str) -> None:
        """A call has ended here (the bridge's own word, whatever the carrier's status callback says or fails to):
        a call placed here frees its pacing slot; one another process placed, answered here, is told to it."""
        dial_id = self._by_call_id.get(call_id)
        placed = self._placed.get(dial_id) if dial_id else None
        if placed is not None:
            self._forget(placed)
        elif (elsewhere := self._answered_here.pop(call_id, None)) is not None:
            dial_id, carrier = elsewhere
            self._tell_placer(carrier, call_id, "completed", "", dial_id)

    def _tell_placer(self, carrier: str, carrier_call_id: str, status: str, detail: str, dial_id: str | None) -> None:
        """Word on a call this process did not place, for the one that did (with a shared registry: a fleet)."""
        if not self._host.registry.shared:
            return
        body = orjson.dumps({"carrier": carrier, "status": status, "detail": detail[:300], "dial_id": dial_id}).decode()
        self._host.spawn(self._host.send_signal(carrier_call_id, SignalKind.DIAL_PROGRESS, body))

    async def _on_signal(self, signal: CallSignal) -> None:
        """Another process's word on a call: followed where it was placed here, else ignored."""
        try:
            word = orjson.loads(signal.detail)
            carrier, status, detail, dial_id = str(word["carrier"]), str(word["status"]), str(word["detail"]), word.get("dial_id")
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        known = dial_id if isinstance(dial_id, str) and dial_id in self._placed else self._by_call_id.get(signal.call_id)
        placed = self._placed.get(known) if known else None
        if placed is None:
            return
        if placed.carrier_call_id is None:
            self._known_as(placed, signal.call_id)
        self._progress_here(placed, carrier, status, detail)

    async def _dial(self, dial_id: str) -> None:
        placed = self._placed.get(dial_id)
        if placed is None:
            return
        request = placed.request
        placed.dialling = True
        if self._host.registry.shared:  # other processes dial through the carrier too; and read this at its answer
            if not await self._fleet_turn(placed):
                return
            await self._keep_note(placed)
        leg = DialLeg(dial_id, request.to, request.from_, placed.ring_timeout_s, placed.base_url)
        try:
            carrier_call_id = await self._dialers[request.carrier].dial(leg)
        except DialRejected as rejected:
            log.warning("dial_rejected", dial_id=dial_id, carrier=request.carrier, reason=rejected.reason, detail=rejected.detail[:300])
            self._failed(placed, "failed", f"{rejected.reason}: {rejected.detail[:300]}")
            return
        if dial_id not in self._placed:  # over already (its failure reported while the dial's answer came)
            return
        self._known_as(placed, carrier_call_id)
        log.info("call_dialing", dial_id=dial_id, carrier=request.carrier, call_id=carrier_call_id)
        self._emit(placed, "call.dialing", {"dial_id": dial_id})
        if placed.cancel_asked:
            self._host.spawn(self._cancel_at_carrier(placed))
        self._host.spawn(self._give_up_unreported(dial_id, placed.ring_timeout_s + _REPORT_GRACE_S))

    async def _fleet_turn(self, placed: _Placed) -> bool:
        """With a shared registry this process's pacer is one of several dialling through the carrier: the dial waits
        for the fleet's next turn (``CallRegistry.reserve_dial``, the pacer's interval after the last any process
        reserved), so that together they keep the carrier's rate. False: not dialled, and failed — the turn further
        than ``outbound.max_wait_s`` away, the application's cancel meanwhile, or a registry that does not answer
        (the fleet's rate could not be kept)."""
        carrier = placed.request.carrier
        try:
            wait_ms = await self._host.registry.reserve_dial(carrier, self._pacers[carrier].interval_ms, self._pacing.max_wait_ms)
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, dial_id=placed.dial_id)
            self._failed(placed, "failed", "not dialled: the fleet's registry did not answer, so the carrier's rate could not be kept")
            return False
        if wait_ms is None:
            self._failed(placed, "canceled", f"never dialled: the fleet's turns to dial through {carrier} are taken for {self._pacing.max_wait_ms // 1000} s")
            return False
        if wait_ms:
            await asyncio.sleep(wait_ms / 1000)
        if placed.cancel_asked and placed.dial_id in self._placed:
            self._failed(placed, "canceled", "canceled by the application: never dialled")
        return placed.dial_id in self._placed

    async def _keep_note(self, placed: _Placed) -> None:
        """The request, for whichever process of the fleet gets the call's answer webhook (``answering``); kept as
        long as the call may last. A registry that does not answer: logged, the call dialled all the same."""
        keep_s = placed.ring_timeout_s + _REPORT_GRACE_S + self._host.settings.server.max_call_duration_s
        note = orjson.dumps({"request": placed.request.model_dump(mode="json", by_alias=True)}).decode()
        try:
            await self._host.registry.keep_note(placed.dial_id, PLACED_NOTE, note, int(keep_s * 1000))
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, dial_id=placed.dial_id)

    async def _give_up_unreported(self, dial_id: str, after_s: float) -> None:
        """The carrier's word on a call that never comes: unanswered, the call is failed as such; answered, its slot
        is freed once it would have ended anyway."""
        await asyncio.sleep(after_s)
        placed = self._placed.get(dial_id)
        if placed is None:
            return
        if not placed.answered:
            log.warning("dial_unreported", dial_id=dial_id, carrier=placed.request.carrier, call_id=placed.carrier_call_id)
            self._failed(placed, "no_answer", "the carrier never said how the call went")
            return
        await asyncio.sleep(self._host.settings.server.max_call_duration_s)
        if dial_id in self._placed:
            self._forget(self._placed[dial_id])

    def _known_as(self, placed: _Placed, carrier_call_id: str) -> None:
        placed.carrier_call_id = carrier_call_id
        self._by_call_id[carrier_call_id] = placed.dial_id

    def _failed(self, placed: _Placed, reason: FailReason, detail: str) -> None:
        log.info("call_failed", dial_id=placed.dial_id, carrier=placed.request.carrier, call_id=placed.carrier_call_id, reason=reason, detail=detail)
        self._emit(placed, "call.failed", {"dial_id": placed.dial_id, "reason": reason, "detail": detail})
        self._forget(placed)

    def _forget(self, placed: _Placed) -> None:
        self._placed.pop(placed.dial_id, None)
        if placed.carrier_call_id is not None:
            self._by_call_id.pop(placed.carrier_call_id, None)
        pacer = self._pacers.get(placed.request.carrier)
        if pacer is not None:
            pacer.ended(placed.dial_id)
            self._schedule()

    def _emit(self, placed: _Placed, kind: Literal["call.dialing", "call.ringing", "call.failed"], data: dict[str, Any]) -> None:
        events = self._host.events
        if events is not None:
            context = placed.context()
            events.emit(context, CallEvent(type=kind, call_id=context.call_id, at=time.time(), data=data))

    def _schedule(self) -> None:
        """Wake at the earliest pacer's next deadline (or now, where a slot just freed lets a waiting call go)."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        deadlines = [d for pacer in self._pacers.values() if (d := pacer.next_deadline_ms()) is not None]
        if not deadlines:
            return
        loop = asyncio.get_running_loop()
        self._wake = loop.call_later(max(0.0, (min(deadlines) - _now_ms()) / 1000), self._tick)

    def _tick(self) -> None:
        self._wake = None
        now = _now_ms()
        for carrier, pacer in self._pacers.items():
            for due in pacer.tick(now):
                placed = self._placed.get(due.call_id)
                if placed is None:
                    continue
                if isinstance(due, Dial):
                    self._host.spawn(self._dial(due.call_id))
                else:
                    self._failed(placed, "canceled", f"never dialled: waited {self._pacing.max_wait_ms // 1000} s for {carrier}'s rate or a slot")
        self._schedule()


class ApplicationCalls:
    """The ``Calls`` a Python application's ``started`` hook gets: ``Dialer.place`` with this bridge's base URL
    (``server.public_url``, else where it listens) for the carrier's answer and status callbacks."""

    def __init__(self, dialer: Dialer, base_url: str) -> None:
        self._dialer = dialer
        self._base_url = base_url

    def place(self, request: DialRequest) -> DialAccepted | DialRefusal:
        return self._dialer.place(request, self._base_url)

    def cancel(self, dial_id: str) -> CancelOutcome:
        return self._dialer.cancel(dial_id)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
