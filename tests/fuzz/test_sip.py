"""The SIP side, fuzzed: the message parser and the TCP framer, SDP, RTP, RTCP, RFC 4733 digits, the UAS
(datagrams in any order, with a clock), and a SIP call's RTP codec. Each parser raises only its own error; the
UAS answers everything with messages that parse and never wants a timer in the past; the codec keeps the
carrier contract (tests/fuzz/contract.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from callbridge.carriers.sip.wire import SipRtpCodec
from callbridge.sip.dialog import (
    CallEnded,
    CallOffered,
    Dropped,
    DtmfInfo,
    MediaChanged,
    SipUas,
    UasConfig,
)
from callbridge.sip.dtmf import DtmfReceiver, event_payload
from callbridge.sip.message import SipParseError, parse_message, split_stream
from callbridge.sip.rtcp import RtcpError, parse_rtcp
from callbridge.sip.rtp import JitterBuffer, RtpError, build_rtp, parse_rtp
from callbridge.sip.sdp import SdpError, choose
from tests.fuzz.contract import CodecRun
from tests.fuzz.strategies import TRICKY, budget
from tests.sip.test_dialog import LOCAL, PEER, SDP, request

pytestmark = [pytest.mark.hot_path, pytest.mark.background]
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

_text = st.sampled_from([t for t in TRICKY if isinstance(t, str)]) | st.text(max_size=30)
_number_text = st.sampled_from(
    ["0", "1", "65535", "65536", "2147483648", "-1", "²", "٣", "1.5", "", " 7", "99999999999999999999"]
)


# ----------------------------------------------------------------------------- message


@st.composite
def sdp_offers(draw: st.DrawFn) -> str:
    """The test offer, each line kept, dropped, or given a tricky value; plus lines of our own."""
    lines = SDP.strip().split("\r\n")
    out: list[str] = []
    for line in lines:
        choice = draw(st.integers(0, 5))
        if choice == 0:
            continue
        if choice == 1:
            out.append(line[:2] + draw(_text | _number_text))
        elif choice == 2:
            out.append(line.replace("30000", draw(_number_text)).replace(" 0 101", " " + draw(_number_text) + " 101"))
        else:
            out.append(line)
    extra = st.sampled_from(
        [
            "a=sendonly",
            "a=inactive",
            "a=ptime:²",
            "a=ptime:20",
            "a=rtpmap:0 PCMU/8000",
            "a=rtpmap:8 PCMA/8000",
            "c=IN IP4 0.0.0.0",
            "c=IN IP6 ::1",
            "c=IN IP4 host.example",
            "m=audio 0 RTP/AVP 0",
            "m=video 4000 RTP/AVP 96",
            "a=rtpmap:101 telephone-event/8000",
        ]
    )
    for line in draw(st.lists(extra | _text, max_size=3)):
        out.insert(draw(st.integers(0, len(out))), line)
    return "\r\n".join(out) + "\r\n"


_METHODS = st.sampled_from(["INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "INFO", "REGISTER", "UPDATE", "FOO"])
_HEADER_NAMES = st.sampled_from(
    [
        "Via",
        "From",
        "To",
        "Call-ID",
        "CSeq",
        "Contact",
        "Content-Length",
        "Content-Type",
        "Require",
        "Record-Route",
        "v",
        "l",
        "i",
        "Max-Forwards",
    ]
)


@st.composite
def sip_requests(draw: st.DrawFn) -> bytes:
    """A request of the UAS tests with its headers kept, dropped, retyped or duplicated, and a body that may be
    an SDP offer (mangled), DTMF relay, or anything."""
    method = draw(_METHODS)
    to_tag = draw(st.sampled_from([None, None, "tag-x", "alice"]))
    body = draw(
        st.sampled_from(["", SDP])
        | sdp_offers()
        | st.just("Signal=5\r\nDuration=160\r\n")
        | st.just("Signal=ß\r\n")
        | _text
    )
    call_id = draw(st.sampled_from(["c1", "c1", "c2"]))
    cseq = draw(st.integers(1, 3))
    data = request(
        method,
        call_id=call_id,
        cseq=cseq,
        branch=draw(st.sampled_from(["z9hG4bKinv", "z9hG4bKb2", "x"])),
        to_tag=to_tag,
        body=body,
    )
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    for _ in range(draw(st.integers(0, 3))):
        index = draw(st.integers(0, len(lines) - 1))
        action = draw(st.integers(0, 3))
        if action == 0 and index > 0:
            del lines[index]
        elif action == 1:
            name = lines[index].partition(":")[0] if index > 0 else draw(_HEADER_NAMES)
            lines[index] = f"{name}: {draw(_text | _number_text)}"
        elif action == 2:
            lines.append(f"{draw(_HEADER_NAMES)}: {draw(_text | _number_text)}")
        else:
            lines[index] = " " + lines[index]  # a folded line
    if method == "INFO" and draw(st.booleans()):
        lines.append("Content-Type: application/dtmf-relay")
    return "\r\n".join(lines).encode("utf-8", "surrogatepass") + b"\r\n\r\n" + rest


@given(data=st.binary(max_size=400) | sip_requests())
@example(data=b"INVITE sip:a@b SIP/2.0\r\nContent-Length: \xc2\xb2\r\n\r\n")  # "²".isdigit(), int("²") raises
def test_message_parser_raises_only_its_error(data: bytes) -> None:
    try:
        message = parse_message(data)
    except SipParseError:
        return
    assert parse_message(message.serialize()).call_id == message.call_id


@given(chunks=st.lists(st.binary(max_size=80) | sip_requests(), max_size=4))
def test_stream_framer_raises_only_its_error(chunks: list[bytes]) -> None:
    buffer = b""
    for chunk in chunks:
        try:
            messages, buffer = split_stream(buffer + chunk)
        except SipParseError:
            return
        assert b"".join(messages) == b"" or all(m for m in messages)


@given(offer=sdp_offers() | st.text(max_size=200))
def test_sdp_raises_only_its_error(offer: str) -> None:
    try:
        choose(offer)
    except SdpError:
        pass


# --------------------------------------------------------------------------------- RTP


_rtp = st.builds(
    build_rtp,
    st.sampled_from([0, 8, 13, 101, 96, 127]),
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFFFFFF),
    st.sampled_from([1, 2, 0xFFFFFFFF]),
    st.binary(max_size=200)
    | st.builds(event_payload, st.integers(0, 255), end=st.booleans(), duration=st.integers(0, 0xFFFF)),
    marker=st.booleans(),
)


@given(data=st.binary(max_size=100) | _rtp | _rtp.map(lambda p: bytes([p[0] | 0x30]) + p[1:]))
def test_rtp_and_rtcp_parsers_raise_only_their_errors(data: bytes) -> None:
    try:
        packet = parse_rtp(data)
        assert len(packet.payload) <= len(data) - 12
    except RtpError:
        pass
    try:
        parse_rtcp(data)
    except RtcpError:
        pass


@given(packets=st.lists(_rtp, max_size=60), depth=st.integers(0, 4))
def test_jitter_buffer_and_digits_take_any_packet_train(packets: list[bytes], depth: int) -> None:
    jitter, digits = JitterBuffer(depth), DtmfReceiver()
    for data in packets:
        packet = parse_rtp(data)
        assert all(isinstance(p, bytes) for p in jitter.push(packet))
        assert all(d in "0123456789*#ABCD" and len(d) == 1 for d in digits.receive(packet))
        assert len(jitter.held) <= depth + jitter.max_gap + 1
    jitter.drain()
    assert not jitter.held


# --------------------------------------------------------------------------------- UAS


@budget(0.5)
@given(data=st.data())
def test_uas_answers_any_datagrams_with_messages_that_parse(data: st.DataObject) -> None:
    core = SipUas(UasConfig(host="127.0.0.1", port=5060, allowed_networks=(LOCAL,)))
    now_ms = 0
    for _ in range(data.draw(st.integers(1, 10), label="steps")):
        datagram = data.draw(sip_requests() | st.binary(max_size=60), label="datagram")
        source = data.draw(st.sampled_from([PEER, PEER, ("192.0.2.1", 5060)]), label="source")
        core.receive_datagram(datagram, source, now_ms, transport=data.draw(st.sampled_from(["UDP", "TCP"])))
        for event in core.events():
            assert (
                isinstance(event, CallOffered | CallEnded | DtmfInfo | Dropped | MediaChanged)
                or type(event).__name__ == "CallConfirmed"
            )
            if isinstance(event, DtmfInfo):
                assert len(event.digit) == 1 and event.digit in "0123456789*#ABCD"
            if isinstance(event, CallOffered):
                action = data.draw(st.sampled_from(["accept", "ring", "reject", "hang_up", "wait"]), label="answer")
                if action == "accept":
                    core.accept(event.call_id, "127.0.0.1", 40000, now_ms)
                elif action == "ring":
                    core.ring(event.call_id, now_ms)
                elif action == "reject":
                    core.reject(event.call_id, 486, now_ms)
                elif action == "hang_up":
                    core.hang_up(event.call_id, now_ms)
        now_ms += data.draw(st.sampled_from([0, 1, 500, 4000, 40_000]), label="advance")
        _tick_due(core, now_ms)
        for outgoing in core.datagrams_to_send():
            _parses(outgoing.data)
    for call_id in list(core.dialogs):
        core.hang_up(call_id, now_ms)
    _tick_due(core, now_ms + 120_000)


def _parses(data: bytes) -> None:
    """Everything the UAS sends is SIP, but for a 400 that echoes a request's unreadable CSeq (RFC 3261 §8.2.6.2
    has it copied, and there is nothing better to put there)."""
    try:
        parse_message(data)
    except SipParseError as exc:
        assert data.startswith(b"SIP/2.0 400 ") and exc.reason.value == "bad_cseq", (exc, data)


def _tick_due(core: SipUas, now_ms: int) -> None:
    """What the listener does: tick while a deadline is due. A deadline still due after a tick would spin it."""
    for _ in range(200):
        deadline = core.next_deadline_ms()
        if deadline is None or deadline > now_ms:
            return
        core.tick(now_ms)
    raise AssertionError(f"the UAS keeps a deadline at or before {now_ms} after ticking")


# -------------------------------------------------------------------------------- codec


def _codec() -> SipRtpCodec:
    choice = choose(SDP)
    assert choice is not None
    return SipRtpCodec("c1", choice, caller="sip:alice@10.0.0.1", callee="sip:agent@127.0.0.1")


_controls = st.sampled_from(["start", "bye", "dtmf:5", "dtmf:", "dtmf:12", "dtmf:0123", "dtmf:ß", "hold"]) | st.text(
    max_size=10
)


@given(messages=st.lists(_controls | _rtp | st.binary(max_size=40), max_size=40))
@example(messages=["start", "dtmf:"])  # an empty "digit" is no digit
@example(messages=["start", "dtmf:12"])  # a substring of the digits is not one digit
def test_rtp_codec_keeps_the_carrier_contract(messages: list[Any]) -> None:
    CodecRun(_codec()).feed(messages)
