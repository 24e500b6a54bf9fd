"""SIP flood budgets (issue #15 item 6), sans-I/O: per source and in total, on a millisecond clock."""

from __future__ import annotations

import pytest

from callbridge.sip.dialog import Dropped
from callbridge.sip.rate_limit import Budget, SourceBudgets
from tests.sip.test_dialog import PEER, request, statuses, uas

pytestmark = pytest.mark.core


def test_a_budget_refills_at_its_rate_up_to_its_burst() -> None:
    budget = Budget(rate_per_s=100, burst=200)
    assert sum(budget.take(0) for _ in range(250)) == 200  # starts full: the burst, then nothing
    assert sum(budget.take(100) for _ in range(50)) == 10  # 100 ms at 100/s
    assert sum(budget.take(60_000) for _ in range(500)) == 200  # idle a minute: full, never more


def test_each_source_has_its_own_budget_and_all_share_one() -> None:
    budgets = SourceBudgets(source_rate_per_s=10, total_rate_per_s=25)
    flooder = [budgets.take("192.0.2.66", 0) for _ in range(30)]
    assert flooder.count(None) == 20 and set(flooder[20:]) == {"source_rate"}
    assert [budgets.take("10.0.0.1", 0) for _ in range(3)] == [None, None, None]  # the trunk is not held up by it
    many = [budgets.take(f"198.51.100.{i}", 0) for i in range(40)]  # forged sources, one each
    assert many.count(None) == 50 - 23 and set(many[27:]) == {"total_rate"}


def test_sources_held_are_bounded_and_idle_ones_forgotten() -> None:
    budgets = SourceBudgets(source_rate_per_s=10, total_rate_per_s=1e9, max_sources=100)
    for i in range(1000):
        budgets.take(f"203.0.113.{i % 250}.{i}", 0)
    assert budgets.source_count == 100
    budgets.take("10.0.0.1", 10_000)  # 10 s later every one of them is full again: forgotten
    assert budgets.source_count == 1


def test_a_flood_is_dropped_unread_beyond_its_budget_and_counted() -> None:
    core = uas(source_requests_per_s=50)
    for i in range(300):  # 300 OPTIONS in the same millisecond from one peer
        core.receive_datagram(request("OPTIONS", call_id=f"o{i}", branch=f"z9hG4bKo{i}"), PEER, 0)
    assert statuses(core) == [200] * 100  # the burst (twice the rate) answered
    dropped = [e for e in core.events() if isinstance(e, Dropped)]
    assert len(dropped) == 200 and {e.reason for e in dropped} == {"source_rate"}
    core.receive_datagram(request("OPTIONS", call_id="later", branch="z9hG4bKlater"), PEER, 1000)
    assert statuses(core) == [200]  # a second later its budget has refilled


def test_the_shipped_budget_takes_a_busy_trunk() -> None:
    """200 datagrams a second from one source, 400 in a burst: a trunk starting 20 calls a second (INVITE, ACK,
    BYE, its OPTIONS pings and DTMF INFOs) sends well under it."""
    core = uas()
    for second in range(5):
        for i in range(150):
            call = f"c{second}-{i}"
            core.receive_datagram(request("OPTIONS", call_id=call, branch=f"z9hG4bK{call}"), PEER, second * 1000 + i * 6)
    assert statuses(core) == [200] * 750
    assert not [e for e in core.events() if isinstance(e, Dropped)]
