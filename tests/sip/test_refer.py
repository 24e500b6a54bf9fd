"""Our transfer (RFC 3515) in the SIP UAS under a fake clock: REFER in the dialog, its 202, the NOTIFYs with
``message/sipfrag`` that report the outcome, and every way it can fail."""

from __future__ import annotations

import pytest

from callbridge.sip.dialog import CallEnded, SipUas, TransferResult
from callbridge.sip.message import SipRequest, SipResponse, parse_message
from callbridge.sip.transaction import T1_MS, TIMEOUT_MS
from tests.sip.test_dialog import PEER, answered, request, uas

pytestmark = pytest.mark.core


def confirmed() -> tuple[SipUas, str]:
    core = uas()
    tag = answered(core)
    core.receive_datagram(request("ACK", branch="z9hG4bKack", to_tag=tag), PEER, 100)
    core.events()
    return core, tag


def sent_request(core: SipUas) -> SipRequest:
    (datagram,) = core.datagrams_to_send()
    assert datagram.address == PEER
    message = parse_message(datagram.data)
    assert isinstance(message, SipRequest)
    return message


def reply(core: SipUas, to: SipRequest, status: int, reason: str, now_ms: int) -> None:
    response = SipResponse(status=status, reason=reason)
    for name in ("Via", "From", "To", "Call-ID", "CSeq"):
        response.add(name, to.header(name) or "")
    core.receive_datagram(response.serialize(), PEER, now_ms)


def notify(tag: str, cseq: int, sipfrag: str, state: str = "active;expires=60", event: str = "refer") -> bytes:
    lines = [
        "NOTIFY sip:callbridge@127.0.0.1:5060 SIP/2.0",
        f"Via: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bKn{cseq};rport",
        "From: <sip:alice@10.0.0.1>;tag=alice",
        f"To: <sip:agent@127.0.0.1>;tag={tag}",
        "Call-ID: c1",
        f"CSeq: {cseq} NOTIFY",
        f"Event: {event}",
        f"Subscription-State: {state}",
        "Content-Type: message/sipfrag;version=2.0",
        f"Content-Length: {len(sipfrag)}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n" + sipfrag).encode()


def statuses(core: SipUas) -> list[int]:
    out = []
    for datagram in core.datagrams_to_send():
        message = parse_message(datagram.data)
        assert isinstance(message, SipResponse)
        out.append(message.status)
    return out


def test_refer_202_then_notify_200_sipfrag_is_a_transfer_done() -> None:
    core, tag = confirmed()
    core.transfer("c1", "sip:desk@pbx.example.com", 1000)
    refer = sent_request(core)
    assert refer.method == "REFER" and refer.uri == "sip:alice@10.0.0.1:5070"  # the remote target (Contact)
    assert refer.header("Refer-To") == "<sip:desk@pbx.example.com>"
    assert refer.cseq == (1, "REFER") and refer.header("Route") == "<sip:proxy.example;lr>"
    assert refer.header("From") == f"<sip:agent@127.0.0.1>;tag={tag}" and refer.header("To") == "<sip:alice@10.0.0.1>;tag=alice"
    assert refer.header("Contact") == "<sip:callbridge@127.0.0.1:5060>"
    reply(core, refer, 202, "Accepted", 1050)
    assert core.events() == []
    core.receive_datagram(notify(tag, 2, "SIP/2.0 100 Trying\r\n"), PEER, 1100)
    assert statuses(core) == [200] and core.events() == []
    core.receive_datagram(notify(tag, 3, "SIP/2.0 200 OK\r\n", state="terminated;reason=noresource"), PEER, 3000)
    assert statuses(core) == [200]
    assert core.events() == [TransferResult("c1", True, 200, "OK")]
    core.tick(TIMEOUT_MS * 2)
    assert core.datagrams_to_send() == [] and core.events() == []  # nothing left running


def test_a_bare_number_is_referred_to_the_trunk() -> None:
    core, _ = confirmed()
    core.transfer("c1", "+15550100", 1000)
    assert sent_request(core).header("Refer-To") == "<sip:+15550100@10.0.0.1:5070>"


