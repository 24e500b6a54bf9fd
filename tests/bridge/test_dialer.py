"""The dialer (#42) against a carrier that answers as told: what it refuses before dialling, what the application
hears as a placed call goes, and what the answer webhook learns of a call placed here."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from callbridge.application import AssistantConfig, CallContext, MachineDetection
from callbridge.application.events import CallEvent
from callbridge.bridge.dialer import Dialer, DialLeg, DialRejected
from callbridge.bridge.fleet import SignalHandler
from callbridge.bridge.registry import CallSignal, RegistryUnavailable, SignalKind
from callbridge.config import Settings
from callbridge.outbound.request import DialAccepted, DialRefusal, DialRequest

pytestmark = pytest.mark.core


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[CallContext, CallEvent]] = []

    def emit(self, call: CallContext, event: CallEvent) -> None:
        self.seen.append((call, event))

    @property
    def types(self) -> list[str]:
        return [event.type for _, event in self.seen]


class Registry:
    """The registry's notes, one process's or a fleet's (``shared``)."""

    def __init__(self, *, shared: bool = False) -> None:
        self.shared = shared
        self.notes: dict[tuple[str, str], str] = {}
        self.turns: list[int | None | RegistryUnavailable] = []
        """What the next ``reserve_dial`` calls answer (then 0: at once)."""
        self.reserved: list[tuple[str, float, int]] = []

    async def reserve_dial(self, carrier: str, interval_ms: float, max_wait_ms: int) -> int | None:
        self.reserved.append((carrier, interval_ms, max_wait_ms))
        turn = self.turns.pop(0) if self.turns else 0
        if isinstance(turn, RegistryUnavailable):
            raise turn
        return turn

    async def keep_note(self, call_id: str, kind: str, text: str, keep_ms: int) -> None:
        self.notes[(call_id, kind)] = text

    async def note(self, call_id: str, kind: str) -> str | None:
        return self.notes.get((call_id, kind))


@dataclass
class Host:
    settings: Settings = field(default_factory=lambda: Settings.model_validate({"outbound": {"max_queued": 1}}))
    draining: bool = False
    events: Any = field(default_factory=Events)
    spawned: list[Coroutine[Any, Any, None]] = field(default_factory=list)
    registry: Any = field(default_factory=Registry)
    handlers: dict[SignalKind, SignalHandler] = field(default_factory=dict)
    peers: list[Host] = field(default_factory=list)
    """The other processes of its fleet (their signal handlers get what this one sends)."""

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self.spawned.append(work)

    def on_signal(self, kind: SignalKind, handler: SignalHandler) -> None:
        self.handlers[kind] = handler

    async def send_signal(self, call_id: str, kind: SignalKind, detail: str) -> None:
        for peer in self.peers:
            await peer.handlers[kind](CallSignal(call_id, kind, detail, "another process"))

    async def run_dials(self) -> None:
        """Run what was spawned to dial (the watchdogs that wait out a ring timeout are dropped)."""
        await self.run_dials_and(())

    async def run_dials_and(self, also: tuple[str, ...]) -> None:
        """``run_dials``, and what was spawned of ``also`` (by name) too."""
        while self.spawned:
            work = self.spawned.pop(0)
            if work.cr_code.co_name in ("_dial", *also):  # type: ignore[attr-defined]
                await work
            else:
                work.close()


class Carrier:
    def __init__(self, *, can_dial: bool = True, rejects: DialRejected | None = None) -> None:
        self.can_dial = can_dial
        self.rejects = rejects
        self.legs: list[DialLeg] = []
        self.canceled: list[str] = []
        self.hold: asyncio.Event | None = None
        """Set: the dial waits for it (a carrier slow to answer)."""
        self.prepared = 0

    async def dial(self, leg: DialLeg) -> str:
        self.legs.append(leg)
        if self.hold is not None:
            await self.hold.wait()
        if self.rejects is not None:
            raise self.rejects
        return f"CA{len(self.legs):032d}"

    async def cancel(self, call_id: str) -> bool:
        self.canceled.append(call_id)
        return True

    async def prepare(self) -> None:
        self.prepared += 1
        if self.rejects is not None:
            raise RuntimeError("no token")


def request(**fields: object) -> DialRequest:
    return DialRequest.model_validate({"carrier": "twilio", "to": "+15005550123", "from": "+15005550006", **fields})


async def placed(host: Host, carrier: Carrier, **fields: object) -> tuple[Dialer, str]:
    dialer = Dialer(host, {"twilio": carrier})
    taken = dialer.place(request(**fields), "https://bridge.example/")
    assert isinstance(taken, DialAccepted), taken
    await host.run_dials()
    return dialer, taken.dial_id


