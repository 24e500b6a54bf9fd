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


@dataclass
class Host:
    settings: Settings = field(default_factory=lambda: Settings.model_validate({"outbound": {"max_queued": 1}}))
    draining: bool = False
    events: Any = field(default_factory=Events)
    spawned: list[Coroutine[Any, Any, None]] = field(default_factory=list)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self.spawned.append(work)

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
    assert dialer.answering(dial_id, "twilio", call_id) is None  # over: an answer for it now is not this call's


async def test_an_answered_call_is_the_requests_and_does_not_fail_after() -> None:
    host = Host()
    assistant = AssistantConfig(greeting="Say you are calling from the clinic.")
    dialer, dial_id = await placed(host, Carrier(), assistant=assistant.model_dump(exclude_unset=True), metadata={"k": "v"})
    call_id = "CA" + "1".rjust(32, "0")
    assert dialer.answering(dial_id, "twilio", "CA-someone-else") is None
    assert dialer.answering(dial_id, "telnyx", call_id) is None
    assert dialer.answering(None, "twilio", call_id) is None
    found = dialer.answering(dial_id, "twilio", call_id)
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
    found = dialer.answering(dial_id, "twilio", "CA" + "1".rjust(32, "0"))
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


def test_an_answered_call_is_too_late_to_give_up_and_an_unknown_one_is_not_found() -> None:
    host = Host()
    dialer = Dialer(host, {"twilio": Carrier()})
    taken = dialer.place(request(), "https://bridge.example")
    assert isinstance(taken, DialAccepted)
    assert dialer.answering(taken.dial_id, "twilio", "CA1") is not None and dialer.cancel(taken.dial_id) == "answered"
    assert dialer.cancel("dl_none") == "not_found"
    for work in host.spawned:
        work.close()
