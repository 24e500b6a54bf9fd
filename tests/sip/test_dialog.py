"""The SIP UAS state machine under a fake clock: transactions, dialogs, retransmissions, admission."""

from __future__ import annotations

import hashlib
import ipaddress

import pytest

from callbridge.sip.dialog import (
    CallConfirmed,
    CallEnded,
    CallOffered,
    DialogState,
    Dropped,
    DtmfInfo,
    MediaChanged,
    OfferAnswered,
    SipUas,
    UasConfig,
)
from callbridge.sip.digest import DigestChallenge, authorization
from callbridge.sip.message import SipRequest, SipResponse, header_param, parse_message
from callbridge.sip.sdp import Direction
from callbridge.sip.transaction import T1_MS, T2_MS, TIMEOUT_MS

pytestmark = pytest.mark.core

PEER = ("10.0.0.1", 5070)
SDP = "v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\nm=audio 30000 RTP/AVP 0 101\r\na=rtpmap:101 telephone-event/8000\r\n"
LOCAL = ipaddress.ip_network("10.0.0.0/8")


def uas(**config: object) -> SipUas:
    options: dict[str, object] = {"host": "127.0.0.1", "port": 5060, "allowed_networks": (LOCAL,)}
    options.update(config)
    return SipUas(UasConfig(**options))  # type: ignore[arg-type]


def request(
    method: str,
    *,
    call_id: str = "c1",
    cseq: int = 1,
    branch: str = "z9hG4bKinv",
    to_tag: str | None = None,
    body: str = "",
    headers: tuple[tuple[str, str], ...] = (),
    cseq_method: str | None = None,
) -> bytes:
    to = "<sip:agent@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
    lines = [
        f"{method} sip:agent@127.0.0.1 SIP/2.0",
        f"Via: SIP/2.0/UDP 10.0.0.1:5070;branch={branch};rport",
        "From: <sip:alice@10.0.0.1>;tag=alice",
        f"To: {to}",
        f"Call-ID: {call_id}",
        f"CSeq: {cseq} {cseq_method or method}",
        "Contact: <sip:alice@10.0.0.1:5070>",
        "Record-Route: <sip:proxy.example;lr>",
    ]
    lines += [f"{k}: {v}" for k, v in headers]
    if body:
        lines.append("Content-Type: application/sdp")
    lines.append(f"Content-Length: {len(body.encode())}")
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


def responses(core: SipUas) -> list[SipResponse]:
    out = []
    for datagram in core.datagrams_to_send():
        message = parse_message(datagram.data)
        assert isinstance(message, SipResponse)
        assert datagram.address == PEER  # rport: back to the source
        out.append(message)
    return out


def statuses(core: SipUas) -> list[int]:
    return [r.status for r in responses(core)]


def answered(core: SipUas, now_ms: int = 0) -> str:
    """INVITE → 100, offered, accepted → 200; the local tag."""
    core.receive_datagram(request("INVITE", body=SDP), PEER, now_ms)
    assert statuses(core) == [100]
    (offered,) = core.events()
    assert isinstance(offered, CallOffered) and offered.choice.payload_type == 0 and offered.choice.dtmf_payload_type == 101
    core.accept("c1", "127.0.0.1", 40000, now_ms)
    (ok,) = responses(core)
    assert ok.status == 200
    tag = header_param(ok.header("To") or "", "tag")
    assert tag
    return tag