def test_the_refer_is_retransmitted_until_answered_and_times_out() -> None:
    core, _ = confirmed()
    core.transfer("c1", "sip:desk@pbx", 0)
    first = sent_request(core)
    core.tick(T1_MS)
    assert sent_request(core).cseq == first.cseq  # Timer E
    for now in [*range(T1_MS + 1, TIMEOUT_MS, 250), TIMEOUT_MS]:
        core.tick(now)
    core.datagrams_to_send()
    assert core.events() == [TransferResult("c1", False, 408, "no answer to the REFER")]


@pytest.mark.parametrize(
    ("sipfrag", "state", "expected"),
    [
        ("SIP/2.0 486 Busy Here\r\n", "terminated", TransferResult("c1", False, 486, "Busy Here")),
        ("SIP/2.0 603 Declined\r\n", "active", TransferResult("c1", False, 603, "Declined")),
        ("SIP/2.0 180 Ringing\r\n", "terminated;reason=timeout", TransferResult("c1", False, 180, "subscription terminated without a final status")),
    ],
)
def test_a_failed_transfer_is_reported(sipfrag: str, state: str, expected: TransferResult) -> None:
    core, tag = confirmed()
    core.transfer("c1", "sip:desk@pbx", 0)
    reply(core, sent_request(core), 202, "Accepted", 10)
    core.receive_datagram(notify(tag, 2, sipfrag, state=state), PEER, 20)
    assert statuses(core) == [200]
    assert core.events() == [expected]


def test_a_refused_refer_is_reported() -> None:
    core, _ = confirmed()
    core.transfer("c1", "sip:desk@pbx", 0)
    reply(core, sent_request(core), 403, "Forbidden", 10)
    assert core.events() == [TransferResult("c1", False, 403, "Forbidden")]
    core.tick(T1_MS * 4)
    assert core.datagrams_to_send() == []  # no more retransmissions


def test_no_final_notify_within_64_t1() -> None:
    core, _ = confirmed()
    core.transfer("c1", "sip:desk@pbx", 0)
    reply(core, sent_request(core), 202, "Accepted", 10)
    assert core.next_deadline_ms() == TIMEOUT_MS
    core.tick(TIMEOUT_MS)
    assert core.events() == [TransferResult("c1", False, 408, "no final NOTIFY for the REFER")]


def test_the_caller_hanging_up_mid_transfer_ends_it() -> None:
    core, tag = confirmed()
    core.transfer("c1", "sip:desk@pbx", 0)
    reply(core, sent_request(core), 202, "Accepted", 10)
    core.receive_datagram(request("BYE", cseq=2, branch="z9hG4bKbye", to_tag=tag), PEER, 20)
    assert core.events() == [TransferResult("c1", False, 0, "the call ended"), CallEnded("c1", "bye")]


def test_one_transfer_at_a_time_and_only_on_an_established_call() -> None:
    core, _ = confirmed()
    core.transfer("c1", "sip:desk@pbx", 0)
    core.datagrams_to_send()
    core.transfer("c1", "sip:other@pbx", 10)
    assert core.events() == [TransferResult("c1", False, 0, "a transfer is in progress")]
    core.transfer("nope", "sip:desk@pbx", 10)
    assert core.events() == [TransferResult("nope", False, 0, "the call is not established")]


def test_notify_outside_a_dialog_or_of_another_event() -> None:
    core, tag = confirmed()
    core.receive_datagram(notify("wrong", 2, "SIP/2.0 200 OK\r\n"), PEER, 10)
    assert statuses(core) == [481]
    core.receive_datagram(notify(tag, 3, "", event="presence"), PEER, 20)
    assert statuses(core) == [489]
    core.receive_datagram(notify(tag, 4, "SIP/2.0 200 OK\r\n"), PEER, 30)  # no transfer running: just answered
    assert statuses(core) == [200] and core.events() == []
