"""The SIP user-agent client core (``sip/uac.py``, RFC 3261 §13.2, §17.1.1, §9.1) under a hand-moved clock: a far end
in memory answers its INVITEs; the dialog a 2xx makes is handed to a real ``SipUas``, which then serves BYEs either
way as in a dialog it answered."""

from __future__ import annotations

import base64

import pytest

from callbridge.sip.dialog import CallEnded, SipUas, UasConfig
from callbridge.sip.digest import authorization, parse_challenge
from callbridge.sip.message import SipRequest, SipResponse, header_param, parse_message, uri_of
from callbridge.sip.sdp import offer
from callbridge.sip.transaction import T1_MS, TIMEOUT_MS, Outgoing
from callbridge.sip.uac import DialAnswered, DialEnded, Invitation, Provisional, SipUac, UacConfig, UacEvent

pytestmark = pytest.mark.core

TRUNK = ("192.0.2.10", 5060)
FAR_END = ("192.0.2.44", 5080)
SDP_ANSWER = (
    "v=0\r\no=far 1 1 IN IP4 192.0.2.44\r\ns=-\r\nc=IN IP4 192.0.2.44\r\nt=0 0\r\n"
    "m=audio 40000 RTP/AVP 8 101\r\na=rtpmap:8 PCMA/8000\r\na=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n"
)


def uac(**config: object) -> SipUac:
    return SipUac(UacConfig(host="198.51.100.7", port=5060, **config))  # type: ignore[arg-type]


def invitation(call_id: str = "c1", ring_timeout_ms: int = 30_000, **overrides: object) -> Invitation:
    fields: dict[str, object] = {
        "call_id": call_id, "request_uri": "sip:+15551230000@trunk.example.com", "from_uri": "sip:+15559870000@trunk.example.com",
        "destination": TRUNK, "offer": offer(host="198.51.100.7", port=20000, session_id=7, version=7), "rtp_host": "198.51.100.7",
        "rtp_port": 20000, "session_id": 7, "ring_timeout_ms": ring_timeout_ms,
    }  # fmt: skip
    return Invitation(**(fields | overrides))  # type: ignore[arg-type]


def requests(out: list[Outgoing]) -> list[SipRequest]:
    parsed = [parse_message(o.data) for o in out]
    assert all(isinstance(p, SipRequest) for p in parsed)
    return parsed  # type: ignore[return-value]


def sent(client: SipUac) -> list[SipRequest]:
    return requests(client.datagrams_to_send())


def reply(request: SipRequest, status: int, *headers: tuple[str, str], tag: str | None = "far1", body: str = "") -> SipResponse:
    response = SipResponse(status=status, reason={180: "Ringing", 183: "Session Progress", 200: "OK"}.get(status, "X"))
    for name in ("Via", "From", "Call-ID", "CSeq"):
        response.add(name, request.header(name) or "")
    response.add("To", (request.header("To") or "") + (f";tag={tag}" if tag and status > 100 else ""))
    for name, value in headers:
        response.add(name, value)
    if body:
        response.add("Content-Type", "application/sdp")
        response.body = body.encode()
    return response


def events_of(client: SipUac) -> list[UacEvent]:
    return client.events()


def answered(client: SipUac, invite: SipRequest, now_ms: int, *headers: tuple[str, str]) -> DialAnswered:
    ok = reply(invite, 200, ("Contact", f"<sip:far@{FAR_END[0]}:{FAR_END[1]}>"), *headers, body=SDP_ANSWER)
    assert client.receive_response(ok, TRUNK, now_ms)
    (event,) = client.events()
    assert isinstance(event, DialAnswered)
    return event


def test_the_invite_carries_our_offer_and_is_retransmitted_until_timer_b() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    assert invite.method == "INVITE" and invite.uri == "sip:+15551230000@trunk.example.com"
    assert header_param(invite.header("From") or "", "tag") and header_param(invite.header("To") or "", "tag") is None
    assert invite.media_type == "application/sdp" and b"m=audio 20000 RTP/AVP 0 8 9 101" in invite.body
    assert invite.header("Require") is None and "100rel" not in (invite.header("Supported") or "")
    times = []
    now = 0
    while (due := client.next_deadline_ms()) is not None and not client.events():
        now = due
        client.tick(now)
        if client.datagrams_to_send():
            times.append(now)
        if now >= TIMEOUT_MS:
            break
    # Timer A doubles without the T2 cap: 0.5, 1.5, 3.5, 7.5, 15.5, 31.5 s
    assert times == [T1_MS, 3 * T1_MS, 7 * T1_MS, 15 * T1_MS, 31 * T1_MS, 63 * T1_MS]
    client.tick(TIMEOUT_MS)
    assert client.events() == [DialEnded("c1", 408, "no response from the trunk", "timeout")]


