"""SRTP with SDES keys (#43): what an offer's ``a=crypto`` lines give, how the answer carries our key, what each
``sip.media_encryption`` takes and refuses, and the packets both ways through libsrtp (``callbridge/sip/srtp.py``)."""

from __future__ import annotations

import base64
import secrets

import pytest

from callbridge.config import Settings
from callbridge.sip.invite_offer import Refusal, read_offer
from callbridge.sip.message import SipRequest
from callbridge.sip.sdp import answer, choose, read_answer
from callbridge.sip.sdp import offer as sdp_offer
from callbridge.sip.srtp import KEY_BYTES, SrtpKeys, SrtpSession, parse_crypto

pytestmark = pytest.mark.core

KEY = bytes(range(KEY_BYTES))
INLINE = base64.b64encode(KEY).decode()


def offer(*media: str) -> str:
    return "\r\n".join(["v=0", "o=- 1 1 IN IP4 192.0.2.7", "s=-", "c=IN IP4 192.0.2.7", "t=0 0", *media]) + "\r\n"


SAVP = (
    "m=audio 40000 RTP/SAVP 0 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
    f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}|2^20\r\na=crypto:2 AES_CM_128_HMAC_SHA1_32 inline:{INLINE}"
)
AVP = "m=audio 40002 RTP/AVP 8\r\na=rtpmap:8 PCMA/8000"


def test_an_srtp_offer_is_answered_in_kind_with_our_key_under_its_tag() -> None:
    choice = choose(offer(SAVP))
    assert choice is not None and choice.srtp is not None and choice.proto == "RTP/SAVP"
    keys = choice.srtp
    assert (keys.suite, keys.tag, keys.remote_key) == ("AES_CM_128_HMAC_SHA1_80", 1, KEY)  # the offer's first
    assert len(keys.local_key) == KEY_BYTES and keys.local_key != KEY
    sdp = answer(choice, host="198.51.100.1", port=30000, session_id=1, version=1)
    assert "m=audio 30000 RTP/SAVP 0 101\r\n" in sdp
    (line,) = [x for x in sdp.split("\r\n") if x.startswith("a=crypto:")]
    assert line == f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(keys.local_key).decode()}"


@pytest.mark.parametrize(
    ("encryption", "media", "taken"),
    [
        ("optional", (SAVP, AVP), "RTP/SAVP"),  # SRTP first, plain as the fallback: SRTP where we may
        ("optional", (AVP,), "RTP/AVP"),
        ("required", (AVP, SAVP), "RTP/SAVP"),  # the plain stream passed over
        ("required", (AVP,), None),
        ("none", (SAVP, AVP), "RTP/AVP"),
        ("none", (SAVP,), None),
    ],
)
def test_what_each_setting_takes(encryption: str, media: tuple[str, ...], taken: str | None) -> None:
    choice = choose(offer(*media), encryption=encryption)  # type: ignore[arg-type]
    assert (choice.proto if choice else None) == taken
    assert choice is None or (choice.srtp is not None) == (taken == "RTP/SAVP")


@pytest.mark.parametrize(
    "value",
    [
        f"1 AES_256_CM_HMAC_SHA1_80 inline:{INLINE}",  # a suite we do not speak
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}|2^20|1:4",  # an MKI
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE};inline:{INLINE}",  # two keys
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE} UNENCRYPTED_SRTP",  # session parameters
        "1 AES_CM_128_HMAC_SHA1_80 inline:c2hvcnQ=",  # a key that is not 30 bytes
        "1 AES_CM_128_HMAC_SHA1_80 inline:!!notbase64!!",
        f"x AES_CM_128_HMAC_SHA1_80 inline:{INLINE}",
    ],
)
def test_a_crypto_line_we_cannot_take_is_passed_over(value: str) -> None:
    assert parse_crypto(value) is None
    only_that = offer(f"m=audio 40000 RTP/SAVP 0\r\na=rtpmap:0 PCMU/8000\r\na=crypto:{value}")
    assert choose(only_that) is None and choose(offer(f"m=audio 40000 RTP/SAVP 0\r\na=crypto:{value}\r\na=crypto:2 AES_CM_128_HMAC_SHA1_32 inline:{INLINE}")) is not None