async def test_a_dialled_call_is_followed_to_its_failure_once() -> None:
    host, carrier = Host(), Carrier()
    dialer, dial_id = await placed(host, carrier, metadata={"crm_id": 7}, ring_timeout_s=20)
    (leg,) = carrier.legs
    assert (leg.dial_id, leg.to, leg.from_, leg.ring_timeout_s, leg.base_url) == (dial_id, "+15005550123", "+15005550006", 20, "https://bridge.example")
    call_id = "CA" + "1".rjust(32, "0")
    for status in ("ringing", "ringing", "busy", "busy", "completed"):
        dialer.progress("twilio", call_id, status)  # type: ignore[arg-type]
    assert host.events.types == ["call.dialing", "call.ringing", "call.failed"]
    for call, event in host.events.seen:
        assert (call.call_id, call.dial_id, call.metadata, call.direction, event.call_id) == (call_id, dial_id, {"crm_id": 7}, "outbound", call_id)
    assert host.events.seen[-1][1].data == {"dial_id": dial_id, "reason": "busy", "detail": ""}
    assert await dialer.answering(dial_id, "twilio", call_id) is None  # over: an answer for it now is not this call's


async def test_an_answered_call_is_the_requests_and_does_not_fail_after() -> None:
    host = Host()
    assistant = AssistantConfig(greeting="Say you are calling from the clinic.")
    dialer, dial_id = await placed(host, Carrier(), assistant=assistant.model_dump(exclude_unset=True), metadata={"k": "v"})
    call_id = "CA" + "1".rjust(32, "0")
    assert await dialer.answering(dial_id, "twilio", "CA-someone-else") is None
    assert await dialer.answering(dial_id, "telnyx", call_id) is None
    assert await dialer.answering(None, "twilio", call_id) is None
    found = await dialer.answering(dial_id, "twilio", call_id)
    assert found is not None
    context = found.context
    assert (context.dial_id, context.metadata, context.direction, found.assistant) == (dial_id, {"k": "v"}, "outbound", assistant)
    assert found.machine_detection is None
    dialer.progress("twilio", call_id, "answered")
    dialer.progress("twilio", call_id, "failed")  # after the answer: how it ended, not a failure to reach them
    assert host.events.types == ["call.dialing"]


async def test_a_carrier_that_refuses_the_dial_fails_the_call_and_frees_its_slot() -> None:
    host, carrier = Host(), Carrier(rejects=DialRejected("refused", "HTTP 400 21211 Invalid 'To' Phone Number"))
    dialer, dial_id = await placed(host, carrier)
    assert host.events.types == ["call.failed"]
    call, event = host.events.seen[0]
    assert call.call_id == dial_id and event.data["reason"] == "failed" and "21211" in event.data["detail"]
    again = dialer.place(request(), "https://bridge.example")  # its pacing slot is free again (the rate aside)
    assert isinstance(again, DialAccepted)


@pytest.mark.parametrize(
    ("carrier", "fields", "draining", "reason", "status"),
    [
        (Carrier(), {"carrier": "exotel"}, False, "carrier_cannot_dial", 400),
        (Carrier(can_dial=False), {}, False, "carrier_not_configured", 400),
        (Carrier(), {}, True, "draining", 503),
    ],
)
def test_what_is_refused_before_anything_is_dialled(carrier: Carrier, fields: dict[str, object], draining: bool, reason: str, status: int) -> None:
    host = Host(draining=draining)
    refused = Dialer(host, {"twilio": carrier}).place(request(**fields), "https://bridge.example")
    assert isinstance(refused, DialRefusal) and (refused.reason, refused.status) == (reason, status), refused
    assert host.spawned == [] and carrier.legs == []


async def test_past_the_queue_a_request_is_refused() -> None:
    """``max_queued`` 1 at one call a second: the first is dialled, the second waits, the third is refused."""
    host = Host()
    dialer = Dialer(host, {"twilio": Carrier()})
    answers = [dialer.place(request(), "https://bridge.example") for _ in range(3)]
    assert [getattr(a, "queued_behind", None) for a in answers[:2]] == [0, 1]
    assert isinstance(answers[2], DialRefusal) and (answers[2].reason, answers[2].status) == ("queue_full", 429)
    for work in host.spawned:
        work.close()


async def test_an_answered_call_carries_its_machine_detection() -> None:
    dialer, dial_id = await placed(Host(), Carrier(), machine_detection="voicemail", voicemail_message="Say we called.", on_uncertain="machine")
    found = await dialer.answering(dial_id, "twilio", "CA" + "1".rjust(32, "0"))
    assert found is not None and found.machine_detection == MachineDetection(mode="voicemail", voicemail_message="Say we called.", on_uncertain="machine")