def test_ringing_then_answer_acks_end_to_end_and_hands_the_dialog_to_the_uas() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    assert client.receive_response(reply(invite, 100, tag=None), TRUNK, 10)
    assert client.events() == []
    client.tick(2 * T1_MS)
    assert client.datagrams_to_send() == []  # a provisional response stops Timer A
    client.receive_response(reply(invite, 180), TRUNK, 100)
    client.receive_response(reply(invite, 180), TRUNK, 150)  # told once
    assert client.events() == [Provisional("c1", 180, None)]
    rr = ("Record-Route", "<sip:192.0.2.10;lr>")
    event = answered(client, invite, 2000, rr, ("Record-Route", "<sip:10.0.0.1;lr>"))
    assert event.choice is not None and event.choice.encoding.value == "pcma" and event.choice.remote_port == 40000
    assert not event.canceled
    (ack,) = sent(client)
    assert ack.method == "ACK" and ack.uri == f"sip:far@{FAR_END[0]}:{FAR_END[1]}"
    assert ack.branch != invite.branch and ack.cseq == (1, "ACK")
    assert ack.headers_all("Route") == ["<sip:10.0.0.1;lr>", "<sip:192.0.2.10;lr>"]  # the Record-Route reversed
    # the 2xx again (our ACK lost): the same ACK again
    client.receive_response(reply(invite, 200, ("Contact", "<sip:far@192.0.2.44:5080>"), body=SDP_ANSWER), TRUNK, 2500)
    (again,) = sent(client)
    assert again.branch == ack.branch
    # the UAS serves the dialog from now on: the far end's BYE is matched and answered
    uas = SipUas(UasConfig(host="198.51.100.7", port=5060))
    uas.adopt(event.dialog)
    bye = SipRequest(method="BYE", uri="sip:callbridge@198.51.100.7:5060")
    bye.add("Via", "SIP/2.0/UDP 192.0.2.10:5060;branch=z9hG4bKbye1")
    bye.add("From", ack.header("To") or "")
    bye.add("To", ack.header("From") or "")
    bye.add("Call-ID", "c1")
    bye.add("CSeq", "5 BYE")
    uas.receive_datagram(bye.serialize(), TRUNK, 3000)
    (ok,) = [parse_message(o.data) for o in uas.datagrams_to_send()]
    assert isinstance(ok, SipResponse) and ok.status == 200
    assert uas.events() == [CallEnded("c1", "bye")]


def test_our_bye_in_an_adopted_dialog_goes_through_the_route_set_from_our_tag() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    event = answered(client, invite, 500, ("Record-Route", "<sip:192.0.2.10;lr>"))
    (ack,) = sent(client)
    uas = SipUas(UasConfig(host="198.51.100.7", port=5060))
    uas.adopt(event.dialog)
    uas.hang_up("c1", 1000)
    (out,) = uas.datagrams_to_send()
    bye = parse_message(out.data)
    assert isinstance(bye, SipRequest) and bye.method == "BYE" and out.address == TRUNK
    assert bye.header("From") == ack.header("From") and bye.header("To") == ack.header("To")
    assert bye.cseq == (2, "BYE") and bye.headers_all("Route") == ["<sip:192.0.2.10;lr>"]
    assert uri_of(bye.uri) == f"sip:far@{FAR_END[0]}:{FAR_END[1]}"


def test_without_a_route_set_the_dialog_talks_to_the_remote_target() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    event = answered(client, invite, 500)
    assert event.dialog.source == FAR_END
    (ack,) = client.datagrams_to_send()
    assert ack.address == FAR_END


