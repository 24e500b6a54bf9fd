"""``callbridge simulate``: one simulated call through an in-process bridge and engine — what the caller says and
does (speech, DTMF, drops, a barge-in, a backchannel, the agent's echo on the line), what they heard (a WAV), and
what the application was told."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from callbridge.carriers import DEFAULT_SIMULATED, simulated_names
from callbridge.cli_args import EXIT_USAGE, app_loads, at_or_after_start, caller_audio, can_write, key_press, reconnects
from callbridge.config import Settings
from callbridge.serving import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from callbridge.application.events import CallEvent

__all__ = ["add_simulate"]


def add_simulate(commands: Any, common: argparse.ArgumentParser) -> None:
    """``callbridge simulate``: one simulated call through an in-process bridge and engine."""
    simulate = commands.add_parser(
        "simulate",
        parents=[common],
        help="one simulated call through an in-process bridge and engine",
        description="Place one simulated phone call (a faithful simulated carrier) through a bridge and the "
        "configured engine, both started in this process; print the call's timeline and write what the caller heard.",
    )
    simulate.add_argument(
        "--provider",
        choices=simulated_names(),
        default=DEFAULT_SIMULATED,
        help=f"the carrier to simulate (its wire, answer flow and quirks; default: {DEFAULT_SIMULATED})",
    )
    simulate.add_argument("--audio", metavar="WAV", type=Path, help="what the caller says (16-bit PCM WAV; default: a bundled sample)")
    simulate.add_argument("--out", metavar="WAV", type=Path, default=Path("heard.wav"), help="what the caller heard (default: heard.wav)")
    simulate.add_argument("--speak-at", metavar="S", type=at_or_after_start, default=0.5, help="when the caller starts talking")
    simulate.add_argument("--interrupt-after", metavar="S", type=at_or_after_start, help="talk over the agent S seconds into its reply")
    simulate.add_argument(
        "--dtmf", metavar="S:DIGIT", type=key_press, action="append", default=[], help="press DIGIT (0-9 * # A-D) at S seconds"
    )
    simulate.add_argument(
        "--echo-db", metavar="DB", type=_echo_db, help="the agent's voice comes back on the caller's line DB dB down (a speakerphone)"
    )
    simulate.add_argument("--echo-delay-ms", metavar="MS", type=_echo_delay_ms, default=100, help="how late the echo comes back (default 100)")
    simulate.add_argument("--noise", metavar="DB", type=_noise_db, help="line noise under the caller's audio at DB (speech is about 60-75)")
    simulate.add_argument("--band", action="store_true", help="the caller's line through the telephone band (300-3400 Hz)")
    simulate.add_argument(
        "--backchannel-at", metavar="S", type=at_or_after_start, action="append", default=[],
        help='say a short "go on" (0.4 s) S seconds after the agent first speaks',
    )  # fmt: skip
    simulate.add_argument("--drop-at", metavar="S", type=at_or_after_start, action="append", default=[], help="drop the media socket at S seconds")
    simulate.add_argument("--hangup-at", metavar="S", type=at_or_after_start, help="hang up at S seconds (default: after the agent's reply)")
    simulate.add_argument(
        "--app", metavar="MODULE:ATTR", help="the voice agent's application (app.module): it chooses the call's assistant"
    )
    simulate.add_argument(
        "--outbound", action="store_true",
        help="the agent places the call (POST /calls): the callee answers (--callee) and says the audio",
    )  # fmt: skip
    simulate.add_argument(
        "--callee", choices=("person", "voicemail", "busy", "no-answer"), default="person",
        help="--outbound: who the call reaches (a voicemail says the audio as its greeting, then beeps; default: person)",
    )  # fmt: skip
    simulate.add_argument(
        "--machine-detection", choices=("off", "hang_up", "voicemail"), default="voicemail",
        help="--outbound: what an answering machine gets (default: voicemail, a message after its beep)",
    )  # fmt: skip
    simulate.set_defaults(handler=_simulate)


def _simulate(settings: Settings, args: argparse.Namespace) -> int:
    import asyncio

    from callbridge.logging import configure_logging
    from callbridge.sim.carrier import CallerScript
    from callbridge.sim.runner import sample_caller_wav, simulate_call, write_wav_8k

    if getattr(args, "log_level", None) is None:
        settings = settings.model_copy(update={"log": settings.log.model_copy(update={"level": "warning"})})
    configure_logging(settings.log)
    if not app_loads(settings):
        return EXIT_USAGE
    if args.drop_at and not reconnects(args.provider):
        print(f"callbridge simulate: --drop-at: a {args.provider} call cannot come back after its media drops", file=sys.stderr)
        return EXIT_USAGE
    if not can_write(args, "out"):
        return EXIT_USAGE
    audio_path = args.audio or sample_caller_wav()
    speech = caller_audio(args, audio_path)
    if speech is None:
        return EXIT_USAGE
    if args.outbound:
        return _simulate_outbound(settings, args, speech)
    script = CallerScript(
        utterances=((int(args.speak_at * 1000) // 20 * 20, speech),),
        dtmf=tuple(args.dtmf),
        drop_stream_at_ms=tuple(int(at * 1000) for at in args.drop_at),
        hangup_at_ms=int(args.hangup_at * 1000) if args.hangup_at is not None else None,
        interrupt_after_agent_ms=int(args.interrupt_after * 1000) // 20 * 20 if args.interrupt_after is not None else None,
        echo_db=args.echo_db,
        echo_delay_ms=args.echo_delay_ms,
        backchannels_ms=tuple(int(at * 1000) for at in args.backchannel_at),
        noise_db=args.noise,
        band=args.band,
    )
    print(f"callbridge simulate: a {args.provider} call, the caller says {audio_path.name} "
          f"({len(speech) // 16} ms); engine: {settings.engine.kind}")
    events: list[CallEvent] = []
    result = asyncio.run(simulate_call(settings, script, provider=args.provider, events=events))
    print(result.render())
    if events:
        print("\n" + _application_view(events))
    write_wav_8k(args.out, bytes(result.heard))
    print(
        f"\ncaller heard {result.agent_speech_ms} ms of agent audio in a {len(result.heard) // 16} ms call "
        f"-> {args.out}\nstreams: {len(result.streams)}, marks echoed: {len(result.marks_echoed)}, "
        f"clears: {len(result.clears)}, hung up by: {result.hung_up_by}, protocol warnings: {len(result.warnings) or 'none'}"
    )
    for warning in result.warnings:
        print(f"  warning {warning}")
    return EXIT_OK if not result.warnings and result.agent_speech_ms > 0 else EXIT_FAILED


def _simulate_outbound(settings: Settings, args: argparse.Namespace, speech: bytes) -> int:
    """``--outbound``: the agent places the call; the callee (``--callee``) answers it, or not."""
    import asyncio

    from callbridge.sim.placed_call import callee_for, simulate_placed_call
    from callbridge.sim.runner import write_wav_8k

    callee = callee_for(args.callee, speech, int(args.speak_at * 1000) // 20 * 20, int(args.hangup_at * 1000) if args.hangup_at is not None else None)
    request: dict[str, Any] = {"machine_detection": args.machine_detection, "ring_timeout_s": 10}
    if args.machine_detection == "voicemail":
        request["voicemail_message"] = _VOICEMAIL
    print(f"callbridge simulate: the agent calls a {args.callee} through {args.provider} (machine detection: {args.machine_detection}); engine: {settings.engine.kind}")
    placed = asyncio.run(simulate_placed_call(settings, args.provider, callee, request))
    print(f"POST /calls → {placed.answer}")
    print(f"the carrier reported: {', '.join(placed.statuses) or 'nothing'}")
    if placed.events:
        print(_application_view(placed.events))
    if placed.result is None:
        return EXIT_OK if args.callee in ("busy", "no-answer") and placed.statuses else EXIT_FAILED
    print(placed.result.render())
    write_wav_8k(args.out, bytes(placed.result.heard))
    print(f"\nthe callee heard {placed.result.agent_speech_ms} ms of agent audio -> {args.out}; hung up by: {placed.result.hung_up_by}")
    return EXIT_OK if placed.result.agent_speech_ms > 0 or args.machine_detection == "hang_up" else EXIT_FAILED


_VOICEMAIL = "Leave a short message: the clinic called about tomorrow's appointment; please call back."


def _application_view(events: list[CallEvent]) -> str:
    """What the application was told of the simulated call: its events, and the report's summary."""
    from callbridge.application.events import CallReport

    lines = ["the application heard: " + ", ".join(event.type for event in events)]
    ended = next((event for event in events if event.type == "call.ended"), None)
    if ended is not None:
        report = CallReport.model_validate(ended.data["report"])
        latency = f", turn latency p50 {report.turn_latency.p50_ms} ms max {report.turn_latency.max_ms} ms" if report.turn_latency else ""
        lines.append(
            f"report: {report.duration_ms} ms, ended by {report.ended_by} ({report.end_reason}), {report.turns} turns{latency}, "
            f"barge-ins {report.barge_ins} (heard {report.barged_heard_ms} ms), tools {report.tools}"
        )
        lines.append(f"recording: {report.recording or 'none'}")
    return "\n".join(lines)


def _number_in(low: float, high: float, says: str, kind: type[int] | type[float] = float) -> Callable[[str], float]:
    """An argparse type: a number from ``low`` to ``high``, else one line saying what (``says``) is wanted."""

    def parse(value: str) -> float:
        try:
            number = kind(value)
        except ValueError:
            number = low - 1
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{value!r}: {says}")
        return number

    return parse


_echo_db = _number_in(0, 60, "dB down, from 0 to 60")
"""``--echo-db``: how far down the echo is."""
_echo_delay_ms = _number_in(0, 2000, "milliseconds, from 0 to 2000", int)
_noise_db = _number_in(0, 80, "a level in dB, from 0 to 80 (speech is about 60-75)")
