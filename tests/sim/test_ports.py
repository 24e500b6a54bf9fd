"""Ports for test servers: each pytest-xdist worker has its own slice of the range, handed out in turn."""

from __future__ import annotations

import pytest

from callbridge.sim import ports


def test_each_worker_has_its_own_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    slices = []
    for index in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        slices.append(set(ports._ports()))
    assert all(len(s) == 3000 for s in slices)
    assert all(a.isdisjoint(b) for i, a in enumerate(slices) for b in slices[i + 1 :])
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert ports._ports() == range(20_000, 23_000)  # no worker named: the first slice


def test_ports_are_handed_out_in_turn_never_two_neighbours_and_free() -> None:
    found = [ports.free_port() for _ in range(50)]
    assert len(set(found)) == 50 and all(port in ports._PORTS for port in found)
    assert all(abs(a - b) > 1 for a in found for b in found if a != b)  # a peer may bind port + 1 too
    assert all(ports._stride(size) > 1 for size in (12_000, 6000, 4000, 3000, 2400, 2000, 1714, 1500))
    with ports.bound_socket() as held:
        assert held.getsockname()[1] in ports._PORTS