@pytest.mark.parametrize(("status", "cause"), [(486, "rejected"), (603, "rejected"), (480, "rejected"), (404, "rejected")])
def test_a_final_refusal_is_acked_on_the_invite_branch_and_ends_the_dial(status: int, cause: str) -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    client.receive_response(reply(invite, 180), TRUNK, 50)
    client.events()
    refusal = reply(invite, status)
    client.receive_response(refusal, TRUNK, 100)
    (ack,) = sent(client)
    assert ack.method == "ACK" and ack.branch == invite.branch and ack.uri == invite.uri
    assert header_param(ack.header("To") or "", "tag") == "far1"
    assert client.events() == [DialEnded("c1", status, "X", cause)]  # type: ignore[list-item]
    client.receive_response(refusal, TRUNK, 600)  # retransmitted: ACKed again, nothing new told
    assert [r.method for r in sent(client)] == ["ACK"] and client.events() == []
    client.tick(100 + TIMEOUT_MS)
    assert not client.receive_response(refusal, TRUNK, 100 + TIMEOUT_MS)  # forgotten


def test_a_digest_challenge_is_answered_once_per_nonce() -> None:
    client = uac(username="trunkuser", password="pw")
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    challenge = 'Digest realm="trunk", nonce="n1", algorithm=MD5, qop="auth"'
    client.receive_response(reply(invite, 407, ("Proxy-Authenticate", challenge)), TRUNK, 20)
    ack, again = sent(client)
    assert ack.method == "ACK" and ack.branch == invite.branch
    assert again.method == "INVITE" and again.cseq == (2, "INVITE") and again.branch != invite.branch
    assert again.call_id == invite.call_id and again.header("From") == invite.header("From")
    credentials = again.header("Proxy-Authorization") or ""
    parsed = parse_challenge(challenge)
    assert parsed is not None
    cnonce = header_param("x;" + credentials.replace(", ", ";").split(" ", 1)[1], "cnonce")
    expected = authorization(parsed, method="INVITE", uri=invite.uri, username="trunkuser", password="pw", cnonce=cnonce or "", nonce_count=1)
    assert credentials == expected
    assert client.events() == []
    # a late answer to the first INVITE is not taken for the second's
    assert client.receive_response(reply(invite, 180), TRUNK, 30) and client.events() == []
    client.receive_response(reply(again, 407, ("Proxy-Authenticate", challenge)), TRUNK, 40)  # the same nonce: refused
    assert [r.method for r in sent(client)] == ["ACK"]
    assert client.events() == [DialEnded("c1", 407, "X", "auth_rejected")]


def test_a_challenge_without_credentials_ends_the_dial() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    client.receive_response(reply(invite, 401, ("WWW-Authenticate", 'Digest realm="t", nonce="n"')), TRUNK, 20)
    assert client.events() == [DialEnded("c1", 401, "X", "auth_rejected")]


def test_cancel_waits_for_a_provisional_response_then_the_487_ends_the_dial() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    client.cancel("c1", 100)
    assert client.datagrams_to_send() == []  # §9.1: not before a provisional response
    client.receive_response(reply(invite, 180), TRUNK, 200)
    assert client.events() == [Provisional("c1", 180, None)]
    (cancel,) = sent(client)
    assert cancel.method == "CANCEL" and cancel.branch == invite.branch and cancel.cseq == (1, "CANCEL")
    assert header_param(cancel.header("To") or "", "tag") is None and cancel.uri == invite.uri
    client.tick(200 + T1_MS)
    assert [r.method for r in sent(client)] == ["CANCEL"]  # Timer E
    assert client.receive_response(reply(cancel, 200), TRUNK, 800)
    client.tick(200 + 3 * T1_MS)
    assert client.datagrams_to_send() == []
    client.receive_response(reply(invite, 487), TRUNK, 900)
    assert [r.method for r in sent(client)] == ["ACK"]
    assert client.events() == [DialEnded("c1", 487, "X", "canceled")]


def test_the_ring_timeout_cancels_and_a_missing_487_ends_the_dial_by_itself() -> None:
    client = uac()
    client.invite(invitation(ring_timeout_ms=10_000), 0)
    (invite,) = sent(client)
    client.receive_response(reply(invite, 183, body=SDP_ANSWER), TRUNK, 100)
    (progress,) = client.events()
    assert isinstance(progress, Provisional) and progress.early is not None and progress.early.remote_port == 40000
    assert client.next_deadline_ms() == 10_000
    client.tick(10_000)
    (cancel,) = sent(client)
    assert cancel.method == "CANCEL"
    client.receive_response(reply(cancel, 200), TRUNK, 10_050)
    client.tick(10_000 + TIMEOUT_MS)
    assert client.events() == [DialEnded("c1", 487, "no final response after our CANCEL", "ring_timeout")]