def test_invite_answer_ack_bye() -> None:
    core = uas()
    core.receive_datagram(request("INVITE", body=SDP), PEER, 0)
    (trying,) = responses(core)
    assert trying.status == 100 and header_param(trying.header("To") or "", "tag") is None
    assert "received" not in (trying.header("Via") or "") and "rport=5070" in (trying.header("Via") or "")
    core.events()
    core.accept("c1", "127.0.0.1", 40000, 10)
    (ok,) = responses(core)
    assert ok.header("Contact") == "<sip:callbridge@127.0.0.1:5060>"
    assert ok.headers_all("Record-Route") == ["<sip:proxy.example;lr>"]
    assert ok.header("Content-Type") == "application/sdp" and b"m=audio 40000 RTP/AVP 0 101" in ok.body
    assert ok.cseq == (1, "INVITE") and ok.call_id == "c1" and "INVITE" in (ok.header("Allow") or "")
    tag = header_param(ok.header("To") or "", "tag")
    core.receive_datagram(request("ACK", branch="z9hG4bKack", to_tag=tag), PEER, 100)
    assert core.events() == [CallConfirmed("c1")] and core.datagrams_to_send() == []
    core.receive_datagram(request("BYE", cseq=2, branch="z9hG4bKbye", to_tag=tag), PEER, 5000)
    (bye_ok,) = responses(core)
    assert bye_ok.status == 200 and bye_ok.cseq == (2, "BYE")
    assert core.events() == [CallEnded("c1", "bye")]
    core.receive_datagram(request("BYE", cseq=2, branch="z9hG4bKbye", to_tag=tag), PEER, 5100)  # retransmitted
    assert statuses(core) == [200] and core.events() == []
    core.receive_datagram(request("BYE", cseq=3, branch="z9hG4bKbye2", to_tag="other"), PEER, 5200)
    assert statuses(core) == [481]
    core.tick(5000 + TIMEOUT_MS)
    assert "c1" not in core.dialogs


def test_200_retransmitted_t1_doubling_to_t2_until_ack_then_bye_after_64_t1() -> None:
    core = uas()
    tag = answered(core)
    sent_at = []
    now = 0
    while now <= TIMEOUT_MS:
        deadline = core.next_deadline_ms()
        assert deadline is not None
        now = deadline
        core.tick(now)
        for out in core.datagrams_to_send():
            message = parse_message(out.data)
            if isinstance(message, SipResponse) and message.status == 200:
                sent_at.append(now)
            elif isinstance(message, SipRequest):
                assert message.method == "BYE" and now == TIMEOUT_MS
                assert message.uri == "sip:alice@10.0.0.1:5070" and message.headers_all("Route") == ["<sip:proxy.example;lr>"]
                assert header_param(message.header("From") or "", "tag") == tag
                sent_at.append(-1)
                now = TIMEOUT_MS + 1
    intervals = [b - a for a, b in zip([0, *sent_at], sent_at) if b >= 0]
    assert intervals[:5] == [T1_MS, 2 * T1_MS, 4 * T1_MS, T2_MS, T2_MS]
    assert sent_at[-1] == -1
    assert core.events() == [CallEnded("c1", "no_ack")]
    assert core.dialogs["c1"].state is DialogState.ENDING


def test_ack_stops_retransmission() -> None:
    core = uas()
    tag = answered(core)
    core.tick(T1_MS)
    assert statuses(core) == [200]
    core.receive_datagram(request("ACK", branch="z9hG4bKack", to_tag=tag), PEER, T1_MS + 10)
    core.tick(10 * T1_MS)
    assert core.datagrams_to_send() == []


def test_invite_retransmission_gets_the_same_response() -> None:
    core = uas()
    core.receive_datagram(request("INVITE", body=SDP), PEER, 0)
    core.receive_datagram(request("INVITE", body=SDP), PEER, 100)
    assert statuses(core) == [100, 100]
    assert len([e for e in core.events() if isinstance(e, CallOffered)]) == 1


def test_cancel_before_answer_gives_487_and_the_ack_absorbs_it() -> None:
    core = uas()
    core.receive_datagram(request("INVITE", body=SDP), PEER, 0)
    core.datagrams_to_send()
    core.events()
    core.receive_datagram(request("CANCEL", branch="z9hG4bKinv"), PEER, 50)
    got = responses(core)
    assert [(r.status, r.cseq[1]) for r in got] == [(200, "CANCEL"), (487, "INVITE")]
    assert core.events() == [CallEnded("c1", "cancelled")]
    core.tick(50 + T1_MS)
    assert statuses(core) == [487]  # retransmitted until the ACK
    core.receive_datagram(request("ACK", branch="z9hG4bKinv", cseq_method="ACK"), PEER, T1_MS + 60)
    core.tick(10 * T1_MS)
    assert core.datagrams_to_send() == []
    core.receive_datagram(request("CANCEL", branch="z9hG4bKnone", call_id="c2"), PEER, 0)
    assert statuses(core) == [481]


