"""Reliable provisional responses (RFC 3262) in the UAS core, under a fake clock: RSeq, retransmission until the
PRACK, RAck matching, the 504 when no PRACK comes."""

from __future__ import annotations

import pytest

from callbridge.sip.dialog import (
    CallEnded,
    CallOffered,
    DialogState,
    SipUas,
)
from callbridge.sip.message import SipResponse, header_param
from callbridge.sip.transaction import T1_MS, TIMEOUT_MS
from tests.sip.test_dialog import PEER, SDP, request, responses, statuses, uas

pytestmark = pytest.mark.core

REQUIRE_100REL = (("Require", "100rel"), ("Supported", "100rel"))


def ringing(core: SipUas, *headers: tuple[str, str]) -> SipResponse:
    """INVITE (with ``headers``) → 100, offered; ``ring`` → the 180."""
    core.receive_datagram(request("INVITE", body=SDP, headers=headers), PEER, 0)
    assert statuses(core) == [100]
    (offered,) = core.events()
    assert isinstance(offered, CallOffered)
    core.ring("c1", 0)
    (ring,) = responses(core)
    assert ring.status == 180
    return ring


def prack(ring: SipResponse, rack: str, *, branch: str = "z9hG4bKpr1", cseq: int = 2) -> bytes:
    tag = header_param(ring.header("To") or "", "tag")
    return request("PRACK", cseq=cseq, branch=branch, to_tag=tag, headers=(("RAck", rack),))


class TestReliable180:
    """§3: the UAS side."""

    def test_require_100rel_is_no_longer_refused(self) -> None:
        ring = ringing(uas(), *REQUIRE_100REL)
        rseq = ring.header("RSeq")
        assert ring.header("Require") == "100rel" and rseq is not None and 1 <= int(rseq) < 2**31

    def test_supported_only_gets_an_ordinary_180(self) -> None:
        ring = ringing(uas(), ("Supported", "100rel"))
        assert ring.header("RSeq") is None and ring.header("Require") is None

    def test_retransmitted_doubling_until_prack_then_200(self) -> None:
        core = uas()
        ring = ringing(core, *REQUIRE_100REL)
        due = []
        for _ in range(4):
            now = core.next_deadline_ms()
            assert now is not None
            core.tick(now)
            (again,) = responses(core)
            assert again.status == 180 and again.header("RSeq") == ring.header("RSeq")
            due.append(now)
        assert due == [T1_MS, 3 * T1_MS, 7 * T1_MS, 15 * T1_MS]  # 500, 1000, 2000, 4000 ms apart: no T2 cap
        core.receive_datagram(prack(ring, f"{ring.header('RSeq')} 1 INVITE"), PEER, due[-1] + 10)
        (ok,) = responses(core)
        assert ok.status == 200 and ok.cseq == (2, "PRACK")
        assert header_param(ok.header("To") or "", "tag") == header_param(ring.header("To") or "", "tag")
        core.tick(due[-1] + 10 * T1_MS)
        assert core.datagrams_to_send() == []  # no more 180s
        core.receive_datagram(prack(ring, f"{ring.header('RSeq')} 1 INVITE"), PEER, due[-1] + 20)
        assert statuses(core) == [200]  # a retransmitted PRACK: the same answer

    def test_prack_naming_another_response_gets_481(self) -> None:
        core = uas()
        ring = ringing(core, *REQUIRE_100REL)
        rseq = int(ring.header("RSeq") or 0)
        core.receive_datagram(prack(ring, f"{rseq + 1} 1 INVITE"), PEER, 10)
        core.receive_datagram(prack(ring, f"{rseq} 7 INVITE", branch="z9hG4bKpr2", cseq=3), PEER, 10)
        assert statuses(core) == [481, 481]
        core.tick(T1_MS)
        assert statuses(core) == [180]  # still unacknowledged

    def test_the_200_stops_the_180_and_a_late_prack_is_still_answered(self) -> None:
        core = uas()
        ring = ringing(core, *REQUIRE_100REL)
        core.accept("c1", "127.0.0.1", 40000, 100)
        assert statuses(core) == [200]
        core.receive_datagram(prack(ring, f"{ring.header('RSeq')} 1 INVITE"), PEER, 200)
        assert statuses(core) == [200]
        core.tick(T1_MS + 100)
        assert statuses(core) == [200]  # the INVITE's 2xx retransmission only (no ACK yet), no 180

    def test_no_prack_in_64_t1_rejects_with_504(self) -> None:
        core = uas()
        ringing(core, *REQUIRE_100REL)
        now = 0
        while core.dialogs["c1"].state is DialogState.OFFERED:
            now = core.next_deadline_ms() or 0
            core.tick(now)
        assert now == TIMEOUT_MS
        assert [r.status for r in responses(core)][-1] == 504
        assert CallEnded("c1", "no_prack") in core.events()

    def test_options_advertise_100rel_and_prack(self) -> None:
        core = uas()
        core.receive_datagram(request("OPTIONS", branch="z9hG4bKo"), PEER, 0)
        (ok,) = responses(core)
        assert ok.header("Supported") == "100rel" and "PRACK" in (ok.header("Allow") or "")