def test_a_reinvite_keeps_our_key() -> None:
    first = choose(offer(SAVP))
    assert first is not None and first.srtp is not None
    again = choose(offer(SAVP), local_key=first.srtp.local_key)
    assert again is not None and again.srtp == first.srtp


def _invite(body: str) -> SipRequest:
    request = SipRequest(method="INVITE", uri="sip:agent@198.51.100.1")
    if body:
        request.add("Content-Type", "application/sdp")
        request.body = body.encode()
    return request


def test_with_srtp_required_a_plain_offer_is_refused_488_saying_why_and_a_delayed_one_is_taken() -> None:
    refused = read_offer(_invite(offer(AVP)), ("192.0.2.7", 5060), "required")
    assert isinstance(refused, Refusal) and refused.status == 488
    assert "SRTP" in dict(refused.extra)["Warning"]
    assert not isinstance(read_offer(_invite(offer(SAVP)), ("192.0.2.7", 5060), "required"), Refusal)
    assert not isinstance(read_offer(_invite(""), ("192.0.2.7", 5060), "required"), Refusal)  # our 200 offers SRTP


def test_a_delayed_offer_under_required_gets_our_srtp_offer_and_takes_only_an_answer_in_kind() -> None:
    """No SDP in the INVITE, ``media_encryption = "required"``: our 200 offers ``RTP/SAVP`` with one crypto line of a
    new key of ours; an ACK answering in kind gives the call SRTP with both keys; a plain answer ends it (our BYE)."""
    from callbridge.sip.dialog import OfferAnswered
    from tests.sip.test_dialog import PEER, SDP, request, responses, uas

    for in_kind in (True, False):
        core = uas(media_encryption="required")
        core.receive_datagram(request("INVITE"), PEER, 0)
        core.datagrams_to_send()
        core.events()
        core.accept("c1", "127.0.0.1", 40000, 0)
        (ok,) = responses(core)
        ours = ok.body.decode()
        assert "m=audio 40000 RTP/SAVP 0 8 9 101\r\n" in ours and ours.count("a=crypto:") == 1
        key = core.dialogs["c1"].offer_srtp_key
        assert key is not None and parse_crypto(ours.split("a=crypto:")[1].split("\r\n")[0]) is not None
        theirs = secrets.token_bytes(KEY_BYTES)
        plain = SDP.replace("0 101", "8 101").replace("a=rtpmap:101", "a=rtpmap:8 PCMA/8000\r\na=rtpmap:101")
        kind = plain.replace("RTP/AVP", "RTP/SAVP") + f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(theirs).decode()}\r\n"
        tag = ok.header("To").split("tag=")[1]  # type: ignore[union-attr]
        core.receive_datagram(request("ACK", branch="z9hG4bKack", to_tag=tag, body=kind if in_kind else plain), PEER, 100)
        events = core.events()
        if in_kind:
            answered = events[0]
            assert isinstance(answered, OfferAnswered) and (srtp := answered.choice.srtp) is not None, events
            assert (srtp.local_key, srtp.remote_key) == (key, theirs)
        else:
            assert [type(event).__name__ for event in events] == ["CallEnded"], events


def _rtp(seq: int) -> bytes:
    return bytes([0x80, 0, seq >> 8, seq & 0xFF]) + (160 * seq).to_bytes(4, "big") + b"\x00\x00\x30\x39" + b"\xff" * 160


