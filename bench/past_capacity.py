"""Admission past capacity: ``callbridge serve`` as shipped (``server.max_calls`` 100, ``server.cpu_budget_percent``
85; only its agent is the loopback), offered more calls than it takes — how fast it says no, and whether the calls
it took still sound as they did.

    python bench/past_capacity.py [--calls 100,200] [--duration 20] [--ramp 5] [--max-calls N] [--cpu-budget P]
        [--out DIR]

Each level: a fresh server (pinned to the first CPU, the generator to the others, as ``bench/side_by_side.py``),
``callbridge loadtest --url`` placing that many simulated Twilio calls over the ramp. One row each: calls answered
and refused (TwiML ``<Reject reason="busy">``: the carrier plays the caller a busy tone), how long the answer
webhook took to say no and to say yes (the carrier's POST → its TwiML, plus the stream's opening for a yes), the
answered calls' click round trip, and calls broken off after their answer. Run the shipped capacity first (100),
then past it: the answered calls' round trip should not move. ``--max-calls 1000``: only the CPU budget refuses
(a machine slower than the one ``max_calls`` was sized for).
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import loadtest_carriers  # noqa: E402

from callbridge.sim.ports import free_port  # noqa: E402


def run_level(calls: int, args: argparse.Namespace) -> dict[str, object]:
    """One level against a fresh ``callbridge serve`` on its shipped admission limits; the load test's JSON report."""
    port, rest_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = loadtest_carriers._env_for("twilio", secrets.token_hex(16), rest_port, port)
    if args.max_calls is None:
        del env["CALLBRIDGE_SERVER__MAX_CALLS"]  # as shipped
    else:
        env["CALLBRIDGE_SERVER__MAX_CALLS"] = str(args.max_calls)
    if args.cpu_budget is not None:
        env["CALLBRIDGE_SERVER__CPU_BUDGET_PERCENT"] = str(args.cpu_budget)
    target = ["--url", url, "--provider", "twilio", "--rest-port", str(rest_port)]
    return loadtest_carriers.measure_serve(port, target, env, args.out / f"offered-{calls}.json", calls, args)


def row(report: dict[str, object]) -> str:
    def q(key: str, *names: str) -> str:
        stats = report[key]
        assert isinstance(stats, dict)
        return " / ".join(f"{stats[n]:.1f}" for n in names) if stats else "n/a"

    calls, refused, failed = report["calls"], report["refused_calls"], report["failed_calls"]
    assert isinstance(calls, int) and isinstance(refused, int) and isinstance(failed, int)
    return (
        f"| {calls} | {calls - refused} | {refused} | {q('refused_answer_ms', 'p50', 'p99', 'max')} "
        f"| {q('answer_ms', 'p50', 'p99', 'max')} | {q('round_trip_ms', 'p50', 'p99', 'max')} "
        f"| {report['clicks_returned']}/{report['clicks_sent']} | {failed - refused} | {report['server_cpu_ms_per_call_second']:.2f} "
        f"| {late(report, '0.02')} / {late(report, '0.05')} | {q('generator_tick_lag_ms', 'p99')} |"
    )


def late(report: dict[str, object], seconds: str) -> str:
    """The server's event-loop samples later than ``seconds``, of all (``server_loop_lag_buckets``)."""
    buckets = report.get("server_loop_lag_buckets")
    if not isinstance(buckets, dict) or "+Inf" not in buckets:
        return "n/a"
    return f"{buckets['+Inf'] - buckets[seconds]}/{buckets['+Inf']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    loadtest_carriers.add_run_arguments(parser, calls="100,200")
    parser.add_argument("--max-calls", type=int, help="the server's server.max_calls (default: as shipped)")
    parser.add_argument("--cpu-budget", type=float, help="the server's server.cpu_budget_percent (default: as shipped)")
    args = loadtest_carriers.pinned_run(parser, "callbridge-past-capacity-")
    rows = [row(run_level(int(level), args)) for level in args.calls.split(",")]
    columns = ["offered", "answered", "refused", "refused: no in p50 / p99 / max ms", "answered: yes in p50 / p99 / max ms",
               "answered: round trip p50 / p99 / max ms", "clicks back", "broken off", "server CPU-ms per call-s",
               "server loop late > 20 / > 50 ms (samples)", "generator tick lag p99 ms"]  # fmt: skip
    loadtest_carriers.print_table(args, columns, rows)


if __name__ == "__main__":
    main()
