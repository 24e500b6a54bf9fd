"""SIP message parsing and serialization (RFC 3261 §7, §18.3, §20)."""

from __future__ import annotations

import pytest

from callbridge.sip.message import (
    SipParseError,
    SipParseReason,
    SipRequest,
    SipResponse,
    header_param,
    parse_message,
    split_stream,
    uri_of,
)

pytestmark = pytest.mark.core

INVITE = (
    b"INVITE sip:agent@127.0.0.1:5060 SIP/2.0\r\n"
    b"v: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bK1;rport\r\n"
    b"Via: SIP/2.0/UDP proxy.example:5060;branch=z9hG4bKp, SIP/2.0/UDP edge.example;branch=z9hG4bKe\r\n"
    b'f: "Alice" <sip:alice@10.0.0.1>;tag=abc\r\n'
    b"t: <sip:agent@127.0.0.1>\r\n"
    b"i: call-1@10.0.0.1\r\n"
    b"CSeq: 1 INVITE\r\n"
    b"m: <sip:alice@10.0.0.1:5070>\r\n"
    b"Subject: a long\r\n"
    b" folded subject\r\n"
    b"c: application/sdp\r\n"
    b"l: 4\r\n"
    b"\r\n"
    b"v=0\r\nextra bytes past Content-Length"
)


def test_compact_forms_folding_and_lists() -> None:
    message = parse_message(INVITE)
    assert isinstance(message, SipRequest)
    assert message.method == "INVITE" and message.uri == "sip:agent@127.0.0.1:5060"
    assert message.call_id == "call-1@10.0.0.1"
    assert message.cseq == (1, "INVITE")
    assert message.headers_all("via") == [
        "SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bK1;rport",
        "SIP/2.0/UDP proxy.example:5060;branch=z9hG4bKp",
        "SIP/2.0/UDP edge.example;branch=z9hG4bKe",
    ]
    assert message.branch == "z9hG4bK1"
    assert message.header("SUBJECT") == "a long folded subject"
    assert message.header("Content-Type") == "application/sdp"
    assert message.body == b"v=0\r"  # bytes past Content-Length are ignored (§18.3)
    assert header_param(message.header("From") or "", "tag") == "abc"
    assert uri_of(message.header("From") or "") == "sip:alice@10.0.0.1"
    assert uri_of("sip:bob@x;tag=1") == "sip:bob@x"


def test_serialize_round_trip_sets_content_length() -> None:
    response = SipResponse(status=200, reason="OK")
    response.add("Via", "SIP/2.0/UDP a;branch=z9hG4bKx")
    for name, value in (("From", "<sip:a@b>;tag=1"), ("To", "<sip:c@d>;tag=2"), ("Call-ID", "x"), ("CSeq", "2 BYE")):
        response.add(name, value)
    response.add("Content-Length", "999")  # replaced by the real length
    response.body = b"hello"
    data = response.serialize()
    assert data.count(b"Content-Length") == 1 and b"Content-Length: 5\r\n" in data
    again = parse_message(data)
    assert isinstance(again, SipResponse) and again.status == 200 and again.body == b"hello" and again.cseq == (2, "BYE")


@pytest.mark.parametrize(
    ("data", "reason", "answerable"),
    [
        (b"\xff\xfe garbage \r\n\r\n", SipParseReason.NOT_UTF8, False),
        (b"hello world", SipParseReason.NO_HEADERS_END, False),
        (b"HELLO\r\n\r\n", SipParseReason.BAD_START_LINE, False),
        (b"INVITE sip:a SIP/3.0\r\nVia: x\r\n\r\n", SipParseReason.BAD_START_LINE, False),
        (b"OPTIONS sip:a SIP/2.0\r\n folded first\r\n\r\n", SipParseReason.BAD_HEADER, False),
        (b"OPTIONS sip:a SIP/2.0\r\nno colon here\r\n\r\n", SipParseReason.BAD_HEADER, False),
        (INVITE.replace(b"i: call-1@10.0.0.1\r\n", b""), SipParseReason.MISSING_HEADER, False),
        (INVITE.replace(b"l: 4", b"l: 400"), SipParseReason.TRUNCATED_BODY, True),
        (INVITE.replace(b"l: 4", b"l: four"), SipParseReason.BAD_CONTENT_LENGTH, True),
        (INVITE.replace(b"CSeq: 1 INVITE", b"CSeq: 1 BYE"), SipParseReason.BAD_CSEQ, True),
        (INVITE.replace(b"CSeq: 1 INVITE", b"CSeq: x INVITE"), SipParseReason.BAD_CSEQ, True),
        (b"X" * 70000, SipParseReason.OVERSIZED, False),
        (INVITE.replace(b"l: 4", b"X-Big: " + b"x" * 60_000 + b"\r\nl: 4"), SipParseReason.HEAD_TOO_LARGE, True),
        (INVITE.replace(b"l: 4", b"".join(b"X-H%d: 1\r\n" % i for i in range(5000)) + b"l: 4"), SipParseReason.HEAD_TOO_LARGE, True),
        (b"OPTIONS sip:a SIP/2.0\r\n" + b"X-H: 1\r\n" * 200 + b"\r\n", SipParseReason.HEAD_TOO_LARGE, False),
    ],
)
def test_bad_input_is_a_typed_error(data: bytes, reason: SipParseReason, answerable: bool) -> None:
    with pytest.raises(SipParseError) as exc:
        parse_message(data)
    assert exc.value.reason is reason
    assert (exc.value.request is not None) is answerable


def test_lf_line_ends_and_leading_crlf_are_tolerated() -> None:
    data = b"\r\nOPTIONS sip:a SIP/2.0\nVia: SIP/2.0/UDP h;branch=z9hG4bK2\nFrom: <sip:x@y>;tag=1\nTo: <sip:a>\nCall-ID: o1\nCSeq: 7 OPTIONS\n\n"
    message = parse_message(data)
    assert isinstance(message, SipRequest) and message.method == "OPTIONS" and message.cseq == (7, "OPTIONS")


def test_tcp_stream_framing() -> None:
    one = INVITE[: INVITE.index(b"\r\n\r\n") + 4] + b"v=0\r"  # l: 4
    messages, rest = split_stream(b"\r\n\r\n" + one + one[:50])
    assert messages == [one] and rest == one[:50]
    messages, rest = split_stream(rest + one[50:] + b"\r\n")
    assert messages == [one] and rest == b""
    assert split_stream(one[:-2]) == ([], one[:-2])  # the body is not complete yet
    with pytest.raises(SipParseError) as exc:
        split_stream(b"OPTIONS sip:a SIP/2.0\r\nVia: x\r\n\r\n")
    assert exc.value.reason is SipParseReason.BAD_CONTENT_LENGTH
    with pytest.raises(SipParseError):
        split_stream(b"A" * 70000)
