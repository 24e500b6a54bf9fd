"""Calls the agent places, end to end (#42): ``POST /calls`` with ``machine_detection = "voicemail"`` on the real
server, the simulated Twilio's REST dial and callee, the embedded engine (echo agent, a greeting asked at the answer)
— every answer of the corpus (``bench/corpus/answers``) as the callee, through the telephone band and line noise.

    python bench/outbound_calls.py [--noise-db 35] [--concurrent 10]

A person says their greeting 300 ms after the pick-up and waits; a machine says its greeting, then a 400 ms beep at
1000 Hz 300 ms later, then records (silence); an IVR menu says itself and waits (no beep). Printed: persons decided persons, and when they first heard the agent
after their greeting's end (what was held — the greeting — plays once they are known); machines decided machines,
whether any heard the agent before their beep had ended (never, asked), when the voicemail message began after it,
and whether it played whole before the hang-up (the call ended ``voicemail_left``, nothing of it cut). The shipped
defaults, but ``outbound.calls_per_second`` (10, to place the corpus in a minute). Machine: the one it runs on.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from barge_in_corpus import percentile  # noqa: E402

from callbridge.application.events import CallReport  # noqa: E402
from callbridge.carriers.twilio.sim import SimulatedTwilio  # noqa: E402
from callbridge.sim.callee import Callee  # noqa: E402
from callbridge.sim.caller import CallResult  # noqa: E402
from callbridge.sim.carrier import CallerScript  # noqa: E402
from callbridge.sim.placed_call import beep  # noqa: E402
from callbridge.sim.runner import RunningBridge, load_wav_8k, running_bridge  # noqa: E402
from tests.bridge import agent_app  # noqa: E402
from tests.bridge.test_outbound_e2e import OURS, outbound_settings, post_call  # noqa: E402
from tests.bridge.twilio_e2e import engine  # noqa: E402

ANSWERS = Path(__file__).resolve().parent / "corpus" / "answers"
SPEAKS_AT_MS = 300
BEEP_AFTER_MS = 300
BEEP_MS = 400
MESSAGE = "Leave a message that the clinic called about tomorrow's appointment."


@dataclass
class Outcome:
    name: str
    person: bool
    greeting_end_ms: int
    beep_end_ms: int | None
    result: CallResult
    report: CallReport | None

    @property
    def first_heard_ms(self) -> int | None:
        return self.result.first_agent_heard_ms


async def one(bridge: RunningBridge, number: str, name: str, noise_db: float) -> Outcome:
    greeting = load_wav_8k(ANSWERS / f"{name}.wav")
    person, menu = name.startswith("person"), name.startswith("ivr")
    greeting_end_ms = SPEAKS_AT_MS + len(greeting) // 16
    answer = greeting if person or menu else greeting + bytes(16 * BEEP_AFTER_MS) + beep()  # a menu has no beep
    beep_end_ms = None if person or menu else greeting_end_ms + BEEP_AFTER_MS + BEEP_MS
    script = CallerScript(utterances=((SPEAKS_AT_MS, answer),), hangup_at_ms=greeting_end_ms + 2500 if person else 30_000, noise_db=noise_db, band=True)
    carrier = bridge.carrier
    assert isinstance(carrier, SimulatedTwilio)
    carrier.callees[number] = Callee(ring_ms=200, script=script)
    response = await post_call(bridge, {"carrier": "twilio", "to": number, "from": OURS, "machine_detection": "voicemail", "voicemail_message": MESSAGE})
    assert response.status_code == 202, response.text
    dial_id = response.json()["dial_id"]
    while not any(call.dial_id == dial_id and event.type == "call.dialing" for call, event in agent_app.CallsOut.events):
        await asyncio.sleep(0.02)
    call_id = next(event.call_id for call, event in agent_app.CallsOut.events if call.dial_id == dial_id)
    result = await carrier.dialled[call_id]
    assert result is not None
    for _ in range(250):  # its report, a moment after the hang-up
        reports = [event for call, event in agent_app.CallsOut.events if call.dial_id == dial_id and event.type == "call.ended"]
        if reports:
            return Outcome(name, person, greeting_end_ms, beep_end_ms, result, CallReport.model_validate(reports[0].data["report"]))
        await asyncio.sleep(0.02)
    return Outcome(name, person, greeting_end_ms, beep_end_ms, result, None)


async def run(names: Sequence[str], noise_db: float, concurrent: int) -> list[Outcome]:
    settings = outbound_settings(outbound={"calls_per_second": 10.0})
    outcomes: list[Outcome] = []
    async with running_bridge(settings, engine()) as bridge:
        for start in range(0, len(names), concurrent):
            batch = names[start : start + concurrent]
            outcomes += await asyncio.gather(*(one(bridge, f"+1500555{start + k:04d}", name, noise_db) for k, name in enumerate(batch)))
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--noise-db", type=float, default=35.0)
    parser.add_argument("--concurrent", type=int, default=10)
    args = parser.parse_args()
    names = [path.stem for path in sorted(ANSWERS.glob("*.wav")) if path.stem.startswith(("person", "machine", "ivr"))]
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}; {len(names)} answers, line noise {args.noise_db:g} dB")
    outcomes = asyncio.run(run(names, args.noise_db, args.concurrent))
    persons = [o for o in outcomes if o.person]
    machines = [o for o in outcomes if o.name.startswith("machine")]
    menus = [o for o in outcomes if o.name.startswith("ivr")]
    right_persons = [o for o in persons if o.report is not None and o.report.answered_by == "person"]
    after = [o.first_heard_ms - o.greeting_end_ms for o in right_persons if o.first_heard_ms is not None]
    print(f"persons: decided persons {len(right_persons)}/{len(persons)}; first heard the agent after their greeting's end "
          f"p50 {percentile(after, 0.5)} p95 {percentile(after, 0.95)} max {max(after, default=0)} ms")  # fmt: skip
    wrong = sorted(o.name for o in persons if o not in right_persons)
    if wrong:
        print(f"  taken for machines or not decided: {', '.join(wrong)}")
    right_machines = [o for o in machines if o.report is not None and o.report.answered_by == "machine"]
    early = [o.name for o in machines if o.first_heard_ms is not None and o.beep_end_ms is not None and o.first_heard_ms < o.beep_end_ms]
    message_after = [o.first_heard_ms - o.beep_end_ms for o in right_machines if o.first_heard_ms is not None and o.beep_end_ms is not None]
    whole = [o for o in right_machines if o.report is not None and o.report.end_reason == "voicemail_left" and set(o.result.played_ms_at_clear) <= {0}]
    print(f"machines: decided machines {len(right_machines)}/{len(machines)}; heard the agent before their beep ended: "
          f"{len(early)}{' (' + ', '.join(early) + ')' if early else ''}; the message began after the beep's end p50 "
          f"{percentile(message_after, 0.5)} p95 {percentile(message_after, 0.95)} max {max(message_after, default=0)} ms; "
          f"played whole, then the hang-up: {len(whole)}/{len(right_machines)}")  # fmt: skip
    menu_machines = [o for o in menus if o.report is not None and o.report.answered_by == "machine"]
    menu_early = [o.name for o in menus if o.first_heard_ms is not None and o.first_heard_ms < o.greeting_end_ms]
    after_menu = [o.first_heard_ms - o.greeting_end_ms for o in menu_machines if o.first_heard_ms is not None]
    print(f"IVR menus (no beep): decided machines {len(menu_machines)}/{len(menus)}; heard the agent before the menu ended: "
          f"{len(menu_early)}; the message began after the menu's end p50 {percentile(after_menu, 0.5)} max {max(after_menu, default=0)} ms")  # fmt: skip


if __name__ == "__main__":
    main()
