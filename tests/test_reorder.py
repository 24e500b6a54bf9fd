"""The one reorder helper (``callbridge/reorder.py``) behind RTP's jitter buffer and Telnyx's media order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callbridge.reorder import Missing, Placed, Reorder

pytestmark = pytest.mark.core


def test_early_items_wait_for_the_ones_before_them() -> None:
    order: Reorder[str] = Reorder(3)
    assert order.push(10, "a") == (Placed.TAKEN, ["a"])
    assert order.push(12, "c") == (Placed.AHEAD, [])
    assert order.push(11, "b") == (Placed.TAKEN, ["b", "c"])
    assert order.push(11, "b") == (Placed.BEHIND, [])
    assert order.push(14, "e") == (Placed.AHEAD, []) and order.push(14, "e") == (Placed.DUPLICATE, [])


def test_a_gap_is_given_up_once_an_item_reach_numbers_past_it_arrives() -> None:
    order: Reorder[int] = Reorder(2)
    order.push(1, 1)
    assert order.push(3, 3) == (Placed.AHEAD, [])  # 2 missing; 3 is one past it
    assert order.push(4, 4) == (Placed.AHEAD, [Missing(2), 3, 4])
    assert order.push(2, 2) == (Placed.BEHIND, [])


def test_a_long_gap_is_given_up_as_one_run_not_number_by_number() -> None:
    """A hostile jump (a sequence number 10**12 ahead) is one ``Missing`` run, not 10**12 of them; the item waits
    only for the ``reach - 1`` numbers just before it."""
    order: Reorder[int] = Reorder(4)
    order.push(1, 1)
    assert order.push(10**12, 7) == (Placed.AHEAD, [Missing(2, 10**12 - 5)])
    assert order.next == 10**12 - 3 and list(order.held) == [10**12]
    assert order.push(10**12 + 1, 8) == (Placed.AHEAD, [Missing(10**12 - 3)])  # one more behind it gives one up


def test_numbers_wrap_with_a_modulus() -> None:
    order: Reorder[int] = Reorder(2, modulus=0x10000)
    order.push(65534, 0)
    assert order.push(0, 2) == (Placed.AHEAD, [])  # 65535 missing
    assert order.push(1, 3) == (Placed.AHEAD, [Missing(65535), 2, 3])
    assert order.distance(65535) == -3 and order.next == 2


def test_flush_releases_what_is_held_in_order_without_the_gaps() -> None:
    order: Reorder[str] = Reorder(10)
    order.push(1, "a")
    order.push(5, "e")
    order.push(3, "c")
    assert order.flush() == ["c", "e"] and order.next == 6 and not order.held


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=60), st.integers(min_value=0, max_value=5))
def test_what_comes_out_is_in_order_never_twice_and_every_number_accounted_for(arrivals: list[int], reach: int) -> None:
    order: Reorder[int] = Reorder(reach)
    released: list[int] = []
    for sequence in arrivals:
        placed, due = order.push(sequence, sequence)
        for item in due:
            released.extend(range(item.sequence, item.sequence + item.count) if isinstance(item, Missing) else [item])
        assert len(order.held) <= reach
    released.extend(order.flush())
    assert released == sorted(set(released))  # in order, each number once
    assert set(released) >= {s for s in arrivals if s >= arrivals[0]} if arrivals else True