def test_a_voicemail_needs_its_message() -> None:
    with pytest.raises(ValueError, match="voicemail_message"):
        request(machine_detection="voicemail")


@pytest.mark.parametrize("number", ["5550123", "+0123456789", "+1555", "+1 555 0123", "tel:+15550123"])
def test_a_number_that_is_not_e164_is_refused(number: str) -> None:
    with pytest.raises(ValueError, match="E.164"):
        request(to=number)


async def test_a_call_that_ends_here_frees_its_slot_whatever_the_carrier_says() -> None:
    """``max_concurrent`` 1: the second call waits while the first is up; the bridge's own word that the first is
    over (its carrier's ``completed`` lost) lets the second be dialled."""
    host = Host(settings=Settings.model_validate({"outbound": {"max_concurrent": 1, "calls_per_second": 100}}))
    carrier = Carrier()
    dialer, _ = await placed(host, carrier)
    second = dialer.place(request(), "https://bridge.example")
    assert isinstance(second, DialAccepted) and second.queued_behind == 1
    dialer.call_over("CA-not-placed-here")  # nobody's: nothing changes
    dialer.call_over("CA" + "1".rjust(32, "0"))
    await asyncio.sleep(0.02)  # the pacer's wake-up
    await host.run_dials()
    assert [leg.dial_id for leg in carrier.legs][1] == second.dial_id


async def test_a_call_given_up_while_it_waits_its_turn_is_never_dialled() -> None:
    host, carrier = Host(settings=Settings.model_validate({"outbound": {"calls_per_second": 1}})), Carrier()
    dialer = Dialer(host, {"twilio": carrier})
    first = dialer.place(request(), "https://bridge.example")
    second = dialer.place(request(), "https://bridge.example")
    assert isinstance(first, DialAccepted) and isinstance(second, DialAccepted) and second.queued_behind == 1
    assert dialer.cancel(second.dial_id) == "canceled"
    assert [(call.dial_id, event.data["reason"]) for call, event in host.events.seen] == [(second.dial_id, "canceled")]
    await host.run_dials()
    assert [leg.dial_id for leg in carrier.legs] == [first.dial_id]


async def test_a_call_given_up_as_its_dial_goes_is_canceled_once_the_carrier_names_it() -> None:
    host, carrier = Host(), Carrier()
    carrier.hold = asyncio.Event()
    dialer = Dialer(host, {"twilio": carrier})
    taken = dialer.place(request(), "https://bridge.example")
    assert isinstance(taken, DialAccepted)
    dialling = asyncio.ensure_future(host.spawned.pop(0))
    await asyncio.sleep(0)  # the dial is with the carrier
    assert dialer.cancel(taken.dial_id) == "canceling" and carrier.canceled == []
    carrier.hold.set()
    await dialling
    await host.run_dials_and(("_cancel_at_carrier",))
    assert carrier.canceled == ["CA" + "1".rjust(32, "0")]
    assert dialer.cancel(taken.dial_id) == "canceling" and host.spawned == []  # asked again: asked of the carrier once


async def test_an_answered_call_is_too_late_to_give_up_and_an_unknown_one_is_not_found() -> None:
    host = Host()
    dialer = Dialer(host, {"twilio": Carrier()})
    taken = dialer.place(request(), "https://bridge.example")
    assert isinstance(taken, DialAccepted)
    assert await dialer.answering(taken.dial_id, "twilio", "CA1") is not None and dialer.cancel(taken.dial_id) == "answered"
    assert dialer.cancel("dl_none") == "not_found"
    for work in host.spawned:
        work.close()


async def test_a_call_placed_by_one_process_is_answered_and_followed_by_another() -> None:
    """A fleet: the load balancer sends the call's answer webhook and status callbacks to process B, not to A that
    placed it. B reads the request from A's note (the dial id, metadata, assistant, machine detection) and tells A
    the call was answered and when it ended; a status callback B cannot place goes to A too. A emits the events and
    frees the call's pacing slot; nothing is emitted twice."""
    registry = Registry(shared=True)
    a, b = Host(registry=registry), Host(registry=registry)
    a.peers, b.peers = [b], [a]
    assistant = AssistantConfig(instructions="Remind them of the appointment.")
    dialer_a, dial_id = await placed(a, Carrier(), metadata={"crm_id": 7}, assistant=assistant.model_dump(), machine_detection="hang_up")
    dialer_b = Dialer(b, {"twilio": Carrier()})
    call_id = "CA" + "1".rjust(32, "0")
    dialer_b.progress("twilio", call_id, "ringing")  # B cannot place it: told to A
    await b.run_dials_and(("send_signal",))
    found = await dialer_b.answering(dial_id, "twilio", call_id)
    assert found is not None
    assert (found.context.dial_id, found.context.metadata, found.context.direction, found.context.call_id) == (dial_id, {"crm_id": 7}, "outbound", call_id)
    assert found.assistant == assistant and found.machine_detection is not None and found.machine_detection.mode == "hang_up"
    await b.run_dials_and(("send_signal",))
    assert await dialer_a.answering(dial_id, "twilio", call_id) is not None  # A knows the call: it stays A's
    assert dialer_a.cancel(dial_id) == "answered"
    assert a.events.types == ["call.dialing", "call.ringing"] and b.events.types == []
    dialer_b.call_over(call_id)  # the call ended on B's stream: A frees its slot
    await b.run_dials_and(("send_signal",))
    assert dialer_a.cancel(dial_id) == "not_found"
    assert await dialer_b.answering("dl_unknown", "twilio", "CA2") is None
    assert await dialer_b.answering(dial_id, "telnyx", call_id) is None  # not the carrier it was placed with