def test_a_2xx_crossing_our_cancel_is_a_call_to_end() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    client.receive_response(reply(invite, 180), TRUNK, 100)
    client.cancel("c1", 200)
    client.events()
    client.datagrams_to_send()
    event = answered(client, invite, 250)
    assert event.canceled and [r.method for r in sent(client)] == ["ACK"]


def test_a_2xx_from_another_fork_is_acked_and_ended() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    answered(client, invite, 100)
    client.datagrams_to_send()
    other = reply(invite, 200, ("Contact", "<sip:fork2@192.0.2.45:5090>"), tag="far2", body=SDP_ANSWER)
    client.receive_response(other, TRUNK, 150)
    ack, bye = sent(client)
    assert (ack.method, bye.method) == ("ACK", "BYE")
    assert header_param(bye.header("To") or "", "tag") == "far2" and bye.uri == "sip:fork2@192.0.2.45:5090"
    assert client.events() == []


def test_the_answer_comes_from_the_183_when_the_2xx_has_none() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    client.receive_response(reply(invite, 183, body=SDP_ANSWER), TRUNK, 100)
    client.events()
    assert client.receive_response(reply(invite, 200, ("Contact", "<sip:far@192.0.2.44:5080>")), TRUNK, 300)
    (event,) = client.events()
    assert isinstance(event, DialAnswered) and event.choice is not None and event.choice.remote_port == 40000


def test_an_answer_that_is_not_to_our_offer_is_none() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    g729 = SDP_ANSWER.replace("RTP/AVP 8 101", "RTP/AVP 18").replace("a=rtpmap:8 PCMA/8000", "a=rtpmap:18 G729/8000")
    client.receive_response(reply(invite, 200, ("Contact", "<sip:far@192.0.2.44:5080>"), body=g729), TRUNK, 100)
    (event,) = client.events()
    assert isinstance(event, DialAnswered) and event.choice is None


def test_responses_that_are_not_ours_are_left_alone() -> None:
    client = uac()
    client.invite(invitation(), 0)
    (invite,) = sent(client)
    bye_answer = reply(invite, 200)
    bye_answer.set("CSeq", "2 BYE")
    assert not client.receive_response(bye_answer, TRUNK, 10)  # a BYE's: the UAS's
    stranger = reply(invite, 200)
    stranger.set("Call-ID", "someone-else")
    assert not client.receive_response(stranger, TRUNK, 10)
    with pytest.raises(ValueError):
        client.invite(invitation(), 20)
    assert client.awaits(TRUNK) and not client.awaits(("203.0.113.9", 5060))  # a stranger's datagrams go to the UAS


def test_an_srtp_offer_takes_only_an_srtp_answer_with_the_key_it_carries() -> None:
    """A dial whose offer is SRTP (``Invitation.srtp_key``): the 200's answer in kind gives the call its keys (ours,
    and the far end's from its crypto line); a plain answer to it is none (the call is ended with our BYE)."""
    ours, theirs = bytes(range(30)), bytes(range(30, 60))
    line = f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(theirs).decode()}\r\n"
    srtp_answer = SDP_ANSWER.replace("RTP/AVP", "RTP/SAVP") + line
    for body, keyed in ((srtp_answer, True), (SDP_ANSWER, False)):
        client = uac()
        srtp_offer = offer(host="198.51.100.7", port=20000, session_id=7, version=7, srtp_key=ours)
        client.invite(invitation(offer=srtp_offer, srtp_key=ours), 0)
        (invite,) = sent(client)
        assert b"RTP/SAVP" in invite.body
        client.receive_response(reply(invite, 200, ("Contact", "<sip:far@192.0.2.44:5080>"), body=body), TRUNK, 100)
        (event,) = client.events()
        assert isinstance(event, DialAnswered)
        if keyed:
            assert event.choice is not None and event.choice.srtp is not None
            assert (event.choice.srtp.local_key, event.choice.srtp.remote_key) == (ours, theirs)
        else:
            assert event.choice is None
