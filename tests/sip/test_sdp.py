"""SDP offer/answer (RFC 3264 §6, §8.4)."""

from __future__ import annotations

import pytest

from callbridge.carriers.sip.settings import SipSettings
from callbridge.codecs import AudioEncoding
from callbridge.sip.invite_offer import Refusal, read_offer
from callbridge.sip.message import SipRequest
from callbridge.sip.sdp import Direction, SdpError, answer, choose, offer, read_answer

pytestmark = pytest.mark.core

TRUNK_OFFER = """v=0
o=- 1234 1 IN IP4 198.51.100.7
s=-
c=IN IP4 198.51.100.7
t=0 0
m=audio 30000 RTP/AVP 18 8 0 101
a=rtpmap:18 G729/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:0 PCMU/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-16
a=ptime:30
a=sendrecv
"""


def test_picks_the_first_g711_offered_and_telephone_event() -> None:
    choice = choose(TRUNK_OFFER)
    assert choice is not None
    assert (choice.encoding, choice.payload_type, choice.dtmf_payload_type) == (AudioEncoding.PCMA, 8, 101)
    assert (choice.remote_host, choice.remote_port, choice.ptime_ms) == ("198.51.100.7", 30000, 30)
    assert choice.direction is Direction.SENDRECV


def test_answer_has_exactly_one_codec_with_the_offers_payload_types() -> None:
    choice = choose(TRUNK_OFFER.replace("101", "96"))
    assert choice is not None
    text = answer(choice, host="203.0.113.10", port=40000, session_id=7, version=7)
    lines = text.split("\r\n")
    assert "m=audio 40000 RTP/AVP 8 96" in lines
    assert "a=rtpmap:8 PCMA/8000" in lines and "a=rtpmap:96 telephone-event/8000" in lines
    assert "c=IN IP4 203.0.113.10" in lines and "o=callbridge 7 7 IN IP4 203.0.113.10" in lines
    assert not any("PCMU" in line or "G729" in line for line in lines)
    assert text.endswith("\r\n")


def test_nothing_fits_and_second_stream_rejected_with_port_zero() -> None:
    assert choose(TRUNK_OFFER.replace("m=audio 30000 RTP/AVP 18 8 0 101", "m=audio 30000 RTP/AVP 18")) is None
    two = TRUNK_OFFER.replace("m=audio 30000", "m=video 30002 RTP/AVP 31\nm=audio 30000")
    choice = choose(two)
    assert choice is not None and choice.media_index == 1
    lines = answer(choice, host="127.0.0.1", port=4000, session_id=1, version=1).split("\r\n")
    m_lines = [line for line in lines if line.startswith("m=")]
    assert m_lines == ["m=video 0 RTP/AVP 31", "m=audio 4000 RTP/AVP 8 101"]


@pytest.mark.parametrize(
    ("offered", "answered"),
    [("sendonly", Direction.RECVONLY), ("recvonly", Direction.SENDONLY), ("inactive", Direction.INACTIVE), ("sendrecv", Direction.SENDRECV)],
)
def test_direction_answers(offered: str, answered: Direction) -> None:
    choice = choose(TRUNK_OFFER.replace("a=sendrecv", f"a={offered}"))
    assert choice is not None and choice.direction is answered
    assert f"a={answered.value}" in answer(choice, host="127.0.0.1", port=4000, session_id=1, version=1)


def test_legacy_hold_and_static_types_without_rtpmap() -> None:
    held = choose(TRUNK_OFFER.replace("c=IN IP4 198.51.100.7", "c=IN IP4 0.0.0.0"))
    assert held is not None and held.direction is Direction.RECVONLY
    bare = choose("v=0\r\nc=IN IP4 10.0.0.9\r\nm=audio 5004 RTP/AVP 0\r\n")
    assert bare is not None and bare.encoding is AudioEncoding.PCMU and bare.dtmf_payload_type is None


@pytest.mark.parametrize("text", ["hello", "v=0\nm=audio x RTP/AVP 0\n", "v=0\nc=IN IP4 1.2.3.4\nm=audio 70000 RTP/AVP 0\n", "v=0\nc=IN IP4 pbx.example\nm=audio 4000 RTP/AVP 0\n", "v=0\nm=audio 4000 RTP/AVP 0\n", "m=audio 4000 RTP/AVP 0\n"])
def test_unreadable_sdp(text: str) -> None:
    with pytest.raises(SdpError):
        choose(text)


