"""The deterministic fault simulator (``callbridge.sim.faults``): 1,000 seeds pass every invariant, a seed replays
exactly, and bugs planted in the cores are each caught by some seed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest

from callbridge.bridge import limits as limits_module
from callbridge.bridge import turns as turns_module
from callbridge.bridge.binding import EngineBinding
from callbridge.bridge.call import CallSession
from callbridge.bridge.heard import HeardAccount
from callbridge.bridge.inbound import MESSAGE_BURST, MESSAGES_PER_S, MessageBucket
from callbridge.bridge.lifecycle import CallLifecycle, CloseWaiting, StreamFacts
from callbridge.bridge.registry import CallClaim
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.compiled import compiled_modules
from callbridge.engine.commands import CreateTextItem, EngineCommand
from callbridge.sim.fault_models import EngineServerModel, RegistryModel
from callbridge.sim.faults import (
    SimulatedCall,
    SimulatedCalls,
    Violation,
    calls_plan_for,
    main,
    plan_for,
    run_calls_seed,
    run_seed,
)
from tests.conftest import PATCHES_A_COMPILED_METHOD

pytestmark = [pytest.mark.hot_path, pytest.mark.background]
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

SEEDS_PER_TEST = 100


@pytest.mark.parametrize("first", range(0, 1000, SEEDS_PER_TEST))
def test_every_seed_keeps_every_invariant(first: int) -> None:
    violations = []
    outcomes: set[str] = set()
    for seed in range(first, first + SEEDS_PER_TEST):
        try:
            outcomes.add(run_seed(seed).outcome or "")
        except Violation as exc:
            violations.append(str(exc))
    assert violations == []
    assert "caller_hung_up" in outcomes and "failure_tone_and_hang_up" in outcomes  # the faults were exercised


def test_the_plans_exercise_every_fault() -> None:
    plans = [plan_for(seed) for seed in range(1000)]
    assert sum(bool(p.drops_at_ms) for p in plans) > 300
    assert sum(p.engine_dies_at_ms is not None for p in plans) > 200
    assert sum(p.read_stall is not None for p in plans) > 200
    assert sum(p.repeated_echoes for p in plans) > 200
    assert sum(p.reordered_echoes for p in plans) > 200
    assert sum(p.bridge_crashes_at_ms is not None for p in plans) > 150
    assert sum(p.bridge_drains_at_ms is not None for p in plans) > 120
    assert sum(p.half_open_drops and bool(p.drops_at_ms) for p in plans) > 150
    assert sum(p.registry_lost_at_ms is not None for p in plans) > 120
    assert sum(p.registry_stall is not None for p in plans) > 120
    assert sum(p.process_stall is not None for p in plans) > 100
    assert sum(p.process_stall is not None and p.process_stall[1] > 20_000 and sum(p.process_stall) < p.hangup_at_ms for p in plans) > 20
    assert sum(len(p.utterances) > 1 for p in plans) > 500
    assistants = [p.assistant for p in plans if p.assistant is not None]  # bound as the server binds them
    assert sum(a.greeting is not None for a in assistants) > 400
    assert sum(a.greeting_interruptible is False for a in assistants) > 200
    assert sum(bool(a.recording) for a in assistants) > 250
    assert sum(a.silence_reprompt_after_s is not None for a in assistants) > 250
    assert sum(a.silence_hangup_after_s is not None for a in assistants) > 120


def test_the_call_s_application_is_under_fault_too() -> None:
    """Greetings, recordings and silence prompts run through the faults: a greeted call's engine is told the
    greeting first, before the caller speaks (an ungreeted one never), and a caller who holds on silently (through a stall of a process since drained) is said goodbye to
    and hung up on — an outcome the caller hears, with its own checks."""
    for seed in range(20):
        assistant = plan_for(seed).assistant
        said: list[tuple[int, str]] = []
        sim = SimulatedCall(seed)
        check_command = sim._check_command

        def spying(command: EngineCommand, sim: SimulatedCall = sim, said: list[tuple[int, str]] = said) -> None:
            if isinstance(command, CreateTextItem):
                said.append((sim.now_ms, command.text))
            check_command(command)

        sim._check_command = spying  # type: ignore[method-assign]
        sim.run()
        if assistant is not None and assistant.greeting is not None:  # told at the first stream's bind, first
            assert said and said[0][1] == assistant.greeting and said[0][0] < sim.plan.utterances[0][0], seed
        else:
            assert all(text != "Greet the caller." for _, text in said), seed
    assert run_seed(1009).outcome == "caller_silent"


def test_a_crashed_bridges_call_is_resumed_from_its_live_ticket() -> None:
    """Seeds whose bridge dies mid-call with the engine alive: the next stream takes the session over (the same
    one: the call's only session), within ``TAKEOVER_BOUND_MS`` (checked in the run), and the call goes on."""
    seeds = [s for s in range(300) if plan_for(s).bridge_crashes_at_ms is not None and plan_for(s).engine_dies_at_ms is None]
    runs = [run_seed(seed) for seed in seeds]
    taken_over = [run for run in runs if run.crashed_at_ms is not None]
    assert len(taken_over) > 30
    assert all(run.sessions == 1 and run.streams >= 2 for run in taken_over)
    assert sum(run.outcome == "caller_hung_up" for run in taken_over) > 30


def test_a_drained_bridges_call_resumes_on_the_next_stream() -> None:
    """Seeds whose bridge drains mid-call with the engine alive: the stream moves (parked, socket closed going
    away), the next one resumes the same session (checked in the run), and the call goes on to its end."""
    seeds = [s for s in range(300) if plan_for(s).bridge_drains_at_ms is not None and plan_for(s).engine_dies_at_ms is None]
    runs = [run_seed(seed) for seed in seeds]
    moved = [run for run in runs if run.drained and run.crashed_at_ms is None and run.streams >= 2]
    assert len(moved) > 20
    assert all(run.sessions == 1 for run in moved)
    assert sum(run.outcome == "caller_hung_up" for run in moved) > 20


def test_a_call_the_registry_lost_is_resumable_from_it_again() -> None:
    """The registry loses the call (Redis restarted empty) at 600 ms while it is live, and its bridge dies at 2.4 s
    with the engine alive: the live stream's checkpoint wrote the record anew (within ``RESTORE_BOUND_MS``, checked
    in the run), so the next stream takes the same session over rather than open a new one."""
    lost_then_crashed = {"registry_lost_at_ms": 600, "bridge_crashes_at_ms": 2400, "engine_dies_at_ms": None, "drops_at_ms": (),
                         "bridge_drains_at_ms": None}  # fmt: skip
    runs = [SimulatedCall(seed, plan=replace(plan_for(seed), **lost_then_crashed)).run() for seed in range(100)]
    taken_over = [run for run in runs if run.crashed_at_ms is not None and run.streams >= 2]
    assert len(taken_over) > 30
    assert all(run.sessions == 1 for run in taken_over)
    assert sum(run.outcome == "caller_hung_up" for run in taken_over) > 30


def test_a_seed_replays_exactly() -> None:
    seed = next(s for s in range(100) if plan_for(s).drops_at_ms and plan_for(s).read_stall)
    first, second = run_seed(seed), run_seed(seed)
    assert (first.outcome, first.streams, first.heard_told) == (second.outcome, second.streams, second.heard_told)
    assert first.streams > 1 and first.heard_told


def test_the_command_line_runs_seeds_and_replays_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "5", "--first", "10"]) == 0
    assert "5 seeds: 0 failed" in capsys.readouterr().out
    assert main(["--seed", "3"]) == 0
    assert "outcome:" in capsys.readouterr().out


