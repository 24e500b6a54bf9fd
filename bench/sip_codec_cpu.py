"""What a whole SIP call costs the bridge by codec and encryption (#43: "one core carries SRTP+Opus calls at no more
than 2x the CPU per call-second of G.711 calls"): ``callbridge serve`` with the loopback agent (the embedded engine,
its Silero VAD and all) pinned to the first CPU, and ``callbridge loadtest --provider sip`` on the others placing
calls from the simulated trunk, which offers what the bridge's ``sip.codecs`` names first (G.711, G.722 or Opus) and
SRTP where ``sip.media_encryption`` is ``required`` (``carriers/sip/sim.py``). One row per case, the cases
interleaved round by round so the machine's drift falls on all; the server's CPU time per call-second.

    python bench/sip_codec_cpu.py [--calls 20] [--duration 20] [--ramp 5] [--rounds 3]

The phones' speech is the load test's (the bundled utterance and the loopback agent's reply, both ways at once);
the generator's own coding (it is a wideband phone too) is on its own CPU, not in the figure. The click round trip
(the load test's: a click in the caller's audio → back from the loopback agent) goes through both phones' coders too:
what the codec adds to a turn, against G.711.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadtest_carriers import _env_for, add_run_arguments, measure_serve, pinned_run, print_table  # noqa: E402

from callbridge.sim.ports import free_port  # noqa: E402

CASES = {  # name: the bridge's (and so the simulated trunk's) settings
    "PCMU": {},
    "PCMU + SRTP": {"CALLBRIDGE_SIP__MEDIA_ENCRYPTION": "required"},
    "G.722 + SRTP": {"CALLBRIDGE_SIP__CODECS": '["G722"]', "CALLBRIDGE_SIP__MEDIA_ENCRYPTION": "required"},
    "Opus + SRTP": {"CALLBRIDGE_SIP__CODECS": '["opus"]', "CALLBRIDGE_SIP__MEDIA_ENCRYPTION": "required"},
    "Opus + SRTP (sip.opus_fec off)": {
        "CALLBRIDGE_SIP__CODECS": '["opus"]', "CALLBRIDGE_SIP__MEDIA_ENCRYPTION": "required", "CALLBRIDGE_SIP__OPUS_FEC": "false",
    },
}  # fmt: skip


def run_case(name: str, calls: int, round_no: int, args: argparse.Namespace) -> dict[str, object]:
    port, rest_port = free_port(), free_port()
    env = _env_for("sip", secrets.token_hex(16), rest_port, port)
    env.update(CASES[name])
    env["CALLBRIDGE_SERVER__CPU_BUDGET_PERCENT"] = "0"
    out = args.out / f"sip-{''.join(c for c in name if c.isalnum())}-{calls}-r{round_no}.json"
    target = ["--url", f"http://127.0.0.1:{port}", "--provider", "sip", "--rest-port", str(rest_port)]
    return measure_serve(port, target, env, out, calls, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, calls="20")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES), help="which of the cases, comma-separated")
    args = pinned_run(parser, "callbridge-sip-codecs-")
    names = [name.strip() for name in args.cases.split(",")]
    calls = int(args.calls)
    cpu: dict[str, list[float]] = {name: [] for name in names}
    trip: dict[str, list[float]] = {name: [] for name in names}
    failed: dict[str, int] = {name: 0 for name in names}
    warnings: dict[str, int] = {name: 0 for name in names}
    for round_no in range(args.rounds):
        for name in names:
            report = run_case(name, calls, round_no, args)
            cpu[name].append(float(report["server_cpu_ms_per_call_second"]))  # type: ignore[arg-type]
            trip[name].append(float(report["round_trip_ms"]["p50"]))  # type: ignore[index]
            failed[name] += int(report["failed_calls"])  # type: ignore[call-overload]
            warnings[name] += int(report["protocol_warnings"])  # type: ignore[call-overload]
            print(json.dumps({"case": name, "round": round_no, "server_cpu_ms_per_call_second": cpu[name][-1]}), flush=True)
    base, base_trip = statistics.median(cpu[names[0]]), statistics.median(trip[names[0]])
    rows = [
        f"| {name} | {calls} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} "
        f"| {statistics.median(values) / base:.2f}x | {statistics.median(trip[name]):.1f} ({statistics.median(trip[name]) - base_trip:+.1f}) "
        f"| {failed[name]} | {warnings[name]} |"
        for name, values in cpu.items()
    ]
    columns = [
        "case", "calls", "server CPU-ms per call-second (median)", "rounds", f"against {names[0]}",
        f"click round trip p50 ms (against {names[0]})", "failed calls", "warnings",
    ]  # fmt: skip
    print_table(args, columns, rows)


if __name__ == "__main__":
    main()
