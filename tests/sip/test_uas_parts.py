"""The UAS's parts on their own: what it writes (``sip/uas_messages.py``: responses kept for retransmissions, a
non-2xx INVITE final until its ACK, our in-dialog requests) and whether it takes a new INVITE
(``sip/invite_offer.py``: who may call, what the INVITE requires and offers), and an INFO's digits."""

from __future__ import annotations

import ipaddress

import pytest

from callbridge.sip.dialog_state import Dialog, DialogState, UasConfig
from callbridge.sip.invite_offer import Admission, Refusal, read_offer
from callbridge.sip.message import SipRequest, dtmf_relay_digits, parse_message
from callbridge.sip.sdp import MediaChoice
from callbridge.sip.transaction import T1_MS, TIMEOUT_MS, Outgoing
from callbridge.sip.uas_messages import ServerTransactions, in_dialog_request, refer_request

pytestmark = pytest.mark.core

PEER = ("10.0.0.1", 5070)
SDP = "v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\nm=audio 30000 RTP/AVP 0\r\n"
CONFIG = UasConfig(host="127.0.0.1", port=5060, allowed_networks=(ipaddress.ip_network("10.0.0.0/8"),))


def invite(*headers: tuple[str, str], body: str = SDP, content_type: str = "application/sdp") -> SipRequest:
    lines = [
        "INVITE sip:agent@127.0.0.1 SIP/2.0",
        "Via: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bKinv;rport",
        "From: <sip:alice@10.0.0.1>;tag=alice",
        "To: <sip:agent@127.0.0.1>",
        "Call-ID: c1",
        "CSeq: 1 INVITE",
        "Contact: <sip:alice@10.0.0.1:5070>",
        "Record-Route: <sip:proxy.example;lr>",
        *(f"{name}: {value}" for name, value in headers),
    ]
    if body:
        lines.append(f"Content-Type: {content_type}")
    lines.append(f"Content-Length: {len(body.encode())}")
    message = parse_message(("\r\n".join(lines) + "\r\n\r\n" + body).encode())
    assert isinstance(message, SipRequest)
    return message


class TestServerTransactions:
    def test_a_response_goes_back_to_the_source_and_is_kept_for_the_retransmitted_request(self) -> None:
        out: list[Outgoing] = []
        responses = ServerTransactions(CONFIG, out)
        request = invite()
        sent = responses.respond(request, PEER, 180, 0, to_tag="ours")
        assert out == [sent] and sent.address == PEER  # rport: to the source port
        ringing = parse_message(sent.data)
        assert "rport=5070" in (ringing.header("Via") or "") and "tag=ours" in (ringing.header("To") or "")
        assert responses.cached(request) is sent
        assert responses.deadlines() == [TIMEOUT_MS]
        responses.tick(TIMEOUT_MS, lambda retransmit, now_ms: None)
        assert responses.cached(request) is None and responses.deadlines() == []

    def test_a_non_2xx_final_is_resent_until_its_ack_and_names_its_call(self) -> None:
        out: list[Outgoing] = []
        responses = ServerTransactions(CONFIG, out)
        responses.final(invite(), PEER, 486, 0)
        assert list(responses.invite_branches.values()) == ["c1"] and len(responses.final_retransmits) == 1
        resent: list[int] = []
        responses.tick(T1_MS, lambda retransmit, now_ms: resent.append(now_ms))
        assert resent == [T1_MS]
        responses.tick(64 * T1_MS, lambda retransmit, now_ms: None)  # no ACK by 64·T1: given up
        assert responses.final_retransmits == {} and responses.invite_branches == {}


def test_our_requests_in_the_dialog_go_to_the_remote_target_with_the_next_cseq() -> None:
    dialog = Dialog(call_id="c1", state=DialogState.CONFIRMED, invite=invite(), source=PEER, local_tag="ours", remote_cseq=1,
                    choice=_choice(), invite_branch="z9hG4bKinv")  # fmt: skip
    bye = in_dialog_request(CONFIG, dialog, "BYE")
    assert bye.uri == "sip:alice@10.0.0.1:5070" and bye.header("CSeq") == f"{dialog.local_cseq} BYE"
    assert "tag=ours" in (bye.header("From") or "") and bye.headers_all("Route") == ["<sip:proxy.example;lr>"]
    refer = refer_request(CONFIG, dialog, "+15550100")
    assert refer.header("CSeq") == f"{dialog.local_cseq} REFER" and "15550100" in (refer.header("Refer-To") or "")


def _choice() -> MediaChoice:
    offered = read_offer(invite(), PEER)
    assert isinstance(offered, MediaChoice)
    return offered


class TestInviteOffer:
    def test_an_address_in_the_allowed_networks_is_admitted(self) -> None:
        assert Admission(CONFIG).refusal(invite(), PEER) is None

    def test_elsewhere_a_challenge_with_credentials_set_else_forbidden(self) -> None:
        assert Admission(CONFIG).refusal(invite(), ("192.0.2.1", 5060)) == Refusal(403, [])
        with_credentials = UasConfig(host="127.0.0.1", port=5060, username="trunk", password="secret")
        refusal = Admission(with_credentials).refusal(invite(), ("192.0.2.1", 5060))
        assert refusal is not None and refusal.status == 401 and refusal.extra[0][0] == "WWW-Authenticate"

    @pytest.mark.parametrize(
        ("headers", "body", "content_type", "status"),
        [
            ((("Require", "timer"),), SDP, "application/sdp", 420),
            ((), "hello", "text/plain", 415),
            ((), SDP.replace("RTP/AVP 0", "RTP/AVP 96"), "application/sdp", 488),
        ],
    )
    def test_what_we_cannot_take_is_refused(self, headers: tuple[tuple[str, str], ...], body: str, content_type: str, status: int) -> None:
        offered = read_offer(invite(*headers, body=body, content_type=content_type), PEER)
        assert isinstance(offered, Refusal) and offered.status == status

    def test_a_delayed_offer_gets_a_placeholder_until_the_answer(self) -> None:
        offered = read_offer(invite(body=""), PEER)
        assert isinstance(offered, MediaChoice) and offered.remote_port == 0 and offered.remote_host == PEER[0]


def test_an_infos_dtmf_relay_digits() -> None:
    info = invite(body="Signal=5\r\nDuration=160\r\nSignal=Z\r\n", content_type="application/dtmf-relay")
    assert dtmf_relay_digits(info) == ["5"]
    assert dtmf_relay_digits(invite()) == []
