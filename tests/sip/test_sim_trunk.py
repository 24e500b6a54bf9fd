"""The simulated SIP trunk (``callbridge.carriers.sip.sim``) is strict: what a real trunk would reject in the bridge's SIP,
SDP and RTP becomes a protocol warning, and only the bridge's real audio counts as the agent speaking. Cores only:
no sockets (the end-to-end runs are in ``tests/bridge/test_carrier_matrix.py``)."""

from __future__ import annotations

import asyncio
import audioop

import pytest

from callbridge.carriers.sip.sim_stream import SipConnection, SipStream, _Datagrams, _Dialog
from callbridge.carriers.sip.sim_wire import (
    SdpAnswer,
    SipReply,
    digest_authorization,
    parse_sdp_answer,
    read_sip,
    uri_target,
)
from callbridge.sim.carrier import CallResult, SimCall
from callbridge.sip.dtmf import dtmf_train, event_payload
from callbridge.sip.rtp import RtpSender, build_rtp
from callbridge.sip.srtp import SdesCrypto

pytestmark = pytest.mark.core

OK = (
    "SIP/2.0 200 OK\r\n"
    "Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKabc;rport=5070\r\n"
    "From: <sip:+15550100@127.0.0.1>;tag=ours\r\n"
    "To: <sip:agent@127.0.0.1:5060>;tag=theirs\r\n"
    "Call-ID: c1@sim\r\n"
    "CSeq: 1 INVITE\r\n"
    "Contact: <sip:callbridge@127.0.0.1:5060>\r\n"
    "Content-Type: application/sdp\r\n"
    "Content-Length: {length}\r\n\r\n{body}"
)
ANSWER = "v=0\r\no=cb 1 1 IN IP4 127.0.0.1\r\ns=cb\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 20000 RTP/AVP 0 101\r\n" \
    "a=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\na=ptime:20\r\na=sendrecv\r\n"  # fmt: skip


def ok(body: str = ANSWER, *, length: int | None = None) -> bytes:
    return OK.format(length=len(body) if length is None else length, body=body).encode()


def test_a_well_formed_answer_is_read() -> None:
    reply = read_sip(ok())
    assert isinstance(reply, SipReply)
    assert reply.status == 200 and reply.cseq == (1, "INVITE") and reply.get("contact") == "<sip:callbridge@127.0.0.1:5060>"
    assert parse_sdp_answer(reply.body, (0, 8)) == SdpAnswer("127.0.0.1", 20000, 0, 101)
    assert uri_target("sip:callbridge@127.0.0.1:5060") == ("127.0.0.1", 5060)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (ok(length=len(ANSWER) + 5), "Content-Length"),
        (ok(length=len(ANSWER) - 5), "Content-Length"),
        (ok().replace(b"Content-Length", b"X-Length"), "no content-length"),
        (ok().replace(b"\r\n", b"\n"), "CRLF"),
        (ok().replace(b"Call-ID: c1@sim\r\n", b""), "no call-id"),
        (ok().replace(b"SIP/2.0 200 OK", b"SIP/2.0 200OK"), "start line"),
        (ok().replace(b"CSeq: 1 INVITE", b"CSeq: one INVITE"), "CSeq"),
        (ok().replace(b"\r\nContact:", b"\r\n Contact:"), "header line"),
    ],
)
def test_a_malformed_message_is_a_warning(data: bytes, problem: str) -> None:
    found = read_sip(data)
    assert isinstance(found, str) and problem in found, found


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("RTP/AVP 0 101", "RTP/AVP 0 8 101"), "exactly one audio codec"),
        (("RTP/AVP 0 101", "RTP/AVP 18 101"), "exactly one audio codec"),
        (("RTP/AVP 0 101", "RTP/AVP 101 0"), "must come first"),
        (("m=audio 20000", "m=audio 0"), "m="),
        (("a=sendrecv", "a=sendonly"), "not sendrecv"),
        (("a=ptime:20", "a=ptime:30"), "ptime"),
        (("a=rtpmap:101 telephone-event/8000\r\n", ""), "rtpmap"),
        (("c=IN IP4 127.0.0.1", "c=IN IP4 bridge.example"), "c= address"),
        (("v=0\r\n", ""), "v=0"),
        (("\r\n", "\n"), "CRLF"),
    ],
)
def test_an_answer_a_trunk_would_reject_is_a_warning(change: tuple[str, str], problem: str) -> None:
    found = parse_sdp_answer(ANSWER.replace(*change).encode(), (0, 8))
    assert isinstance(found, str) and problem in found, found


