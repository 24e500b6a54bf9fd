"""Barge-in, as the caller hears it (#41): does the agent stop for its own echo, for a backchannel — and for a real
interruption, how fast. A corpus of simulated calls over the real server and the embedded engine (shipped
settings: its echo agent says the caller's words back; the engine's VAD decides barge-in, ``barge_in.mode``
"engine", the only mode so far).

    python bench/barge_in.py [--repeat 1]

Every call: the caller says the bundled utterance (3.7 s) at 0.5 s; the agent replies with it (3.7 s of speech);
the caller hangs up 2 s after the reply should have ended. What varies:

- ``echo``: the agent's voice comes back on the caller's line (``CallerScript.echo_db``, ``echo_delay_ms``: flat,
  no telephone-band filter, no line noise) at -6 to -30 dB and 60 to 400 ms late; the caller says nothing over it.
  Any clear the carrier gets is a false barge-in.
- ``backchannel``: a 0.3 or 0.45 s piece of the caller's speech at 1.0 or 2.0 s into the reply (a stand-in for
  "mm-hm": speech, short). A clear is a false barge-in.
- ``interrupt``: the caller talks over the reply (the utterance again) 1.0 or 2.0 s into it, with and without
  echo at -10 dB: a clear is the barge-in confirmed; agent audio heard after the onset is measured at the caller.

Printed: a table per kind, and the false barge-ins per 10 minutes of agent speech the caller heard. Machine: the
one it runs on; calls run 8 at a time on one bridge at real time.
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
from tests.bridge.twilio_e2e import settings  # noqa: E402

SPEAK_AT_MS = 500
AT_ONCE = 8


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
        Case("echo", f"-{db} dB, {delay} ms", CallerScript(**base, echo_db=db, echo_delay_ms=delay))  # type: ignore[arg-type]
        for db in (6, 10, 20, 30)
        for delay in (60, 200, 400)
    ]
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
    agent_heard_ms: int
    first_run_ms: int
    """The agent's first run of speech as the caller heard it (a barge-in ends it)."""


async def run(cases: list[Case]) -> list[Outcome]:
    outcomes: list[Outcome] = []
    async with running_bridge(settings()) as bridge:  # the embedded engine as shipped
        for first in range(0, len(cases), AT_ONCE):
            batch = cases[first : first + AT_ONCE]
            results: list[CallResult] = await asyncio.gather(*(bridge.carrier.place_call(case.script) for case in batch))
            for case, result in zip(batch, results, strict=True):
                runs = result.agent_runs_ms
                outcomes.append(Outcome(case, len(result.clears), result.agent_speech_ms, runs[0] if runs else 0))
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="run the corpus this many times")
    args = parser.parse_args()
    speech = load_wav_8k(sample_caller_wav())
    cases = corpus(speech) * args.repeat
    outcomes = asyncio.run(run(cases))
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}; "
          f"{len(cases)} calls, mode engine; the reply {len(speech) // 16} ms\n")  # fmt: skip
    print("| kind | case | clears | agent heard ms | first run ms |")
    print("|---|---|---|---|---|")
    for outcome in outcomes:
        case = outcome.case
        print(f"| {case.kind} | {case.label} | {outcome.clears} | {outcome.agent_heard_ms} | {outcome.first_run_ms} |")
    for kind in ("echo", "backchannel"):
        mine = [o for o in outcomes if o.case.kind == kind]
        stopped, false = sum(o.clears > 0 for o in mine), sum(o.clears for o in mine)
        minutes = sum(o.agent_heard_ms for o in mine) / 60_000
        print(f"\n{kind}: {stopped} of {len(mine)} calls stopped the agent, {false} times in all: "
              f"{false / minutes * 10:.0f} false barge-ins per 10 min of agent speech heard")  # fmt: skip
    interrupts = [o for o in outcomes if o.case.kind == "interrupt"]
    confirmed = [o for o in interrupts if o.clears > 0]
    after = [o.first_run_ms - (o.case.script.interrupt_after_agent_ms or 0) for o in confirmed]
    print(f"\ninterrupt: {len(confirmed)} of {len(interrupts)} confirmed; agent heard after the onset (ms; negative: "
          f"stopped before it, by its echo): {sorted(after)}")  # fmt: skip


if __name__ == "__main__":
    main()