def test_rejections() -> None:
    core = uas()
    core.receive_datagram(request("INVITE", body=SDP, headers=(("Require", "100rel, timer"),)), PEER, 0)
    (bad_ext,) = responses(core)
    assert bad_ext.status == 420 and bad_ext.header("Unsupported") == "timer"  # 100rel we do (RFC 3262)
    core.receive_datagram(request("INVITE", call_id="c2", branch="z9hG4bK2", body=SDP).replace(b"application/sdp", b"text/plain"), PEER, 0)
    (media_type,) = responses(core)
    assert media_type.status == 415 and media_type.header("Accept") == "application/sdp"
    core.receive_datagram(request("INVITE", call_id="c3", branch="z9hG4bK3", body=SDP.replace("0 101", "18")), PEER, 0)
    assert statuses(core) == [488]
    core.receive_datagram(request("INVITE", call_id="c4", branch="z9hG4bK4", body=SDP.replace("RTP/AVP", "RTP/SAVP")), PEER, 0)
    assert statuses(core) == [488]  # SRTP only
    core.receive_datagram(request("INVITE", call_id="c5", branch="z9hG4bK5", body=SDP), ("192.0.2.1", 5070), 0)
    (forbidden,) = core.datagrams_to_send()
    assert parse_message(forbidden.data).status == 403 and forbidden.address == ("192.0.2.1", 5070)  # type: ignore[union-attr]
    core.receive_datagram(request("INVITE", call_id="c6", branch="z9hG4bK6", to_tag="nope", body=SDP), PEER, 0)
    assert statuses(core) == [481]
    assert not [e for e in core.events() if isinstance(e, CallOffered)]
    core.receive_datagram(request("INVITE", call_id="c7", branch="z9hG4bK7", body=SDP), PEER, 0)
    core.datagrams_to_send()
    core.reject("c7", 486, 0)
    assert statuses(core) == [486]
    for call_id, branch in (("c2", "z9hG4bK2"), ("c3", "z9hG4bK3"), ("c4", "z9hG4bK4"), ("c7", "z9hG4bK7")):
        core.receive_datagram(request("ACK", call_id=call_id, branch=branch), PEER, 10)
    core.tick(TIMEOUT_MS + 10)
    core.tick(2 * TIMEOUT_MS + 20)
    assert core.datagrams_to_send() == []  # every rejection ACKed or given up: nothing retransmitted, all forgotten
    assert core.dialogs == {} and core.next_deadline_ms() is None


def test_methods_options_info_and_garbage() -> None:
    core = uas()
    core.receive_datagram(request("OPTIONS", call_id="o1", branch="z9hG4bKo"), ("192.0.2.9", 5070), 0)
    (options,) = core.datagrams_to_send()
    ok = parse_message(options.data)
    assert isinstance(ok, SipResponse) and ok.status == 200 and "OPTIONS" in (ok.header("Allow") or "")
    assert ok.header("Accept") == "application/sdp" and header_param(ok.header("To") or "", "tag")
    core.receive_datagram(request("REGISTER", call_id="r1", branch="z9hG4bKr"), PEER, 0)
    (not_allowed,) = responses(core)
    assert not_allowed.status == 405 and not_allowed.header("Allow")
    core.receive_datagram(request("FROBNICATE", call_id="f1", branch="z9hG4bKf"), PEER, 0)
    assert statuses(core) == [501]
    core.receive_datagram(request("BYE", call_id="nope", branch="z9hG4bKb"), PEER, 0)
    assert statuses(core) == [481]
    core.receive_datagram(request("INVITE", call_id="bad", branch="z9hG4bKbad", body=SDP).replace(b"Content-Length: ", b"Content-Length: 9"), PEER, 0)
    (bad,) = responses(core)
    assert bad.status == 400 and "truncated_body" in bad.reason
    core.receive_datagram(request("OPTIONS", call_id="q", branch="z9hG4bKq").replace(b"CSeq: 1 OPTIONS", b"CSeq: x OPTIONS"), PEER, 0)
    (bad_cseq,) = core.datagrams_to_send()  # its CSeq is copied as it came: the response does not parse either
    assert bad_cseq.data.startswith(b"SIP/2.0 400 Bad Request (bad_cseq)") and b"CSeq: x OPTIONS" in bad_cseq.data
    many = request("INVITE", call_id="big", branch="z9hG4bKbig", body=SDP).replace(b"\r\n\r\n", b"\r\n" + b"X-H: 1\r\n" * 5000 + b"\r\n", 1)
    core.receive_datagram(many[:65535], PEER, 0)
    (too_large,) = responses(core)
    assert too_large.status == 513 and too_large.call_id == "big"  # 5,000 headers: answered, never parsed whole
    for garbage in (b"\x00\x01\x02", b"GET / HTTP/1.1\r\n\r\n", b"\r\n\r\n", b"SIP/2.0 200 OK\r\nVia: x\r\nFrom: a\r\nTo: b\r\nCall-ID: z\r\nCSeq: 1 BYE\r\n\r\n"):
        core.receive_datagram(garbage, PEER, 0)
    assert core.datagrams_to_send() == []
    dropped = [e for e in core.events() if isinstance(e, Dropped)]
    assert [d.reason for d in dropped] == [
        "malformed:truncated_body", "malformed:bad_cseq", "malformed:head_too_large", "malformed:no_headers_end", "malformed:bad_start_line",
        "stray_response",
    ]  # fmt: skip
    tag = answered(core)
    core.receive_datagram(request("OPTIONS", cseq=2, branch="z9hG4bKo2", to_tag=tag), PEER, 0)
    assert statuses(core) == [200]
    info = request("INFO", cseq=3, branch="z9hG4bKi", to_tag=tag, body="Signal=5\r\nDuration=160\r\n").replace(b"application/sdp", b"application/dtmf-relay")
    core.receive_datagram(info, PEER, 0)
    assert statuses(core) == [200] and core.events() == [DtmfInfo("c1", "5")]