def test_an_answer_to_an_opus_srtp_offer_must_be_opus_as_rfc_7587_names_it_in_srtp_with_one_key() -> None:
    ours, theirs = bytes(range(30)), bytes(range(1, 31))
    opus = ANSWER.replace("RTP/AVP 0 101", "RTP/SAVP 111 101").replace("a=rtpmap:0 PCMU/8000", "a=rtpmap:111 opus/48000/2")
    keyed = opus + SdesCrypto(1, "AES_CM_128_HMAC_SHA1_80", theirs).line() + "\r\n"
    found = parse_sdp_answer(keyed.encode(), (111,), ours)
    assert isinstance(found, SdpAnswer) and found.payload_type == 111 and found.srtp is not None
    assert (found.srtp.remote_key, found.srtp.local_key) == (theirs, ours)
    for wrong, problem in (
        (opus, "one crypto line"), (keyed.replace("RTP/SAVP", "RTP/AVP"), "m="),
        (keyed.replace("opus/48000/2", "opus/16000"), "rtpmap"), (keyed.replace("a=crypto:1", "a=crypto:2"), "tag 1"),
    ):  # fmt: skip
        refused = parse_sdp_answer(wrong.encode(), (111,), ours)
        assert isinstance(refused, str) and problem in refused, (refused, problem)
    assert "crypto line in the answer to plain RTP" in str(parse_sdp_answer((ANSWER + keyed.splitlines()[-1] + "\r\n").encode(), (0, 8)))


def test_digest_answers_the_challenge_rfc_2617() -> None:
    authorization = digest_authorization('Digest realm="cb", nonce="n1", algorithm=MD5, qop="auth"', "INVITE", "sip:a@b", "u", "p")
    assert authorization is not None and 'qop=auth' in authorization and 'nonce="n1"' in authorization
    assert digest_authorization('Basic realm="cb"', "INVITE", "sip:a@b", "u", "p") is None


class _Stream:
    """A ``SipStream`` without sockets: RTP and SIP from the bridge fed by hand."""

    def __init__(self) -> None:
        queue: asyncio.Queue[tuple[str, bytes, tuple[str, int]] | None] = asyncio.Queue()
        conn = SipConnection(_Datagrams(queue, "sip"), _Datagrams(queue, "rtp"), queue, ("127.0.0.1", 5060))
        self.result = CallResult("c1@sim")
        self.byes = 0
        dialog = _Dialog("c1@sim", "ours", "theirs", "<sip:a@b>;tag=ours", "<sip:c@d>;tag=theirs", "sip:c@d", ("127.0.0.1", 5060), [], 1)
        self.stream = SipStream(conn, SimCall("c1@sim", self.result, lambda: 0), dialog, SdpAnswer("127.0.0.1", 20000, 0, 101), b"", self.bye)
        self.sequence, self.timestamp = 1000, 5000

    def bye(self) -> None:
        self.byes += 1

    def rtp(self, payload: bytes, *, pt: int = 0, ssrc: int = 0x1234, step: int = 1) -> None:
        self.sequence += step
        self.stream.receive(build_rtp(pt, self.sequence, self.timestamp, ssrc, payload))
        self.timestamp += len(payload)


SPEECH = audioop.lin2ulaw((3000).to_bytes(2, "little", signed=True) * 160, 2)


async def test_cadence_silence_before_the_agent_speaks_is_not_agent_audio() -> None:
    fake = _Stream()
    for _ in range(5):
        fake.rtp(b"\xff" * 160)
    assert fake.stream.queue == bytearray() and not fake.stream.agent_started
    fake.rtp(SPEECH)
    fake.rtp(b"\xff" * 160)  # silence inside the agent's audio plays, but is not the agent speaking
    assert len(fake.stream.queue) == 640
    assert fake.stream.play()[1] is True and fake.stream.play()[1] is False
    assert fake.result.warnings == []


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"step": 2}, "sequence"),
        ({"ssrc": 0x9999}, "SSRC"),
        ({"pt": 8}, "payload type"),
    ],
)
async def test_a_broken_rtp_stream_is_a_warning_once(kwargs: dict[str, int], problem: str) -> None:
    fake = _Stream()
    fake.rtp(SPEECH)
    fake.rtp(SPEECH, **kwargs)
    fake.rtp(SPEECH, **kwargs)
    assert len(fake.result.warnings) == 1 and problem in fake.result.warnings[0], fake.result.warnings