def test_mutated_offers_raise_only_sdp_error() -> None:
    import random

    rng = random.Random(3264)
    for _ in range(5000):
        data = list(TRUNK_OFFER)
        for _ in range(rng.randint(1, 6)):
            pos = rng.randrange(len(data))
            if rng.random() < 0.6:
                data[pos] = rng.choice("0123456789 =:/\n\r-aAcmv.")
            else:
                del data[pos : pos + rng.randint(1, 10)]
        try:
            choice = choose("".join(data))
        except SdpError:
            continue
        if choice is not None:
            assert 0 <= choice.payload_type < 128 and choice.encoding in (AudioEncoding.PCMU, AudioEncoding.PCMA)
            assert choice.dtmf_payload_type is None or 0 <= choice.dtmf_payload_type < 128
            assert 0 < choice.remote_port <= 65535
            answer(choice, host="127.0.0.1", port=4000, session_id=1, version=1)


def test_payload_types_above_127_are_ignored() -> None:
    choice = choose("v=0\r\nc=IN IP4 10.0.0.9\r\nm=audio 5004 RTP/AVP 1000 0 1001\r\na=rtpmap:1000 PCMA/8000\r\na=rtpmap:1001 telephone-event/8000\r\n")
    assert choice is not None and choice.payload_type == 0 and choice.dtmf_payload_type is None


WIDEBAND_PHONE = TRUNK_OFFER.replace("m=audio 30000 RTP/AVP 18 8 0 101", "m=audio 30000 RTP/AVP 9 0 8 101").replace(
    "a=rtpmap:18 G729/8000", "a=rtpmap:9 G722/8000"
)
"""A desk phone's offer: G.722 first, then G.711."""


def test_g722_first_in_the_offer_is_taken_and_answered_at_its_8000_hz_rtp_clock() -> None:
    choice = choose(WIDEBAND_PHONE)
    assert choice is not None and (choice.encoding, choice.payload_type) == (AudioEncoding.G722, 9)
    lines = answer(choice, host="203.0.113.10", port=40000, session_id=7, version=7).split("\r\n")
    assert "m=audio 40000 RTP/AVP 9 101" in lines and "a=rtpmap:9 G722/8000" in lines


def test_the_offers_order_decides_and_sip_codecs_leaves_out_what_it_does_not_name() -> None:
    g711_first = WIDEBAND_PHONE.replace("RTP/AVP 9 0 8 101", "RTP/AVP 0 9 8 101")
    assert (choice := choose(g711_first)) is not None and choice.encoding is AudioEncoding.PCMU
    narrow_only = (AudioEncoding.PCMU, AudioEncoding.PCMA)
    assert (choice := choose(WIDEBAND_PHONE, codecs=narrow_only)) is not None and choice.encoding is AudioEncoding.PCMU
    assert choose(WIDEBAND_PHONE.replace("RTP/AVP 9 0 8 101", "RTP/AVP 9 101"), codecs=narrow_only) is None
    dynamic = WIDEBAND_PHONE.replace("RTP/AVP 9 0 8 101", "RTP/AVP 112 0 101").replace("a=rtpmap:9 G722/8000", "a=rtpmap:112 G722/8000")
    assert (choice := choose(dynamic)) is not None and (choice.encoding, choice.payload_type) == (AudioEncoding.G722, 112)
    sixteen = dynamic.replace("a=rtpmap:112 G722/8000", "a=rtpmap:112 G722/16000")  # a clock G.722 never has
    assert (choice := choose(sixteen)) is not None and choice.encoding is AudioEncoding.PCMU


def test_our_offer_lists_sip_codecs_in_their_order_and_an_answer_must_take_one_of_them() -> None:
    ours = offer(host="203.0.113.10", port=40000, session_id=1, version=1, codecs=(AudioEncoding.G722, AudioEncoding.PCMU))
    assert "m=audio 40000 RTP/AVP 9 0 101\r\n" in ours and "a=rtpmap:9 G722/8000\r\na=rtpmap:0 PCMU/8000\r\n" in ours
    assert "m=audio 40000 RTP/AVP 0 8 9 101\r\n" in offer(host="203.0.113.10", port=40000, session_id=1, version=1)
    took_g722 = WIDEBAND_PHONE.replace("RTP/AVP 9 0 8 101", "RTP/AVP 9 101")
    assert (choice := read_answer(took_g722, (AudioEncoding.G722, AudioEncoding.PCMU))) is not None and choice.encoding is AudioEncoding.G722
    assert read_answer(took_g722, (AudioEncoding.PCMU, AudioEncoding.PCMA)) is None  # we did not offer it


def test_sip_codecs_names_each_codec_once_of_the_three_and_an_offer_of_none_is_refused_naming_them() -> None:
    assert SipSettings().codecs == ["PCMU", "PCMA", "G722"]
    for wrong in (["G722", "G722"], ["G729"], []):
        with pytest.raises(ValueError, match="codecs"):
            SipSettings(codecs=wrong)
    body = TRUNK_OFFER.replace(" 8 0 101", " 101").encode()
    invite = SipRequest(headers=[("Content-Type", "application/sdp")], body=body, method="INVITE", uri="sip:agent@127.0.0.1")
    refusal = read_offer(invite, ("198.51.100.7", 5060), "optional", (AudioEncoding.PCMU, AudioEncoding.G722))
    assert isinstance(refusal, Refusal) and refusal.status == 488
    assert refusal.extra == [("Warning", '304 callbridge "PCMU or G722 audio required"')]