def test_reinvite_hold_resume_and_refused_codec_change() -> None:
    core = uas()
    tag = answered(core)
    core.receive_datagram(request("ACK", branch="z9hG4bKa1", to_tag=tag), PEER, 10)
    core.events()
    core.receive_datagram(request("INVITE", cseq=2, branch="z9hG4bKh", to_tag=tag, body=SDP + "a=sendonly\r\n"), PEER, 1000)
    (hold,) = responses(core)
    assert hold.status == 200 and b"a=recvonly" in hold.body
    (changed,) = core.events()
    assert isinstance(changed, MediaChanged) and changed.choice.direction is Direction.RECVONLY
    version = next(line for line in hold.body.decode().split("\r\n") if line.startswith("o=")).split()[2]
    core.receive_datagram(request("ACK", cseq=2, branch="z9hG4bKa2", to_tag=tag), PEER, 1010)
    core.receive_datagram(request("INVITE", cseq=3, branch="z9hG4bKr", to_tag=tag, body=SDP), PEER, 2000)
    (resume,) = responses(core)
    assert b"a=sendrecv" in resume.body
    new_version = next(line for line in resume.body.decode().split("\r\n") if line.startswith("o=")).split()[2]
    assert int(new_version) == int(version) + 1
    assert isinstance(core.events()[0], MediaChanged)
    core.receive_datagram(request("ACK", cseq=3, branch="z9hG4bKa3", to_tag=tag), PEER, 2010)
    core.receive_datagram(request("INVITE", cseq=4, branch="z9hG4bKp", to_tag=tag, body=SDP.replace("0 101", "8")), PEER, 3000)
    assert statuses(core) == [488]  # the call's codec cannot change
    core.receive_datagram(request("INVITE", cseq=4, branch="z9hG4bKq", to_tag=tag, body=SDP), PEER, 3000)
    assert statuses(core) == [500]  # CSeq not above the last one
    assert core.dialogs["c1"].state is DialogState.CONFIRMED


def test_our_bye_retransmitted_until_answered() -> None:
    core = uas()
    tag = answered(core)
    core.hang_up("c1", 10)  # before the ACK: the BYE waits for it
    assert core.datagrams_to_send() == []
    core.receive_datagram(request("ACK", branch="z9hG4bKa1", to_tag=tag), PEER, 20)
    (bye,) = core.datagrams_to_send()
    message = parse_message(bye.data)
    assert isinstance(message, SipRequest) and message.method == "BYE" and message.cseq == (1, "BYE")
    assert core.events() == [CallConfirmed("c1"), CallEnded("c1", "hung_up")]
    core.tick(20 + T1_MS)
    assert [parse_message(d.data).cseq for d in core.datagrams_to_send()] == [(1, "BYE")]
    ok = f"SIP/2.0 200 OK\r\n{message.top_via and 'Via: ' + message.top_via}\r\nFrom: {message.header('From')}\r\nTo: {message.header('To')}\r\nCall-ID: c1\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n"
    core.receive_datagram(ok.encode(), PEER, 600)
    assert core.dialogs["c1"].state is DialogState.ENDED
    core.tick(5000)
    assert core.datagrams_to_send() == []


