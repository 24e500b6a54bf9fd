"""The answer policy every carrier renders (``callbridge.bridge.answer_policy``), as a table: which facts it asks
for, in which order, and what it decides — pure, no registry or engine."""

from __future__ import annotations

import pytest

from callbridge.bridge.answer_policy import (
    AnswerDecision,
    AnswerFact,
    AnswerKind,
    RestartDecision,
    answer_step,
    restart_decision,
)

pytestmark = pytest.mark.core

F = AnswerFact


def run(known: dict[AnswerFact, bool], *, retries: bool = True, draining: bool = False) -> tuple[list[AnswerFact], AnswerDecision]:
    """Answer the policy's questions from ``known`` (a question it asks that is not there fails the test)."""
    asked: list[AnswerFact] = []
    facts: dict[AnswerFact, bool] = {}
    while isinstance(step := answer_step(facts, retries=retries, draining=draining), AnswerFact):
        asked.append(step)
        facts[step] = known[step]
    return asked, step


@pytest.mark.parametrize(
    ("known", "retries", "draining", "asked", "decision"),
    [
        ({F.ENDED: True}, True, False, [F.ENDED], AnswerDecision(AnswerKind.HANG_UP)),
        (
            {F.ENDED: False, F.MOVING_ELSEWHERE: True}, True, True, [F.ENDED, F.MOVING_ELSEWHERE],
            AnswerDecision(AnswerKind.RETRY_ELSEWHERE, reason="draining"),
        ),
        (
            {F.ENDED: False, F.MOVING_ELSEWHERE: False, F.NEW_CALL_BOUNCES: True}, True, True,
            [F.ENDED, F.MOVING_ELSEWHERE, F.NEW_CALL_BOUNCES], AnswerDecision(AnswerKind.RETRY_ELSEWHERE, reason="draining_new_call"),
        ),
        (
            {F.ENDED: False, F.ADMITTED: False}, False, True, [F.ENDED, F.ADMITTED],  # no retries: never asks about moving
            AnswerDecision(AnswerKind.BUSY, reason="draining"),
        ),
        (
            {F.ENDED: False, F.MOVING_ELSEWHERE: False, F.NEW_CALL_BOUNCES: False, F.ADMITTED: False}, True, False,
            [F.ENDED, F.MOVING_ELSEWHERE, F.NEW_CALL_BOUNCES, F.ADMITTED], AnswerDecision(AnswerKind.BUSY, reason="capacity"),
        ),
        (
            {F.ENDED: False, F.ADMITTED: True, F.ENGINE_TAKES: False}, False, False, [F.ENDED, F.ADMITTED, F.ENGINE_TAKES],
            AnswerDecision(AnswerKind.BUSY, reason="engine_capacity"),
        ),
        (
            {F.ENDED: False, F.MOVING_ELSEWHERE: False, F.NEW_CALL_BOUNCES: False, F.ADMITTED: True, F.ENGINE_TAKES: True}, True,
            False, [F.ENDED, F.MOVING_ELSEWHERE, F.NEW_CALL_BOUNCES, F.ADMITTED, F.ENGINE_TAKES], AnswerDecision(AnswerKind.ANSWER),
        ),
    ],
)  # fmt: skip
def test_each_answer_asks_only_what_it_needs_in_order(
    known: dict[AnswerFact, bool], retries: bool, draining: bool, asked: list[AnswerFact], decision: AnswerDecision
) -> None:
    assert run(known, retries=retries, draining=draining) == (asked, decision)


def test_admission_and_the_engine_are_asked_only_when_the_answer_can_still_be_yes() -> None:
    """Admission reserves a slot and the engine opens a session: neither for a call that is over or moving."""
    for known in ({F.ENDED: True}, {F.ENDED: False, F.MOVING_ELSEWHERE: True}):
        asked, _ = run(known)
        assert F.ADMITTED not in asked and F.ENGINE_TAKES not in asked


@pytest.mark.parametrize(
    ("restarts", "admitted", "draining", "decision"),
    [
        (1, True, False, RestartDecision(restart=True)),
        (5, True, False, RestartDecision(restart=True)),
        (6, True, False, RestartDecision(hang_up_reason="stream_restarts_exhausted")),
        (2, False, False, RestartDecision(hang_up_reason="capacity")),
        (2, False, True, RestartDecision(hang_up_reason="draining")),
    ],
)
def test_a_stopped_stream_restarts_while_it_may_else_the_call_is_hung_up(
    restarts: int, admitted: bool, draining: bool, decision: RestartDecision
) -> None:
    assert restart_decision(restarts=restarts, max_restarts=5, admitted=admitted, draining=draining) == decision
