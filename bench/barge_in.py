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
- the corpus (``bench/corpus``: espeak-ng voices and room sounds, ``make_corpus.py``) over three lines (plain; an
  echo at -10 dB, 200 ms; the telephone band with line noise and an echo at -10 dB, 60 ms): ``backchannel`` the five words in two voices each at 1.0 s; ``sound`` a cough, a
  click, a door, typing at 1.5 s (a barge-in from either is a false one); ``interrupt`` the three sentences in
  five voice pairings at 0.8 and 2.0 s — the agent heard while the caller says it, from its first sound.

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

from barge_in_corpus import percentile  # noqa: E402

from callbridge.sim.carrier import CallerScript, CallResult  # noqa: E402
from callbridge.sim.runner import load_wav_8k, running_bridge, sample_caller_wav  # noqa: E402
from tests.bridge.test_interruption_judge import corpus as sound  # noqa: E402
from tests.bridge.test_interruption_judge import first_sound_ms  # noqa: E402
from tests.bridge.twilio_e2e import engine, settings  # noqa: E402

SPEAK_AT_MS = 500
AT_ONCE = 8
KINDS = ("echo", "backchannel", "sound", "interrupt")


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
    return cases + corpus_cases(base)


LINES: dict[str, dict[str, object]] = {
    "plain": {},
    "echo -10 dB 200 ms": {"echo_db": 10.0, "echo_delay_ms": 200},
    "band+noise, echo -10 dB 60 ms": {"echo_db": 10.0, "echo_delay_ms": 60, "band": True, "noise_db": 30.0},
}
"""The lines the corpus's sounds are said over (``CallerScript``'s: the agent's echo, the telephone band, line
noise). Not voices in the caller's room: on the real server the engine's VAD takes them for the caller's turn,
which then never ends — no reply at all, in either mode (turn detection in a noisy room is a problem of its own);
the decision core's corpus (``bench/barge_in_corpus.py``) has them."""


def corpus_cases(base: dict[str, object]) -> list[Case]:
    """``bench/corpus``'s sounds over each line: backchannels (the five words, each in two of the five voices) at
    1.0 s into the reply; a cough, a click, a door, typing at 1.5 s; interruptions (the three sentences, in two
    voices between them) at 0.8 and 2.0 s."""
    voices = ("m3", "f2", "m1", "f4", "f5")
    words = ("mmhm", "uhhuh", "yeah", "okay", "right")
    cases = [
        Case("backchannel", f"{word}-{voice} at 1.0 s, {line}", CallerScript(**base, backchannels_ms=(1000,), backchannel=sound(f"bc-{word}-{voice}"), **options))  # type: ignore[arg-type]
        for line, options in LINES.items()
        for n, word in enumerate(words)
        for voice in (voices[n], voices[(n + 2) % 5])
    ]  # fmt: skip
    cases += [
        Case("sound", f"{noise} at 1.5 s, {line}", CallerScript(**base, backchannels_ms=(1500,), backchannel=sound(f"noise-{noise}"), **options))  # type: ignore[arg-type]
        for line, options in LINES.items()
        for noise in ("cough", "click", "door", "keyboard")
    ]  # fmt: skip
    cases += [
        Case("interrupt", f"say-{n}-{voice} at {at / 1000:.1f} s, {line}",
             CallerScript(**base, interrupt_after_agent_ms=at, interruption=sound(f"say-{n}-{voice}"), **options))  # type: ignore[arg-type]
        for line, options in LINES.items()
        for n, voice in ((0, "f2"), (1, "m3"), (2, "f4"), (0, "m1"), (1, "f5"))
        for at in (800, 2000)
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
    heard_over_ms: int | None = None
    """An interruption: the agent the caller heard while saying it, from its first sound on (``heard_over``)."""


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
                outcomes.append(Outcome(case, len(result.clears), result.agent_speech_ms, runs[0] if runs else 0, heard_over(case.script, result)))
    return outcomes, barge_ins


def heard_over(script: CallerScript, result: CallResult) -> int | None:
    """How much of the agent the caller heard (``CallResult.agent_ticks``) while saying their interruption, from its
    first sound (45 dB) to its end: what they heard after a true onset, pauses, resumes and all. None: the agent
    never spoke."""
    if script.interrupt_after_agent_ms is None or 1 not in result.agent_ticks:
        return None
    said = script.interruption if script.interruption is not None else script.utterances[0][1]
    interrupt_at = result.agent_ticks.index(1) + script.interrupt_after_agent_ms // 20
    return 20 * sum(result.agent_ticks[interrupt_at + first_sound_ms(said) // 20 : interrupt_at + len(said) // 320])


def report(mode: str, outcomes: list[Outcome], barge_ins: dict[str, int], reply_ms: int) -> None:
    print(f"\n## barge_in.mode = {mode}\n")
    print("| kind | case | clears | agent heard ms | first run ms | heard after the onset ms |")
    print("|---|---|---|---|---|---|")
    for outcome in outcomes:
        case, over = outcome.case, outcome.heard_over_ms
        print(f"| {case.kind} | {case.label} | {outcome.clears} | {outcome.agent_heard_ms} | {outcome.first_run_ms} | {'' if over is None else over} |")
    for kind in ("echo", "backchannel", "sound"):
        mine = [o for o in outcomes if o.case.kind == kind]
        minutes = sum(min(o.agent_heard_ms, reply_ms) for o in mine) / 60_000
        whole = sum(o.first_run_ms >= reply_ms - 100 or (o.clears and o.agent_heard_ms >= reply_ms - 100) for o in mine)
        print(f"\n{kind}: {barge_ins.get(kind, 0)} false barge-ins in {len(mine)} calls, "
              f"{barge_ins.get(kind, 0) / minutes * 10:.0f} per 10 min of the reply heard; the reply heard whole in {whole}")  # fmt: skip
    interrupts = [o for o in outcomes if o.case.kind == "interrupt"]
    over = [o.heard_over_ms for o in interrupts if o.heard_over_ms is not None]
    stopped = sum(o.heard_over_ms is not None and o.heard_over_ms <= 1000 for o in interrupts)
    print(f"interrupt: {barge_ins.get('interrupt', 0)} barge-ins for {len(interrupts)} interruptions; the agent stopped "
          f"within 1 s of the onset in {stopped}; agent heard after the onset, while the caller spoke: p50 "
          f"{percentile(over, 0.5)} ms, p95 {percentile(over, 0.95)} ms, max {max(over)} ms")  # fmt: skip


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