def test_digest_authentication() -> None:
    core = uas(allowed_networks=(), username="trunk", password="s3cret", realm="cb")
    stranger = ("192.0.2.1", 5070)
    core.receive_datagram(request("INVITE", body=SDP), stranger, 0)
    (challenge,) = core.datagrams_to_send()
    message = parse_message(challenge.data)
    assert isinstance(message, SipResponse) and message.status == 401
    params = dict(p.strip().split("=", 1) for p in (message.header("WWW-Authenticate") or "").removeprefix("Digest ").split(","))
    nonce = params["nonce"].strip('"')
    uri = "sip:agent@127.0.0.1"

    def md5(text: str) -> str:
        return hashlib.md5(text.encode()).hexdigest()

    def authorization(password: str) -> str:
        ha1, ha2 = md5(f"trunk:cb:{password}"), md5(f"INVITE:{uri}")
        digest = md5(f"{ha1}:{nonce}:00000001:abc:auth:{ha2}")
        return f'Digest username="trunk", realm="cb", nonce="{nonce}", uri="{uri}", response="{digest}", qop=auth, nc=00000001, cnonce="abc"'

    core.receive_datagram(request("INVITE", cseq=2, branch="z9hG4bKw", body=SDP, headers=(("Authorization", authorization("wrong")),)), stranger, 10)
    assert parse_message(core.datagrams_to_send()[0].data).status == 401  # type: ignore[union-attr]
    core.receive_datagram(request("INVITE", cseq=3, branch="z9hG4bKr", body=SDP, headers=(("Authorization", authorization("s3cret")),)), stranger, 20)
    assert parse_message(core.datagrams_to_send()[0].data).status == 100  # type: ignore[union-attr]
    assert isinstance(core.events()[0], CallOffered)


@pytest.mark.parametrize("algorithm", ["SHA-256", "SHA-256-sess", "MD5-sess"])
def test_digest_authentication_with_the_rfc_8760_algorithms(algorithm: str) -> None:
    """The 401 offers MD5 and SHA-256, one challenge each (RFC 8760 §2.4, MD5 first for UACs that read only the
    first); an answer with SHA-256 (or a ``-sess`` variant) is taken, computed here with hashlib alone."""
    core = uas(allowed_networks=(), username="trunk", password="s3cret", realm="cb")
    stranger = ("192.0.2.1", 5070)
    core.receive_datagram(request("INVITE", body=SDP), stranger, 0)
    message = parse_message(core.datagrams_to_send()[0].data)
    assert isinstance(message, SipResponse) and message.status == 401
    offered = message.headers_all("WWW-Authenticate")
    assert [h.split("algorithm=")[1].split(",")[0] for h in offered] == ["MD5", "SHA-256"]
    nonce = offered[1].split('nonce="')[1].split('"')[0]
    uri = "sip:agent@127.0.0.1"
    name = "sha256" if algorithm.startswith("SHA-256") else "md5"

    def h(text: str) -> str:
        return hashlib.new(name, text.encode()).hexdigest()

    ha1 = h("trunk:cb:s3cret")
    if algorithm.endswith("-sess"):
        ha1 = h(f"{ha1}:{nonce}:c0ffee")
    response = h(f"{ha1}:{nonce}:00000001:c0ffee:auth:{h(f'INVITE:{uri}')}")
    answer = f'Digest username="trunk", realm="cb", nonce="{nonce}", uri="{uri}", response="{response}", algorithm={algorithm}, qop=auth, nc=00000001, cnonce="c0ffee"'
    core.receive_datagram(request("INVITE", cseq=2, branch="z9hG4bKs", body=SDP, headers=(("Authorization", answer),)), stranger, 10)
    assert parse_message(core.datagrams_to_send()[0].data).status == 100  # type: ignore[union-attr]
    assert isinstance(core.events()[0], CallOffered)


