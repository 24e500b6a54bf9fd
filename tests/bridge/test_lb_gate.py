"""``LoadBalancerGate``: a draining process moves its calls once the load balancer's readiness checks have taken
it out, or after its wait where none come."""

from __future__ import annotations

import pytest

from callbridge.bridge.fleet import LB_ACTS_S, LoadBalancerGate
from callbridge.config import Settings

pytestmark = pytest.mark.core


def _shipped(began_s: float = 100.0) -> LoadBalancerGate:
    server = Settings().server
    return LoadBalancerGate(began_s, server.drain_lb_checks, server.drain_lb_wait_s)


def test_shut_until_a_check_is_answered_then_open_once_the_load_balancer_has_acted() -> None:
    gate = _shipped()
    assert not gate.taken_out(100.0) and not gate.taken_out(101.0)
    gate.answered_unready(101.2)  # HAProxy's check, 1 s interval: within a second of the signal
    assert not gate.taken_out(101.2) and not gate.taken_out(101.2 + LB_ACTS_S - 0.01)
    assert gate.taken_out(101.2 + LB_ACTS_S)
    assert gate.reason == "readiness_checked"


def test_with_no_check_it_opens_at_the_wait() -> None:
    gate = _shipped()
    wait_s = Settings().server.drain_lb_wait_s
    assert wait_s >= 2.0  # longer than the shipped HAProxy check interval (1 s) with room for its check
    assert not gate.taken_out(100.0 + wait_s - 0.01)
    assert gate.taken_out(100.0 + wait_s)
    assert gate.reason == "waited"


def test_a_load_balancer_that_needs_several_checks_is_waited_for() -> None:
    gate = LoadBalancerGate(0.0, checks=3, wait_s=30.0)
    for at_s in (1.0, 2.0):
        gate.answered_unready(at_s)
        assert not gate.taken_out(at_s + 0.5)
    gate.answered_unready(3.0)
    assert not gate.taken_out(3.1) and gate.taken_out(3.0 + LB_ACTS_S)
