"""Barge-in, as the caller hears it (#41): does the agent stop for its own echo, for a backchannel — and for a real
interruption, how fast. A corpus of simulated calls over the real server and the embedded engine (shipped
settings: its echo agent says the caller's words back), in each ``barge_in.mode`` from one run: ``engine`` (the
engine's VAD decides) and ``bridge`` (the bridge pauses, then confirms or resumes).

    python bench/barge_in.py [--repeat 1] [--modes engine,bridge]

Every call: the caller says the bundled utterance (3.7 s) at 0.5 s; the agent replies with it (3.7 s of speech);
the caller hangs up 2 s after the reply should have ended. What varies:

- ``echo``: the agent's voice comes back on the caller's line (``CallerScript.echo_db``, ``echo_delay_ms``: flat,
  no telephone-band filter; line noise at 30 dB in half of them) at -6 to -30 dB and 60 to 400 ms late; the
  caller says nothing over it. Any barge-in is a false one.
- ``backchannel``: a 0.3 or 0.45 s piece of the caller's speech at 1.0 or 2.0 s into the reply (a stand-in for
  "mm-hm": speech, short). A barge-in is a false one.
- ``interrupt``: the caller talks over the reply (the utterance again) 1.0 or 2.0 s into it, with and without
  echo at -10 dB: a barge-in is the interruption confirmed; agent audio heard after the onset is measured at the
  caller.

A barge-in: in ``engine`` mode, a clear (the engine's barge-in flushes the carrier); in ``bridge`` mode, a
``barge_in`` the bridge sent the engine (its pauses clear the carrier too, and are counted apart). Printed: a
table per mode, false barge-ins per 10 minutes of agent speech the caller heard, the interruptions confirmed and
the agent heard after their onset, the replies heard whole. Machine: the one it runs on; calls run 8 at a time
on one bridge at real time.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.sim.carrier import CallerScript, CallResult  # noqa: E402
from callbridge.sim.runner import load_wav_8k, running_bridge, sample_caller_wav  # noqa: E402
from tests.bridge.twilio_e2e import engine, settings  # noqa: E402

SPEAK_AT_MS = 500
AT_ONCE = 8
KINDS = ("echo", "backchannel", "interrupt")


@dataclass(frozen=True)
class Case:
    kind: str
    label: str
    script: CallerScript


def corpus(speech: bytes) -> list[Case]:
    reply_ms = len(speech) // 16
    hangup = SPEAK_AT_MS + reply_ms + 600 + reply_ms + 2000
    base = {"utterances": ((SPEAK_AT_MS, speech),), "hangup_at_ms": hangup}
    cases = [
        Case("echo", f"-{db} dB, {delay} ms{', noise' if noise else ''}",
             CallerScript(**base, echo_db=db, echo_delay_ms=delay, noise_db=30.0 if noise else None))  # type: ignore[arg-type]
        for db in (6, 10, 20, 30)
        for delay in (60, 200, 400)
        for noise in (False, True)
    ]  # fmt: skip
    cases += [
        Case("backchannel", f"{length} ms at {at / 1000:.1f} s", CallerScript(**base, backchannels_ms=(at,), backchannel_ms=length))  # type: ignore[arg-type]
        for length in (300, 450)
        for at in (1000, 2000)
    ]
    cases += [
        Case("interrupt", f"at {at / 1000:.1f} s{echo_label}",
             CallerScript(**base, interrupt_after_agent_ms=at, echo_db=echo, echo_delay_ms=100))  # type: ignore[arg-type]
        for at in (1000, 2000)
        for echo, echo_label in ((None, ""), (10.0, ", echo -10 dB"))
    ]  # fmt: skip
    return cases


@dataclass(frozen=True)
class Outcome:
    case: Case
    clears: int
    """The carrier's buffer cleared: each engine barge-in in ``engine`` mode; each pause in ``bridge`` mode."""
    agent_heard_ms: int
    first_run_ms: int
    """The agent's first run of speech as the caller heard it (a barge-in, or a pause, ends it)."""


async def run(cases: list[Case], mode: str) -> tuple[list[Outcome], dict[str, int]]:
    """Each kind's calls on bridges of their own, 8 at a time: the outcomes, and each kind's barge-ins (the bridge's
    ``callbridge_barge_ins_total``: the engine told to barge in, in either mode; a pause is none)."""
    outcomes: list[Outcome] = []
    barge_ins: dict[str, int] = {}
    for kind in KINDS:
        mine = [case for case in cases if case.kind == kind]
        for first in range(0, len(mine), AT_ONCE):
            batch = mine[first : first + AT_ONCE]
            async with running_bridge(settings(barge_in={"mode": mode}), engine()) as bridge:  # the embedded engine
                results: list[CallResult] = await asyncio.gather(*(bridge.carrier.place_call(case.script) for case in batch))
                counted = bridge.app.state.bridge.registry.get_sample_value("callbridge_barge_ins_total", {"provider": "twilio"})
            barge_ins[kind] = barge_ins.get(kind, 0) + int(counted or 0)
            for case, result in zip(batch, results, strict=True):
                runs = result.agent_runs_ms
                outcomes.append(Outcome(case, len(result.clears), result.agent_speech_ms, runs[0] if runs else 0))
    return outcomes, barge_ins


def report(mode: str, outcomes: list[Outcome], barge_ins: dict[str, int], reply_ms: int) -> None:
    print(f"\n## barge_in.mode = {mode}\n")
    print("| kind | case | clears | agent heard ms | first run ms |")
    print("|---|---|---|---|---|")
    for outcome in outcomes:
        case = outcome.case
        print(f"| {case.kind} | {case.label} | {outcome.clears} | {outcome.agent_heard_ms} | {outcome.first_run_ms} |")
    for kind in ("echo", "backchannel"):
        mine = [o for o in outcomes if o.case.kind == kind]
        minutes = sum(min(o.agent_heard_ms, reply_ms) for o in mine) / 60_000
        whole = sum(o.first_run_ms >= reply_ms - 100 or (o.clears and o.agent_heard_ms >= reply_ms - 100) for o in mine)
        print(f"\n{kind}: {barge_ins.get(kind, 0)} false barge-ins in {len(mine)} calls, "
              f"{barge_ins.get(kind, 0) / minutes * 10:.0f} per 10 min of the reply heard; the reply heard whole in {whole}")  # fmt: skip
    interrupts = [o for o in outcomes if o.case.kind == "interrupt"]
    after = sorted(o.first_run_ms - (o.case.script.interrupt_after_agent_ms or 0) for o in interrupts)
    print(f"interrupt: {barge_ins.get('interrupt', 0)} barge-ins for {len(interrupts)} interruptions; agent heard after "
          f"the onset (ms; negative: stopped before it): {after}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="run the corpus this many times")
    parser.add_argument("--modes", default="engine,bridge", help="the modes to run, in order (default engine,bridge)")
    args = parser.parse_args()
    speech = load_wav_8k(sample_caller_wav())
    cases = corpus(speech) * args.repeat
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}; "
          f"{len(cases)} calls a mode; the reply {len(speech) // 16} ms")  # fmt: skip
    for mode in args.modes.split(","):
        outcomes, barge_ins = asyncio.run(run(cases, mode))
        report(mode, outcomes, barge_ins, len(speech) // 16)


if __name__ == "__main__":
    main()