def test_a_digest_answer_with_an_algorithm_we_did_not_offer_is_refused() -> None:
    core = uas(allowed_networks=(), username="trunk", password="s3cret", realm="cb")
    stranger = ("192.0.2.1", 5070)
    core.receive_datagram(request("INVITE", body=SDP), stranger, 0)
    message = parse_message(core.datagrams_to_send()[0].data)
    assert isinstance(message, SipResponse)
    nonce = (message.header("WWW-Authenticate") or "").split('nonce="')[1].split('"')[0]
    challenge = DigestChallenge(realm="cb", nonce=nonce, algorithm="SHA-512-256", qop=("auth",))
    answer = authorization(challenge, method="INVITE", uri="sip:agent@127.0.0.1", username="trunk", password="s3cret", cnonce="c", nonce_count=1)
    core.receive_datagram(request("INVITE", cseq=2, branch="z9hG4bKx", body=SDP, headers=(("Authorization", answer),)), stranger, 10)
    assert parse_message(core.datagrams_to_send()[0].data).status == 401  # type: ignore[union-attr]


def test_mutated_messages_never_raise() -> None:
    """Thousands of corrupted INVITE/BYE/ACK/CANCEL datagrams (bytes flipped, cut, duplicated): each is answered or
    dropped; none raises, and the UAS still serves a good call afterwards."""
    import random

    rng = random.Random(8)
    core = uas()
    seeds = [
        request("INVITE", body=SDP),
        request("BYE", cseq=2, branch="z9hG4bKb", to_tag="t"),
        request("ACK", branch="z9hG4bKa", to_tag="t"),
        request("CANCEL"),
        request("INVITE", cseq=3, branch="z9hG4bKr", to_tag="t", body=SDP + "a=sendonly\r\n"),
    ]
    for i in range(4000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 8)):
            what = rng.random()
            pos = rng.randrange(len(data))
            if what < 0.5:
                data[pos] = rng.choice(b"\x00 :;,<>=\r\n\t@\xffz9AZ0-")
            elif what < 0.7:
                del data[pos : pos + rng.randint(1, 20)]
            else:
                data[pos:pos] = data[rng.randrange(len(data)) :][: rng.randint(1, 40)]
        core.receive_datagram(bytes(data), ("10.0.0.1", 5000 + i % 50), i)
        for offered in [e for e in core.events() if isinstance(e, CallOffered)]:
            if rng.random() < 0.5:
                core.accept(offered.call_id, "127.0.0.1", 40000, i)
            else:
                core.reject(offered.call_id, 486, i)
        core.tick(i)
        core.datagrams_to_send()
    core.tick(10**9)  # every call left unanswered or unacknowledged times out (BYE)
    core.datagrams_to_send()
    core.events()
    core.receive_datagram(request("INVITE", call_id="after", branch="z9hG4bKafter", body=SDP), PEER, 10**9)
    assert [r.status for r in responses(core)] == [100]


def test_response_port_from_via_without_rport() -> None:
    core = uas()
    via = "Via: SIP/2.0/UDP 10.0.0.1:5070;branch=z9hG4bKinv;rport"
    core.receive_datagram(request("OPTIONS").replace(via.encode(), b"Via: SIP/2.0/UDP pbx.example:5080;branch=z9hG4bKo"), PEER, 0)
    core.receive_datagram(request("OPTIONS", call_id="o2").replace(via.encode(), b"Via: SIP/2.0/UDP 10.0.0.1:99999;branch=z9hG4bKp"), PEER, 0)
    first, second = core.datagrams_to_send()
    assert first.address == ("10.0.0.1", 5080)  # the source address, the Via's port; no DNS lookup
    assert b"received=10.0.0.1" in first.data
    assert second.address == ("10.0.0.1", 5060)  # an impossible port: the default


