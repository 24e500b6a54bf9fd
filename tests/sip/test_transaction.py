"""SIP's retransmission timers, once (``sip/transaction.py``), and REFER's own rules (``sip/refer.py``)."""

from __future__ import annotations

import pytest

from callbridge.sip.refer import Transfer, TransferOutcome, notify_status, refer_to, sipfrag_status
from callbridge.sip.transaction import T1_MS, T2_MS, TIMEOUT_MS, Due, Retransmission, TxKind

pytestmark = pytest.mark.core

PEER = ("192.0.2.1", 5060)


def run(kind: TxKind, transport: str) -> tuple[list[int], list[int]]:
    """Every resend until it gives up: when each fell due, and when a datagram went."""
    tx = Retransmission.start(kind, b"msg", PEER, transport, 0)
    due_at: list[int] = []
    sent_at: list[int] = []
    now = 0
    while (now := tx.deadline_ms) and tx.due(now) is Due.RESEND:
        due_at.append(now)
        if tx.resend(now):
            sent_at.append(now)
    assert tx.due(now) is Due.GIVE_UP and now == TIMEOUT_MS
    return due_at, sent_at


@pytest.mark.parametrize("kind", [TxKind.BYE, TxKind.REFER, TxKind.REGISTER, TxKind.INVITE_FINAL, TxKind.INVITE_2XX])
def test_over_udp_every_kind_doubles_from_t1_to_t2_and_gives_up_at_64_t1(kind: TxKind) -> None:
    due_at, sent_at = run(kind, "UDP")
    assert due_at[:5] == [T1_MS, 3 * T1_MS, 7 * T1_MS, 7 * T1_MS + T2_MS, 7 * T1_MS + 2 * T2_MS]
    assert sent_at == due_at


@pytest.mark.parametrize("kind", [TxKind.BYE, TxKind.REFER, TxKind.REGISTER, TxKind.INVITE_FINAL])
def test_over_tcp_the_transaction_layer_sends_nothing_again_but_still_times_out(kind: TxKind) -> None:
    due_at, sent_at = run(kind, "TCP")
    assert due_at and sent_at == []


def test_a_2xx_to_an_invite_goes_again_over_tcp_too() -> None:
    due_at, sent_at = run(TxKind.INVITE_2XX, "TCP")
    assert sent_at == due_at and len(sent_at) > 5


def test_a_reliable_provisional_doubles_without_the_t2_cap() -> None:
    due_at, sent_at = run(TxKind.RELIABLE_1XX, "TCP")
    assert due_at == [T1_MS * (2**k - 1) for k in range(1, 7)]  # 0.5, 1.5, 3.5, 7.5, 15.5, 31.5 s
    assert sent_at == due_at


def test_a_provisional_answer_slows_the_request_to_t2() -> None:
    tx = Retransmission.start(TxKind.REGISTER, b"REGISTER", PEER, "UDP", 0)
    tx.provisional_received(100)
    assert tx.due(100 + T2_MS - 1) is Due.WAIT and tx.due(100 + T2_MS) is Due.RESEND


def test_a_refer_answered_202_waits_for_the_notify_that_decides() -> None:
    transfer = Transfer(cseq=2, deadline_ms=TIMEOUT_MS)
    assert transfer.on_response(100, "Trying") is None and not transfer.accepted
    assert transfer.on_response(202, "Accepted") is None and transfer.accepted
    assert transfer.on_notify(b"SIP/2.0 100 Trying\r\n", "active;expires=60") is None
    assert transfer.on_notify(b"SIP/2.0 180 Ringing", "active") is None
    assert transfer.on_notify(b"SIP/2.0 200 OK\r\n", "terminated;reason=noresource") == TransferOutcome(True, 200, "OK")


def test_a_transfer_fails_on_a_refusal_a_failed_target_a_bare_termination_or_silence() -> None:
    assert Transfer(2, TIMEOUT_MS).on_response(403, "Forbidden") == TransferOutcome(False, 403, "Forbidden")
    assert Transfer(2, TIMEOUT_MS).on_notify(b"SIP/2.0 486 Busy Here", "active") == TransferOutcome(False, 486, "Busy Here")
    ended = Transfer(2, TIMEOUT_MS).on_notify(b"SIP/2.0 180 Ringing", "terminated")
    assert ended is not None and not ended.ok and ended.status == 180
    waiting = Transfer(2, deadline_ms=1000)
    assert waiting.expired(5000) is None  # not accepted yet: the REFER's own retransmission times it out
    waiting.on_response(202, "Accepted")
    assert waiting.expired(999) is None and waiting.expired(1000) == TransferOutcome(False, 408, "no final NOTIFY for the REFER")


def test_refer_to_a_number_goes_to_the_trunk_and_only_refer_events_are_taken() -> None:
    assert refer_to("+15551234567", "192.0.2.1:5060") == "sip:+15551234567@192.0.2.1:5060"
    assert refer_to("tel:+15551234567", "192.0.2.1:5060") == "tel:+15551234567"
    assert notify_status("refer;id=2") == 200 and notify_status(" REFER ") == 200
    assert notify_status("presence") == 489 and notify_status("") == 489
    assert sipfrag_status(b"not a status line") == (None, "not a status line")