async def fleet_dial(turn: int | None | RegistryUnavailable) -> tuple[Host, Carrier, str]:
    """One call placed by a process of a fleet, whose registry answers ``turn`` to its reservation."""
    registry = Registry(shared=True)
    registry.turns = [turn]
    host, carrier = Host(registry=registry, settings=Settings.model_validate({"outbound": {"calls_per_second": 5}})), Carrier()
    _, dial_id = await placed(host, carrier)
    assert registry.reserved == [("twilio", pytest.approx(200 + 10), 60_000)]  # the interval, its 5 % margin; the wait
    return host, carrier, dial_id


@pytest.mark.parametrize(
    ("turn", "dialled", "reason", "detail"),
    [
        (30, True, None, ""),
        (None, False, "canceled", "the fleet's turns to dial through twilio are taken for 60 s"),
        (RegistryUnavailable("reserve_dial", "timed out"), False, "failed", "the fleet's registry did not answer"),
    ],
)
async def test_in_a_fleet_a_dial_waits_for_the_fleets_turn_and_one_it_cannot_get_is_failed(
    turn: int | None | RegistryUnavailable, dialled: bool, reason: str | None, detail: str
) -> None:
    """A shared registry: a dial reserves the fleet's turn through its carrier (the pacer's interval, at most the
    queue's wait) and goes when it comes; a turn too far away fails the call canceled; a registry that does not
    answer fails it (the fleet's rate cannot be kept)."""
    host, carrier, dial_id = await fleet_dial(turn)
    assert [leg.dial_id for leg in carrier.legs] == ([dial_id] if dialled else [])
    failed = [event.data for _, event in host.events.seen if event.type == "call.failed"]
    if reason is None:
        assert failed == [] and host.events.types == ["call.dialing"]
    else:
        assert [(data["reason"], detail in data["detail"]) for data in failed] == [(reason, True)], failed


async def test_a_call_canceled_while_it_waits_for_the_fleets_turn_is_never_dialled() -> None:
    registry = Registry(shared=True)
    host, carrier = Host(registry=registry), Carrier()
    registry.turns = [20]
    dialer = Dialer(host, {"twilio": carrier})
    taken = dialer.place(request(), "https://bridge.example")
    assert isinstance(taken, DialAccepted)
    dialling = asyncio.ensure_future(host.spawned.pop(0))
    await asyncio.sleep(0)  # waiting for its turn
    assert dialer.cancel(taken.dial_id) == "canceling"
    await dialling
    assert carrier.legs == [] and host.events.types == ["call.failed"]
    assert host.events.seen[0][1].data["reason"] == "canceled" and dialer.cancel(taken.dial_id) == "not_found"


async def test_without_a_shared_registry_nothing_is_noted_or_signalled() -> None:
    host = Host()
    dialer, dial_id = await placed(host, Carrier())
    assert host.registry.notes == {}
    dialer.progress("twilio", "CA-not-placed-here", "ringing")
    assert host.spawned == []
    assert await dialer.answering("dl_elsewhere", "twilio", "CA9") is None


async def test_carriers_that_can_dial_get_ready_at_the_start_and_one_that_cannot_is_only_logged() -> None:
    """``Dialer.prepare`` (the app's start): each carrier that can dial reads its key or fetches its token then, not
    in its first dial's time (which would put that dial late and the next one too close behind it); one that fails
    to is logged, the others still prepared."""
    ready, unconfigured, failing = Carrier(), Carrier(can_dial=False), Carrier(rejects=DialRejected("refused", "x"))
    dialer = Dialer(Host(), {"twilio": failing, "plivo": unconfigured, "vonage": ready})
    await dialer.prepare()
    assert (ready.prepared, unconfigured.prepared, failing.prepared) == (1, 0, 1)