def first_violation(seeds: Iterable[int], **plan_changes: Any) -> Violation:
    """The first seed of ``seeds`` whose run (its plan changed by ``plan_changes``) breaks an invariant."""
    for seed in seeds:
        try:
            SimulatedCall(seed, plan=replace(plan_for(seed), **plan_changes)).run()
        except Violation as exc:
            return exc
    raise AssertionError(f"no seed in {seeds} caught the planted bug")


class TestPlantedBugsAreCaught:
    def test_a_message_the_carrier_would_refuse(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The far end is the carrier's own reading (``read_outbound``): a mark with a key Twilio does not know
        raises its 31951 warning, and the simulation stops there."""
        original = TwilioCodec.send

        def chatty(codec: TwilioCodec, action: Any) -> str | None:
            message = original(codec, action)
            return message.replace('"mark":{', '"extra":1,"mark":{') if message is not None and '"event":"mark"' in message else message

        monkeypatch.setattr(TwilioCodec, "send", chatty)
        assert "the carrier refused a message from the bridge: 31951 invalid message" in first_violation(range(20)).what

    def test_heard_positions_restarting_on_the_next_stream(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = CallSession.engine_bound

        def forgetting(call: CallSession, binding: EngineBinding, now_ms: int) -> None:
            original(call, replace(binding, heard_ms=(), told_ms=()), now_ms)  # heard positions dropped

        monkeypatch.setattr(CallSession, "engine_bound", forgetting)
        assert "went back" in first_violation(range(400)).what

    def test_a_takeover_telling_its_replayed_barge_in_at_once(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Seeds 2600 and 2805: a registry stall kept a barge-in off the live ticket, then the bridge died; what the
        taking-over stream tells of the replayed barge-in, from the older ticket, falls short of what was told."""
        original = CallSession.engine_bound

        def not_holding(call: CallSession, binding: EngineBinding, now_ms: int) -> None:
            original(call, replace(binding, taken_over=False), now_ms)

        monkeypatch.setattr(CallSession, "engine_bound", not_holding)
        assert "went back" in first_violation([2600, 2805]).what

    @PATCHES_A_COMPILED_METHOD
    def test_acks_past_the_audio_generated(self, monkeypatch: pytest.MonkeyPatch) -> None:
        unclamped = lambda account, response_id, heard_ms: heard_ms + account.heard_before(response_id)  # noqa: E731
        monkeypatch.setattr(HeardAccount, "on_call", unclamped)
        assert "which has only" in first_violation(range(100)).what

    def test_a_drop_that_closes_the_session_instead_of_parking_it(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = CallLifecycle.stream_ended

        def closing(life: CallLifecycle, stream: StreamFacts, *, session_closed: bool) -> None:
            original(life, replace(stream, detach=False), session_closed=session_closed)  # closed, not kept

        monkeypatch.setattr(CallLifecycle, "stream_ended", closing)
        assert "without parking it" in first_violation(range(100)).what

    def test_a_parked_session_left_behind_for_a_new_one(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = CallLifecycle.call_claimed

        def ignoring(life: CallLifecycle, claim: CallClaim, now_ms: int) -> None:
            original(life, replace(claim, ticket=None), now_ms)  # the ticket taken, then never resumed

        monkeypatch.setattr(CallLifecycle, "call_claimed", ignoring)
        assert "second engine session while the call's first is still detached" in first_violation(range(100)).what

    def test_a_crashed_bridges_call_reopened_instead_of_taken_over(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The failure as it was: a stream whose call a dead process held waited, then opened a new session."""
        original = CallLifecycle.call_claimed

        def blind(life: CallLifecycle, claim: CallClaim, now_ms: int) -> None:
            original(life, replace(claim, live_holder=None), now_ms)  # the live ticket not seen

        monkeypatch.setattr(CallLifecycle, "call_claimed", blind)
        caught = first_violation(range(100)).what  # seen as it binds, or as it opens beside the detached session
        assert "not resumed from its live ticket" in caught or "second engine session while the call's first is still detached" in caught

    def test_a_crashed_bridges_call_waited_for_though_its_process_is_known_gone(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The wait as it was before #40: a killed process no longer listens, yet its call's next stream waits
        ``TAKEOVER_AFTER_MS`` for a detach that never comes (the caller hears that much more silence)."""
        original = CallLifecycle.old_stream_nudged

        def deaf(life: CallLifecycle, *, gone: bool, now_ms: int) -> None:
            original(life, gone=False, now_ms=now_ms)  # whether the holder's process listens, not heard

        monkeypatch.setattr(CallLifecycle, "old_stream_nudged", deaf)
        assert "the call of a crashed bridge waited" in first_violation(range(200)).what

    def test_a_drain_that_closes_the_session_instead_of_parking_it(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A move off a draining process that ends the stream as if the call were over (its session closed): the
        next stream has nothing to resume, and a conversation would restart on a new session."""

        def closing(life: CallLifecycle, stream: StreamFacts) -> None:
            life.stream_ended(replace(stream, detach=False), session_closed=False)

        monkeypatch.setattr(CallLifecycle, "moving_elsewhere", closing)
        caught = first_violation(range(300)).what
        assert any(what in caught for what in ("moved off a draining bridge was bound", "whose live one the bridge closed", "without parking it")), caught

    def test_a_half_open_stream_deaf_to_its_supersede(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A stream that does not end when told a newer one has come: the newer one waits, then takes the session
        from its live ticket, instead of resuming what the old one would have parked."""
        monkeypatch.setattr(CallSession, "superseded", lambda call, now_ms: None)
        assert "not resumed from what it parked" in first_violation(range(300)).what

    def test_a_call_over_before_its_stream_claimed_the_parked_session(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The leak the half-open drops found: the caller hangs up while the new stream waits for the superseded
        one's ticket; without ``CloseWaiting`` the session it parked is left to the engine's grace."""
        original = CallLifecycle.next_step

        def skipping(life: CallLifecycle) -> Any:
            step = original(life)
            return original(life) if isinstance(step, CloseWaiting) else step

        monkeypatch.setattr(CallLifecycle, "next_step", skipping)
        assert "left detached" in first_violation(range(300)).what

    @PATCHES_A_COMPILED_METHOD
    def test_a_takeover_that_forgets_what_the_engine_was_told(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without the live ticket's ``told_ms``, a stream that took over re-acks a reply the dead one had cut lower."""
        monkeypatch.setattr(HeardAccount, "told_so_far", property(lambda heard: ()))
        # drops that close both ends: a half-open old stream would be superseded and park, not be taken over
        assert "went back" in first_violation(range(1000, 1100), half_open_drops=False).what

    def test_a_checkpoint_that_does_not_write_a_lost_record_anew(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The failure as it was: a live stream took the record the registry lost for a takeover, and stopped
        writing it; a crash then gave the call a new session (the agent forgot it)."""
        monkeypatch.setattr(RegistryModel, "is_empty", lambda record: False)
        assert "has not written it again" in first_violation(range(100), registry_lost_at_ms=600).what

    def test_a_dead_engine_waited_for_through_its_grace(self) -> None:
        """The failure as it was: the wire client waited the engine's 30 s disconnect grace before giving up."""
        seed = next(s for s in range(100) if (dies := plan_for(s).engine_dies_at_ms) is not None and plan_for(s).hangup_at_ms - dies > 4000)
        plan = replace(plan_for(seed), engine_gives_up_after_ms=30_000, bridge_crashes_at_ms=None)
        with pytest.raises(Violation) as caught:
            SimulatedCall(seed, plan).run()
        assert "dead air" in caught.value.what

    @PATCHES_A_COMPILED_METHOD
    def test_a_flood_limit_that_a_stalls_backlog_overflows(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The flood limit as it was: its bucket never held more than its burst of 1,000 messages, and a bridge
        process stopped past 20 s, its caller holding on, read a larger backlog: the call was taken for a flood."""

        def at_most_the_burst(bucket: MessageBucket, now_ms: int, *, started: bool) -> bool:
            if bucket.at_ms is not None:
                bucket.tokens = min(MESSAGE_BURST, bucket.tokens + (now_ms - bucket.at_ms) * MESSAGES_PER_S / 1000)
            bucket.at_ms = now_ms
            if bucket.tokens < 1:
                return False
            bucket.tokens -= 1
            return True

        monkeypatch.setattr(MessageBucket, "take", at_most_the_burst)
        assert "taken for a flood" in first_violation(range(300)).what

    @pytest.mark.skipif(bool(compiled_modules()), reason="the compiled limits have the constant built in")
    def test_limits_judged_on_the_tick_that_comes_late_after_a_stall(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The call core as it was before session 26: the pacer's tick, first to run after a stall, took the
        carrier's media still unread for its silence and ended the stream as idle."""
        monkeypatch.setattr(limits_module, "PROCESS_STALL_MS", 10**9)  # no tick is ever that late
        assert "limit the carrier gave no cause for: idle_timeout" in first_violation(range(100)).what


    @pytest.mark.skipif(bool(compiled_modules()), reason="the compiled turns have the constant built in")
    def test_silence_judged_on_the_tick_that_comes_late_after_a_stall(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The silence watch as it was before session 29: the first tick after a stall of the process took the
        caller's speech still unread for silence and said goodbye (seed 462: 23 s stopped, the caller's two
        utterances in the backlog, hung up on at once)."""
        monkeypatch.setattr(turns_module, "PROCESS_STALL_MS", 10**9)  # no tick is ever that late
        assert "silence was acted on (hang_up) with what they said still unread" in first_violation([462]).what


class TestSeveralCalls:
    """Seeds of 2-4 calls on one engine server and one registry (``--calls``)."""

    @pytest.mark.parametrize("first", range(0, 200, 50))
    def test_every_seed_keeps_every_invariant(self, first: int) -> None:
        violations = []
        outcomes: set[str] = set()
        for seed in range(first, first + 50):
            try:
                outcomes.update(run_calls_seed(seed).outcomes)
            except Violation as exc:
                violations.append(str(exc))
        assert violations == []
        assert {"caller_hung_up", "busy"} <= outcomes  # conversations, and calls the full server turned away

    def test_the_plans_share_a_server_that_is_at_times_full_or_dies(self) -> None:
        plans = [calls_plan_for(seed) for seed in range(200)]
        assert sum(p.capacity < len(p.plans) for p in plans) > 50
        assert sum(p.engine_dies_at_ms is not None for p in plans) > 40
        assert all(len(p.plans) >= 2 for p in plans)

    def test_a_seed_replays_exactly(self) -> None:
        first, second = run_calls_seed(7), run_calls_seed(7)
        assert first.outcomes == second.outcomes
        assert [c.heard_told for c in first.calls] == [c.heard_told for c in second.calls]

    def test_a_server_that_takes_more_than_its_room_is_caught(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(EngineServerModel, "has_room", lambda server: True)
        seeds = [s for s in range(50) if calls_plan_for(s).capacity < len(calls_plan_for(s).plans)]
        caught = []
        for seed in seeds:
            try:
                run_calls_seed(seed)
            except Violation as exc:
                caught.append(exc.what)
        assert any("on a server with room for" in what for what in caught), caught

    def test_a_ticket_given_to_another_call_is_caught(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The registry hands a stream the ticket another call parked (a lookup by the wrong key)."""
        original = SimulatedCalls.run

        def crossed(calls: SimulatedCalls) -> SimulatedCalls:
            records = calls.registry

            class Crossed(dict):  # type: ignore[type-arg]
                def setdefault(self, key: str, default: Any = None) -> Any:
                    return super().setdefault("shared", default)  # every call's record is one record

            calls.registry = Crossed(records)
            return original(calls)

        monkeypatch.setattr(SimulatedCalls, "run", crossed)
        caught = []
        for seed in range(100):
            try:
                run_calls_seed(seed)
            except Violation as exc:
                caught.append(exc.what)
        assert any("was given the session of" in what for what in caught), caught[:5]

    def test_the_command_line_runs_them(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["--calls", "--seeds", "3"]) == 0
        assert "3 seeds of several calls: 0 failed" in capsys.readouterr().out
        assert main(["--calls", "--seed", "4"]) == 0
        assert "outcomes:" in capsys.readouterr().out