def test_packets_both_ways_and_what_is_refused() -> None:
    """Our session protects with our key, the peer's (its keys mirrored) unprotects; a replayed or tampered packet,
    or one under another key, is None and counted."""
    keys = SrtpKeys("AES_CM_128_HMAC_SHA1_80", 1, secrets.token_bytes(KEY_BYTES), secrets.token_bytes(KEY_BYTES))
    ours, theirs = SrtpSession(keys), SrtpSession(SrtpKeys(keys.suite, 1, keys.local_key, keys.remote_key))
    sent = ours.protect(_rtp(1))
    assert len(sent) == len(_rtp(1)) + 10 and sent[12:] != _rtp(1)[12:]  # encrypted, a 80-bit tag
    assert theirs.unprotect(sent) == _rtp(1)
    assert theirs.unprotect(sent) is None  # a replay
    tampered = bytearray(ours.protect(_rtp(2)))
    tampered[20] ^= 1
    assert theirs.unprotect(bytes(tampered)) is None
    assert SrtpSession(SrtpKeys(keys.suite, 1, secrets.token_bytes(KEY_BYTES), keys.local_key)).unprotect(ours.protect(_rtp(3))) is None
    assert theirs.refused == 2
    report = bytes([0x80, 200, 0, 6]) + b"\x00\x00\x30\x39" + bytes(20)
    assert ours.unprotect_rtcp(theirs.protect_rtcp(report)) == report and ours.unprotect_rtcp(report) is None


def test_a_new_key_of_the_peers_keeps_our_outbound_context() -> None:
    """A re-INVITE with a new key of the peer's: what it sends under the new key is read, what we send goes on in
    the same context (a fresh one would restart its rollover counter where the peer's has moved on)."""
    keys = SrtpKeys("AES_CM_128_HMAC_SHA1_80", 1, secrets.token_bytes(KEY_BYTES), secrets.token_bytes(KEY_BYTES))
    ours = SrtpSession(keys)
    peer_out = SrtpSession(SrtpKeys(keys.suite, 1, keys.local_key, keys.remote_key))
    assert peer_out.unprotect(ours.protect(_rtp(1))) == _rtp(1)
    new_key = secrets.token_bytes(KEY_BYTES)
    ours.follow(SrtpKeys(keys.suite, 1, new_key, keys.local_key))
    assert ours.unprotect(SrtpSession(SrtpKeys(keys.suite, 1, keys.local_key, new_key)).protect(_rtp(5))) == _rtp(5)
    assert peer_out.unprotect(ours.protect(_rtp(2))) == _rtp(2)  # our context went on
    with pytest.raises(ValueError):
        ours.follow(SrtpKeys(keys.suite, 1, new_key, secrets.token_bytes(KEY_BYTES)))


def test_a_placed_calls_srtp_offer_and_the_answers_it_takes() -> None:
    """``sip.media_encryption = "required"``: a call we place offers ``RTP/SAVP`` with one crypto line (tag 1,
    ``AES_CM_128_HMAC_SHA1_80``, our key); the answer must take it in kind, and its key is then what we unprotect
    with. Plain RTP, another tag or suite, or no key in the answer: not an answer to our offer (the call is ended)."""
    ours = secrets.token_bytes(KEY_BYTES)
    sdp = sdp_offer(host="203.0.113.10", port=40000, session_id=1, version=1, srtp_key=ours)
    assert "m=audio 40000 RTP/SAVP 0 8 9 101\r\n" in sdp
    assert f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(ours).decode()}\r\n" in sdp
    answered = offer(f"m=audio 41000 RTP/SAVP 0 101\r\na=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}")
    choice = read_answer(answered, srtp_key=ours)
    assert choice is not None and choice.srtp == SrtpKeys("AES_CM_128_HMAC_SHA1_80", 1, KEY, ours)
    assert choice.proto == "RTP/SAVP"
    assert read_answer(offer("m=audio 41000 RTP/AVP 0 101"), srtp_key=ours) is None
    assert read_answer(answered.replace("crypto:1", "crypto:2"), srtp_key=ours) is None
    assert read_answer(answered.replace("SHA1_80", "SHA1_32"), srtp_key=ours) is None
    assert read_answer(offer("m=audio 41000 RTP/SAVP 0 101"), srtp_key=ours) is None
    assert read_answer(answered) is None  # a plain offer's answer in SRTP: not ours either


@pytest.mark.core
@pytest.mark.parametrize(("spelling", "taken"), [("disable", "none"), ("allow", "optional"), ("require", "required"), ("required", "required")])
def test_media_encryption_takes_the_other_usual_spellings(spelling: str, taken: str) -> None:
    assert Settings.model_validate({"sip": {"media_encryption": spelling}}).sip.media_encryption == taken
