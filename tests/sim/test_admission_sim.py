"""Admission under any interleaving (``sim/admission_sim.py``, issue #40): the server's own desk, book and fleet count
on a virtual clock hold their invariants over many seeds, the same seed replays the same run, and bugs planted in
the admission's code — each a way to admit too many or to turn callers away with room — are each caught."""

from __future__ import annotations

import asyncio

import pytest

from callbridge.bridge.admission import AdmissionBook, Refusal
from callbridge.bridge.answer_desk import AnswerDesk
from callbridge.bridge.answer_policy import AnswerKind
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.registry import CallSignal, MemoryCallRegistry
from callbridge.bridge.services import BridgeServices
from callbridge.config import load_settings
from callbridge.sim.admission_sim import AdmissionSim, admission_main, bridge_process, run_admission_seed
from callbridge.sim.fault_plan import Violation
from callbridge.sim.virtual_loop import Stalled, VirtualTimeLoop

pytestmark = pytest.mark.core

SEEDS = range(400)


def test_every_seed_holds_the_invariants() -> None:
    answered = refused = 0
    for seed in SEEDS:
        sim = run_admission_seed(seed)
        answered, refused = answered + sim.answered, refused + sim.refused
    assert answered > 1000 and refused > 1000  # both ways tried, many times


def test_a_seed_replays_exactly() -> None:
    first, second = AdmissionSim(41).run(), AdmissionSim(41).run()
    assert [(c.asked_ms, c.answered_ms, c.refused_ms, c.bound_ms, c.over_ms) for c in first.calls] == [
        (c.asked_ms, c.answered_ms, c.refused_ms, c.bound_ms, c.over_ms) for c in second.calls
    ]


def test_the_command_line_runs_seeds_and_replays_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert admission_main(None, 10, 5) == 0
    assert "5 admission seeds: 0 failed" in capsys.readouterr().out
    assert admission_main(3, 0, 0) == 0
    assert "answered" in capsys.readouterr().out


def test_the_virtual_clock_jumps_and_a_deadlock_is_said() -> None:
    async def sleeps() -> float:
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    assert VirtualTimeLoop().run(sleeps()) == 3600

    async def waits_forever() -> None:
        await asyncio.Event().wait()

    with pytest.raises(Stalled):
        VirtualTimeLoop().run(waits_forever())


def caught(what: str) -> Violation:
    for seed in SEEDS:
        try:
            run_admission_seed(seed)
        except Violation as exc:
            assert what in exc.what, exc
            return exc
    raise AssertionError("no seed caught the planted bug")


def test_an_answer_counted_only_once_its_stream_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of answers all pass before any stream binds: over ``max_calls``."""
    original = AdmissionBook.take

    def forgetting(self: AdmissionBook, call_id: str, now: float, cpu_percent: float) -> Refusal | None:
        refusal = original(self, call_id, now, cpu_percent)
        self.admitted.pop(call_id, None)
        return refusal

    monkeypatch.setattr(AdmissionBook, "take", forgetting)
    assert "answered at process" in str(caught("answered"))


def test_a_busy_answer_that_keeps_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call refused after its slot was taken (the fleet was full) keeps the slot: the next caller is refused with
    room."""
    monkeypatch.setattr(AnswerDesk, "give_back_admission", lambda self, call_id: None)
    caught("refused")


def test_a_call_over_that_the_fleet_still_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BridgeServices, "call_over", lambda self, call_id: None)
    caught("")


def test_a_stream_bound_elsewhere_whose_answer_keeps_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    async def not_told(self: BridgeServices, signal: CallSignal) -> None:
        return None

    monkeypatch.setattr(BridgeServices, "_bound_elsewhere", not_told)
    caught("refused")


def test_a_caller_who_hung_up_while_it_rang_keeping_the_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the simulator found (#40): the slot of a call hung up before its stream came was held to its time to
    live (15 s), refusing callers meanwhile."""
    monkeypatch.setattr(BridgeServices, "_rang_out", lambda self, call_id: None)
    caught("refused")


def test_a_call_hung_up_while_it_rang_frees_its_slot_at_once_here_and_where_it_was_answered() -> None:
    """The carrier's hang-up webhook for a call whose stream never came: the process that answered it takes the next
    call at once (``max_calls = 1``), whether the webhook reached it or another process (a signal)."""

    async def scenario() -> list[AnswerKind]:
        loop = asyncio.get_running_loop()
        registry = MemoryCallRegistry(clock=lambda: round(loop.time() * 1000))
        settings = load_settings(None, {"server": {"max_calls": 1, "max_calls_fleet": 2}, "engine": {"open_at_answer": "off"}})
        answering, other = bridge_process(settings, registry), bridge_process(settings, registry)
        for process in (answering, other):
            process.start_listening()
        kinds = []
        for call_id, hung_up_at in (("CA1", answering), ("CA2", other), ("CA3", answering)):
            kinds.append((await answering.desk.decide_answer(call_id, "sim")).kind)
            kinds.append((await answering.desk.decide_answer(f"{call_id}-next", "sim")).kind)  # full: busy
            await asyncio.sleep(1)
            await hung_up_at.call_ended_by_carrier(call_id, EndCause(EndReason.CALLER_HUNG_UP))
            await asyncio.sleep(0.1)  # a signal's round trip
        for process in (answering, other):
            await process.aclose_background()
        return kinds

    answer, busy = AnswerKind.ANSWER, AnswerKind.BUSY
    assert VirtualTimeLoop().run(scenario()) == [answer, busy] * 3
