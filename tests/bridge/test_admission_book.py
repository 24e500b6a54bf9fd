"""The admission core (``bridge/admission.py``) on a clock passed in: slots held from the answer, bound by the
stream, lapsing, given back; the CPU budget; a call already held or bridged is never refused."""

from __future__ import annotations

import pytest

from callbridge.bridge.admission import AdmissionBook, Refusal

pytestmark = pytest.mark.core


def test_an_answer_holds_its_slot_at_once_so_a_burst_cannot_all_pass() -> None:
    book = AdmissionBook(max_calls=2, hold_s=30)
    assert [book.take(f"c{i}", now=0.0, cpu_percent=0) for i in range(4)] == [None, None, Refusal.MAX_CALLS, Refusal.MAX_CALLS]
    assert book.held(0.0) == 2 and book.holding() == ["c0", "c1"]


def test_a_held_or_bridged_call_is_taken_again_even_when_full_or_over_budget() -> None:
    book = AdmissionBook(max_calls=1, cpu_budget_percent=50, hold_s=30)
    assert book.take("a", 0.0, cpu_percent=10) is None
    assert book.take("a", 1.0, cpu_percent=99) is None  # its stream comes back while the CPU is busy
    book.bound("a")
    assert book.bridged == {"a"} and book.admitted == {}
    assert book.take("a", 2.0, cpu_percent=99) is None
    assert book.take("b", 2.0, cpu_percent=10) is Refusal.MAX_CALLS


def test_over_the_cpu_budget_a_new_call_is_refused_and_no_budget_means_none() -> None:
    assert AdmissionBook(max_calls=5, cpu_budget_percent=85).take("a", 0.0, cpu_percent=85.1) is Refusal.CPU_BUDGET
    assert AdmissionBook(max_calls=5, cpu_budget_percent=85).take("a", 0.0, cpu_percent=85.0) is None
    assert AdmissionBook(max_calls=5, cpu_budget_percent=0).take("a", 0.0, cpu_percent=400) is None


def test_a_slot_whose_stream_never_comes_lapses_after_the_hold() -> None:
    book = AdmissionBook(max_calls=1, hold_s=30)
    assert book.take("a", 0.0, 0) is None
    assert book.take("b", 29.9, 0) is Refusal.MAX_CALLS
    assert book.take("b", 30.0, 0) is None  # a's slot lapsed at 30 s
    assert not book.knows("a") and book.knows("b")


def test_a_refusal_after_admission_gives_the_slot_back_once() -> None:
    book = AdmissionBook(max_calls=1)
    book.take("a", 0.0, 0)
    assert book.give_back("a") is True and book.give_back("a") is False
    assert book.take("b", 0.0, 0) is None


def test_a_stream_that_ends_frees_its_place_and_a_bound_call_never_lapses() -> None:
    book = AdmissionBook(max_calls=1, hold_s=1)
    book.take("a", 0.0, 0)
    book.bound("a")
    assert book.held(3600.0) == 1  # bridged: no hold to lapse
    book.unbound("a")
    assert book.held(3600.0) == 0 and book.take("b", 3600.0, 0) is None


def test_an_empty_call_id_is_admitted_but_holds_nothing() -> None:
    """Carriers whose answer has no call id yet (checked again when the stream names it)."""
    book = AdmissionBook(max_calls=1)
    assert book.take("", 0.0, 0) is None and book.held(0.0) == 0