def test_delayed_offer_our_offer_in_the_200_the_answer_in_the_ack() -> None:
    """RFC 3261 §13.2.1, RFC 3264 §6: no SDP in the INVITE → our offer (PCMU, PCMA, telephone-event) in the 200;
    the ACK's answer picks the media; a re-INVITE then gets an answer one version up."""
    core = uas()
    core.receive_datagram(request("INVITE"), PEER, 0)
    assert statuses(core) == [100]
    (offered,) = core.events()
    assert isinstance(offered, CallOffered) and offered.delayed_offer
    core.accept("c1", "127.0.0.1", 40000, 0)
    (ok,) = responses(core)
    assert ok.status == 200 and ok.header("Content-Type") == "application/sdp"
    sdp = ok.body.decode()
    assert "m=audio 40000 RTP/AVP 0 8 9 101\r\n" in sdp and "a=rtpmap:8 PCMA/8000" in sdp and "a=sendrecv" in sdp
    version = int(sdp.split("\r\n")[1].split()[2])
    tag = header_param(ok.header("To") or "", "tag")
    answer = SDP.replace("0 101", "8 101").replace("a=rtpmap:101", "a=rtpmap:8 PCMA/8000\r\na=rtpmap:101")
    core.receive_datagram(request("ACK", branch="z9hG4bKack", to_tag=tag, body=answer), PEER, 100)
    answered_, confirmed = core.events()
    assert isinstance(answered_, OfferAnswered) and confirmed == CallConfirmed("c1")
    choice = answered_.choice
    assert (choice.payload_type, choice.dtmf_payload_type, choice.remote_host, choice.remote_port) == (8, 101, "10.0.0.1", 30000)
    assert core.datagrams_to_send() == []  # the 200 is no longer retransmitted
    core.tick(T1_MS + 100)
    assert core.datagrams_to_send() == []
    core.receive_datagram(request("INVITE", cseq=2, branch="z9hG4bKre", to_tag=tag, body=answer.replace("a=rtpmap:101", "a=sendonly\r\na=rtpmap:101")), PEER, 1000)
    (reanswer,) = responses(core)
    lines = reanswer.body.decode().split("\r\n")
    assert int(lines[1].split()[2]) == version + 1 and "m=audio 40000 RTP/AVP 8 101" in lines and "a=recvonly" in lines


def test_delayed_offer_without_a_usable_answer_ends_with_our_bye() -> None:
    for body in ("", SDP.replace("0 101", "18 101")):  # no answer; a codec we did not offer
        core = uas()
        core.receive_datagram(request("INVITE"), PEER, 0)
        core.datagrams_to_send()
        core.events()
        core.accept("c1", "127.0.0.1", 40000, 0)
        (ok,) = responses(core)
        tag = header_param(ok.header("To") or "", "tag")
        core.receive_datagram(request("ACK", branch="z9hG4bKack", to_tag=tag, body=body), PEER, 100)
        assert core.events() == [CallEnded("c1", "bad_answer")]
        (bye,) = core.datagrams_to_send()
        message = parse_message(bye.data)
        assert isinstance(message, SipRequest) and message.method == "BYE" and bye.address == PEER
        assert core.dialogs["c1"].state is DialogState.ENDING


def test_an_srtp_call_keeps_our_key_through_a_hold_and_cannot_drop_to_plain_rtp() -> None:
    """An SDES offer answered in kind; a re-INVITE (hold) with the same key gets the same answer key and changes only
    the direction; one that falls back to plain RTP is refused 488 (the media would go out unprotected)."""
    inline = "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40 + "\r\n"
    srtp_sdp = SDP.replace("RTP/AVP", "RTP/SAVP") + inline
    core = uas()
    core.receive_datagram(request("INVITE", body=srtp_sdp), PEER, 0)
    assert statuses(core) == [100]
    (offered,) = core.events()
    assert isinstance(offered, CallOffered) and offered.choice.srtp is not None
    core.accept("c1", "127.0.0.1", 40000, 0)
    (ok,) = responses(core)
    ours = [line for line in ok.body.decode().split("\r\n") if line.startswith("a=crypto:1 ")]
    assert b"RTP/SAVP" in ok.body and len(ours) == 1
    tag = header_param(ok.header("To") or "", "tag")
    core.receive_datagram(request("ACK", branch="z9hG4bKa1", to_tag=tag), PEER, 10)
    core.events()
    core.receive_datagram(request("INVITE", cseq=2, branch="z9hG4bKh", to_tag=tag, body=srtp_sdp + "a=sendonly\r\n"), PEER, 1000)
    (hold,) = responses(core)
    assert hold.status == 200 and ours[0].encode() in hold.body and b"a=recvonly" in hold.body
    (changed,) = core.events()
    assert isinstance(changed, MediaChanged) and changed.choice.srtp == offered.choice.srtp
    core.receive_datagram(request("ACK", cseq=2, branch="z9hG4bKa2", to_tag=tag), PEER, 1010)
    core.receive_datagram(request("INVITE", cseq=3, branch="z9hG4bKp", to_tag=tag, body=SDP), PEER, 2000)
    assert statuses(core) == [488]