SOFTPHONE_OPUS = TRUNK_OFFER.replace("m=audio 30000 RTP/AVP 18 8 0 101", "m=audio 30000 RTP/AVP 107 0 8 110 101").replace(
    "a=rtpmap:18 G729/8000", "a=rtpmap:107 opus/48000/2\na=fmtp:107 useinbandfec=1;stereo=1\na=rtpmap:110 telephone-event/48000"
)
"""A softphone's offer: Opus first (dynamic, at RTP's 48 kHz clock, as RFC 7587 spells it), then G.711; telephone-event
at Opus's clock and at 8000."""
WITH_OPUS = (AudioEncoding.PCMU, AudioEncoding.PCMA, AudioEncoding.G722, AudioEncoding.OPUS)


def test_opus_first_is_taken_where_sip_codecs_names_it_and_answered_as_rfc_7587_spells_it() -> None:
    assert (choice := choose(SOFTPHONE_OPUS)) is not None and choice.encoding is AudioEncoding.PCMU  # not by default
    choice = choose(SOFTPHONE_OPUS, codecs=WITH_OPUS)
    assert choice is not None and (choice.encoding, choice.payload_type, choice.clock_hz) == (AudioEncoding.OPUS, 107, 48000)
    assert (choice.dtmf_payload_type, choice.dtmf_clock_hz) == (110, 48000)  # telephone-event at the audio's clock
    lines = answer(choice, host="203.0.113.10", port=40000, session_id=7, version=7).split("\r\n")
    assert "m=audio 40000 RTP/AVP 107 110" in lines and "a=rtpmap:107 opus/48000/2" in lines
    assert "a=fmtp:107 useinbandfec=1;maxplaybackrate=16000;sprop-maxcapturerate=16000" in lines
    assert "a=rtpmap:110 telephone-event/48000" in lines
    only_8000 = SOFTPHONE_OPUS.replace("a=rtpmap:110 telephone-event/48000", "a=rtpmap:110 telephone-event/16000")
    assert (choice := choose(only_8000, codecs=WITH_OPUS)) is not None and (choice.dtmf_payload_type, choice.dtmf_clock_hz) == (101, 8000)
    at_8000 = SOFTPHONE_OPUS.replace("a=rtpmap:107 opus/48000/2", "a=rtpmap:107 opus/8000")  # not Opus as RFC 7587 has it
    assert (choice := choose(at_8000, codecs=WITH_OPUS)) is not None and choice.encoding is AudioEncoding.PCMU


def test_our_offer_with_opus_names_it_at_111_and_an_answer_must_keep_that_number() -> None:
    ours = offer(host="203.0.113.10", port=40000, session_id=1, version=1, codecs=(AudioEncoding.OPUS, AudioEncoding.PCMU))
    assert "m=audio 40000 RTP/AVP 111 0 101\r\n" in ours and "a=rtpmap:111 opus/48000/2\r\na=rtpmap:0 PCMU/8000\r\n" in ours
    assert "a=fmtp:111 useinbandfec=1;maxplaybackrate=16000;sprop-maxcapturerate=16000\r\n" in ours
    took = SOFTPHONE_OPUS.replace("RTP/AVP 107 0 8 110 101", "RTP/AVP 111 101").replace("a=rtpmap:107 ", "a=rtpmap:111 ")
    assert (choice := read_answer(took, (AudioEncoding.OPUS, AudioEncoding.PCMU))) is not None and choice.encoding is AudioEncoding.OPUS
    renumbered = took.replace("RTP/AVP 111 101", "RTP/AVP 112 101").replace("a=rtpmap:111 ", "a=rtpmap:112 ")
    assert read_answer(renumbered, (AudioEncoding.OPUS, AudioEncoding.PCMU)) is None


def test_sip_codecs_may_name_opus_and_a_refusal_spells_it_as_sdp_does() -> None:
    assert SipSettings(codecs=["opus", "PCMU"]).encodings == (AudioEncoding.OPUS, AudioEncoding.PCMU)
    body = TRUNK_OFFER.replace(" 8 0 101", " 101").encode()
    invite = SipRequest(headers=[("Content-Type", "application/sdp")], body=body, method="INVITE", uri="sip:agent@127.0.0.1")
    refusal = read_offer(invite, ("198.51.100.7", 5060), "optional", (AudioEncoding.OPUS, AudioEncoding.G722))
    assert isinstance(refusal, Refusal) and refusal.extra == [("Warning", '304 callbridge "opus or G722 audio required"')]