async def test_timestamps_must_follow_the_samples_sent() -> None:
    fake = _Stream()
    fake.rtp(SPEECH)
    fake.timestamp += 80
    fake.rtp(SPEECH)
    fake.stream.receive(b"\x90" + build_rtp(0, 2000, 0, 0x1234, SPEECH)[1:])  # an extension bit
    assert [w.split(" ")[1] for w in fake.result.warnings] == ["timestamp", "first"], fake.result.warnings


async def test_a_bye_from_the_bridge_ends_the_call_once_and_one_outside_the_dialog_does_not() -> None:
    fake = _Stream()
    bye = "BYE sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK1\r\nFrom: <sip:c@d>;tag={from_}\r\n" \
        "To: <sip:a@b>;tag=ours\r\nCall-ID: c1@sim\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n"  # fmt: skip
    fake.stream.receive(bye.format(from_="someone-else"))
    assert fake.byes == 0 and "outside our dialog" in fake.result.warnings[0]
    fake.stream.receive(bye.format(from_="theirs"))
    fake.stream.receive(bye.format(from_="theirs"))  # a retransmission
    assert fake.byes == 1 and fake.stream.bye_received and len(fake.result.warnings) == 1


async def test_the_agents_rfc_4733_digits_are_heard_once_each_and_the_media_clock_moves_past_them() -> None:
    fake = _Stream()
    sender = RtpSender(ssrc=0x1234, sequence=5000, timestamp=80000)
    fake.stream.receive(sender.packet(0, SPEECH, 160))
    schedule, _ = dtmf_train(sender, 101, "7#")
    for _, packet in schedule:
        fake.stream.receive(packet)
    fake.stream.receive(sender.packet(0, SPEECH, 160))  # the media clock stands past the train
    fake.stream.receive(sender.packet(0, SPEECH, 160))
    assert fake.stream.agent_digits == ["7", "#"] and fake.result.warnings == [], fake.result.warnings


async def test_an_event_without_end_packet_redundancy_is_a_warning() -> None:
    fake = _Stream()
    sender = RtpSender(ssrc=0x1234, sequence=5000, timestamp=80000)
    fake.stream.receive(sender.packet(0, SPEECH, 160))
    start = sender.timestamp
    fake.stream.receive(sender.event_packet(101, event_payload(3, end=False, duration=160), start, marker=True))
    fake.stream.receive(sender.event_packet(101, event_payload(3, end=True, duration=320), start, marker=False))
    sender.timestamp = start + 480
    fake.stream.receive(sender.packet(0, SPEECH, 160))
    assert fake.stream.agent_digits == ["3"]
    assert len(fake.result.warnings) == 1 and "1 end packets" in fake.result.warnings[0], fake.result.warnings


@pytest.mark.parametrize(("every_ms", "warned"), [(20, False), (24, False), (40, True)])
async def test_rtp_slower_than_its_timestamps_is_a_warning(monkeypatch: pytest.MonkeyPatch, every_ms: int, warned: bool) -> None:
    """Issue #16: the bridge's silence cadence sent a 20 ms packet every 40 ms, and the simulated trunk, which checked
    timestamps against samples only, saw nothing. Now wall time is the reference: 3 s of 20 ms packets arriving
    every ``every_ms`` (24 ms: a loaded machine's lateness, within the 75 % allowed)."""
    now = [100.0]
    monkeypatch.setattr("callbridge.carriers.sip.sim_stream.time.monotonic", lambda: now[0])
    fake = _Stream()
    for _ in range(3000 // every_ms):
        fake.rtp(b"\xff" * 160)
        now[0] += every_ms / 1000
    found = [warning for warning in fake.result.warnings if "wall time" in warning]
    assert len(found) == (1 if warned else 0), fake.result.warnings


async def test_a_pause_in_the_rtp_starts_the_clock_check_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hold, a stalled machine: packets that stop for a while and go on from the next timestamp are not slow."""
    now = [100.0]
    monkeypatch.setattr("callbridge.carriers.sip.sim_stream.time.monotonic", lambda: now[0])
    fake = _Stream()
    for index in range(200):
        fake.rtp(b"\xff" * 160)
        now[0] += 0.5 if index % 50 == 49 else 0.02
    assert fake.result.warnings == []
